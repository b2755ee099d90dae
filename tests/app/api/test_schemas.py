"""Request schemas: strict types, TEI's spellings, and the options they turn into."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

# Imported for their request schemas: the test below walks every StrictRequest subclass loaded.
import app.api.http.openai_routes
import app.api.http.routes  # noqa: F401
from app.api.schemas.common import StrictRequest, Truncation
from app.api.schemas.embeddings import EmbedAllRequest, EmbedRequest, SimilarityRequest
from app.api.schemas.fill_mask import MAX_TARGETS, FillMaskRequest
from app.tasks.options import EmbedAllOptions, EmbedOptions


def test_embed_request_becomes_options() -> None:
    body = EmbedRequest.model_validate(
        {
            "inputs": "你好",
            "layers": [-1, 6],
            "truncate": True,
            "truncation_direction": "Left",
            "pooling": "cls",
        }
    )
    assert body.options(EmbedOptions(normalize=False)) == EmbedOptions(
        pooling="cls", layers=(-1, 6), long_text="truncate", truncation_direction="left", normalize=False
    )


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize(
    "sent",
    [
        {},
        {"pooling": "mean"},
        {"truncate": False},
        {"layers": None},
        {"prompt_name": None},
        {"pooling": "cls"},
    ],
)
def test_options_are_the_same_whether_defaults_are_sent_or_not(
    sent: dict[str, object], normalize: bool
) -> None:
    body = EmbedRequest.model_validate({"inputs": "a", **sent})
    built = EmbedOptions(pooling=sent.get("pooling", "mean"), normalize=normalize)  # type: ignore[arg-type]
    assert body.options(EmbedOptions(normalize=normalize)) == built


# A sentence-transformers folder's defaults: its pooling, no Normalize, truncation, a default prompt.
MODEL = EmbedOptions(pooling="max", long_text="truncate", normalize=False, prompt_name="query")


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        ({}, MODEL),
        ({"pooling": "cls"}, replace(MODEL, pooling="cls")),
        ({"normalize": True}, replace(MODEL, normalize=True)),
        ({"truncate": False}, replace(MODEL, long_text="error")),  # TEI's flag, sent, means refuse
        ({"truncate": True}, MODEL),
        ({"long_text": "chunk"}, replace(MODEL, long_text="chunk")),
        ({"prompt_name": "passage"}, replace(MODEL, prompt_name="passage")),
        ({"prompt_name": None}, MODEL),  # null: the model's default prompt, as sentence-transformers
        ({"layers": [1, 2]}, replace(MODEL, layers=(1, 2))),
    ],
)
def test_the_model_defaults_fill_what_a_request_leaves_out(
    sent: dict[str, object], expected: EmbedOptions
) -> None:
    assert EmbedRequest.model_validate({"inputs": "a", **sent}).options(MODEL) == expected


def test_long_text_wins_over_truncate_and_defaults_to_error() -> None:
    assert (
        EmbedRequest.model_validate({"inputs": "x", "truncate": True, "long_text": "chunk"})
        .options(EmbedOptions())
        .long_text
        == "chunk"
    )
    assert EmbedRequest.model_validate({"inputs": "x"}).options(EmbedOptions()).long_text == "error"


def test_embed_all_options() -> None:
    body = EmbedAllRequest.model_validate({"inputs": ["x"], "special_tokens": True, "norms": True})
    assert body.options() == EmbedAllOptions(special_tokens=True, norms=True)


def _requests(base: type[StrictRequest]) -> list[type[StrictRequest]]:
    return [base, *(c for sub in base.__subclasses__() for c in _requests(sub))]


def test_the_truncation_fields_are_declared_once_for_every_request_that_takes_them() -> None:
    fields = set(Truncation.model_fields)
    taking = {r for r in _requests(StrictRequest) if fields & set(r.model_fields)}
    assert {r.__name__ for r in taking} >= {
        "EmbedRequest",
        "EmbedAllRequest",
        "SimilarityRequest",
        "RootRequest",
        "EmbedSparseRequest",
        "PredictRequest",
        "RerankRequest",
        "TokenClassificationRequest",
    }
    for request in taking - {Truncation}:
        assert issubclass(request, Truncation), request
        assert not fields & set(vars(request).get("__annotations__", {})), f"{request} declares them again"


@pytest.mark.parametrize(
    "payload",
    [
        {"inputs": 1},  # strict: not a string
        {"inputs": "x", "pooling": "median"},  # not a pooling mode
        {"inputs": "x", "normalize": "true"},  # strict: not a boolean
        {"inputs": "\ud800"},  # a lone surrogate no tokenizer can take
        {"inputs": "x", "encoding": "int4"},
    ],
)
def test_refused(payload: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        EmbedRequest.model_validate(payload)


def test_similarity_takes_exactly_one_form() -> None:
    SimilarityRequest.model_validate({"inputs": {"source_sentence": "a", "sentences": ["b"]}})
    SimilarityRequest.model_validate({"pairs": [["a", "b"]]})
    with pytest.raises(ValidationError, match="exactly one"):
        SimilarityRequest.model_validate({})
    with pytest.raises(ValidationError):
        SimilarityRequest.model_validate({"pairs": [["a", "b", "c"]]})


def test_fill_mask_top_k_from_either_place_default_5() -> None:
    assert FillMaskRequest.model_validate({"inputs": "x"}).wanted_top_k() == 5
    assert FillMaskRequest.model_validate({"inputs": "x", "top_k": 3}).wanted_top_k() == 3
    assert FillMaskRequest.model_validate({"inputs": "x", "parameters": {"top_k": 4}}).wanted_top_k() == 4
    same = {"inputs": "x", "top_k": 4, "parameters": {"top_k": 4}}
    assert FillMaskRequest.model_validate(same).wanted_top_k() == 4


def test_fill_mask_top_k_given_twice_differently_is_refused() -> None:
    with pytest.raises(ValidationError, match="give top_k once"):
        FillMaskRequest.model_validate({"inputs": "x", "top_k": 5, "parameters": {"top_k": 4}})


def test_fill_mask_targets_as_a_list() -> None:
    def targets(parameters: object) -> list[str] | None:
        return FillMaskRequest.model_validate({"inputs": "x", "parameters": parameters}).target_list()

    assert targets({"targets": "中"}) == ["中"]
    assert targets({"targets": ["中", "国"]}) == ["中", "国"]
    assert targets({}) is None and targets(None) is None


@pytest.mark.parametrize(
    "parameters",
    [
        {"targets": []},
        {"targets": ["a"] * (MAX_TARGETS + 1)},
        {"targets": ["a", 1]},  # strict: not a string
        {"targets": "\ud800"},
        {"top_k": 0},
        {"top_k": 51},
        {"top_k": 5.0},  # strict: not an integer
        [],
    ],
)
def test_fill_mask_parameters_refused(parameters: object) -> None:
    with pytest.raises(ValidationError):
        FillMaskRequest.model_validate({"inputs": "x", "parameters": parameters})


def test_the_openapi_says_a_text_holds_something_but_an_empty_one_still_reaches_the_service() -> None:
    """The document says what the service accepts (a text with a character that is not whitespace), while
    validation leaves an empty text to the service, whose answer is the documented 400 ``empty``."""
    text = {"type": "string", "minLength": 1, "pattern": r"\S"}
    assert text in EmbedRequest.model_json_schema()["properties"]["inputs"]["oneOf"]
    assert SimilarityRequest.model_json_schema()["$defs"]["SimilarityInputs"]["properties"][
        "source_sentence"
    ] == {
        **text,
        "title": "Source Sentence",
    }
    assert EmbedRequest.model_validate({"inputs": ["", " "]}).inputs == ["", " "]
