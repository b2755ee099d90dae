"""Several models in one service: ``ZHEMBED_MODELS`` entries (and repeated ``--model NAME=SOURCE``) become
each model's own settings, with its options and admission budget; a malformed entry stops the settings
with a message that says which."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.settings import Settings
from app.settings.models import fold_model_flags, with_sources


def test_one_model_is_the_settings_themselves() -> None:
    settings = Settings(model="some/folder")
    assert settings.model_entries() == ((None, settings),)


def test_each_entry_is_the_settings_with_its_source_name_options_and_budget() -> None:
    settings = Settings(
        models="embed=models/twin;variant=int8, rerank=BAAI/reranker;max_concurrent_inputs=100;"
        "max-batch-size=4, ner=./tagger;revision=v2",
        max_concurrent_inputs=500,
        max_batch_size=16,
    )
    (embed, e), (rerank, r), (ner, n) = settings.model_entries()
    assert (embed, rerank, ner) == ("embed", "rerank", "ner")
    assert (e.model, e.served_model_name, e.variant, e.max_batch_size) == ("models/twin", "embed", "int8", 16)
    assert (r.model, r.variant, r.max_batch_size, r.max_concurrent_inputs) == (
        "BAAI/reranker",
        "auto",
        4,
        100,
    )
    assert (n.model, n.revision) == ("./tagger", "v2")
    # The budgets not set share what the set ones leave: (500 - 100) / 2 each.
    assert e.max_concurrent_inputs == n.max_concurrent_inputs == 200
    assert all(s.models is None for _, s in settings.model_entries())  # each is a service of one
    assert e.max_inputs_per_request == settings.max_inputs_per_request  # the rest: the service's


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ("models/twin", "is not NAME=SOURCE"),
        ("a=x,a=y", "'a=y' is not NAME=SOURCE with a NAME of its own"),
        ("a=", "is not NAME=SOURCE"),
        ("/abs/path=x", "is not NAME=SOURCE"),
        ("a=x;port=1", "a sets 'port'; a model may set variant, revision"),
        ("a=x;variant=int4", "a's variant='int4': Input should be"),
        ("a=x;max_batch_size=0", "a's max_batch_size='0'"),
        ("a=x;max_concurrent_inputs=10", "budgets (a 10) must each hold max_inputs_per_request (64)"),
        ("a=x;max_concurrent_inputs=500,b=y", "budgets (a 500, b 12)"),
        ("a=x;max_concurrent_inputs=300,b=y;max_concurrent_inputs=300", "together fit max_concurrent_inputs"),
    ],
)
def test_a_malformed_entry_stops_the_settings_saying_which(models: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings(models=models)


def test_models_name_every_model_whatever_model_says() -> None:
    """The image sets ZHEMBED_MODEL; a service of several given ZHEMBED_MODELS beside it serves those."""
    settings = Settings(models="a=x", model="y", served_model_name="z")
    assert [(n, s.model, s.served_model_name) for n, s in settings.model_entries()] == [("a", "x", "a")]


def test_environment_and_repeated_model_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZHEMBED_MODELS", "a=x,b=y")
    assert [n for n, _ in Settings().model_entries()] == ["a", "b"]
    flags = Settings.from_cli(["--model", "c=z", "--port", "9", "--model=d=w;variant=fp32"])
    assert flags.models == "c=z,d=w;variant=fp32" and flags.port == 9  # flags win over the variable
    assert flags.model_entries()[1][1].variant == "fp32"
    monkeypatch.delenv("ZHEMBED_MODELS")
    one = Settings.from_cli(["--model", "some/folder"])
    assert one.models is None and one.model == "some/folder"  # one source: a service of one, as before


def test_folding_model_flags() -> None:
    assert fold_model_flags(["--model", "x", "--port", "1"]) == ["--model", "x", "--port", "1"]
    assert fold_model_flags(["--model", "a=x"]) == ["--models", "a=x"]
    assert fold_model_flags(["--model", "x", "--model", "y"]) == ["--models", "x,y"]  # refused as entries
    assert fold_model_flags(["--model=a=x", "--variant", "int8", "--model", "b=y"]) == [
        "--variant",
        "int8",
        "--models",
        "a=x,b=y",
    ]


def test_with_sources_keeps_names_and_options() -> None:
    settings = Settings(models="a=hub/a;variant=int8,b=hub/b")
    resolved = with_sources(settings, ["/cache/a", "/cache/b"])
    assert resolved.models == "a=/cache/a;variant=int8,b=/cache/b"
    assert [(n, s.model, s.variant) for n, s in resolved.model_entries()] == [
        ("a", "/cache/a", "int8"),
        ("b", "/cache/b", "auto"),
    ]
    assert with_sources(Settings(model="hub/x"), ["/cache/x"]).model == "/cache/x"
