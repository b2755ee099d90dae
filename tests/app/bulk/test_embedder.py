"""Every vector the job writes is what POST /embed returns for the same text and options, and every row
the job refuses gets the message the API gives for that mistake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.bulk.embedder import TOO_LONG_BULK
from app.engine.engine import Engine
from app.engine.work import Job, Plan
from tests.app.bulk.conftest import TEXTS, errors, run_bulk, shards, vectors, write_jsonl
from tests.app.conftest import Running

LONG = ["长文本里有很多字。" * 20, "北京" * 90]  # over the tiny model's 128 tokens
OPTION_SETS: list[dict[str, Any]] = [
    {},
    {"pooling": "cls", "layers": [-1, -2]},
    {"layers": [1, 3], "layer_combine": "mean", "normalize": False},
    {"layers": [1, 2], "layer_combine": "weighted", "layer_weights": [1, 3]},
    {"layers": [3, 1], "layer_combine": "difference"},
    {"pooling": "pooler"},
    {"pooling": "max", "long_text": "truncate", "truncation_direction": "left"},
    {"long_text": "chunk"},
]


def as_flags(options: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else f"--no-{name.replace('_', '-')}")
        elif isinstance(value, list):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def embed_over_http(client: httpx.Client, texts: list[str], options: dict[str, Any]) -> np.ndarray:
    rows = []
    for start in range(0, len(texts), 32):
        response = client.post("/embed", json={"inputs": texts[start : start + 32], **options})
        assert response.status_code == 200, response.text
        rows += response.json()
    return np.asarray(rows, dtype=np.float32)


@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(o) or "defaults")
def test_every_vector_equals_what_post_embed_returns(
    options: dict[str, Any], client: httpx.Client, server: Running, tiny_model_dir: Path, tmp_path: Path
) -> None:
    texts = TEXTS + (LONG if options.get("long_text") in ("chunk", "truncate") else [])
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t, "id": f"t{i}"} for i, t in enumerate(texts)])
    assert run_bulk(tiny_model_dir, corpus, tmp_path / "out", "--id-field", "id", *as_flags(options)) == 0
    got = vectors(tmp_path / "out")
    want = embed_over_http(client, texts, options)
    assert list(got) == [f"t{i}" for i in range(len(texts))]  # input order, every row once
    assert np.abs(np.stack(list(got.values())) - want).max() <= 1e-5


def test_tokens_are_each_texts_own_count(client: httpx.Client, tiny_model_dir: Path, tmp_path: Path) -> None:
    texts = ["你好", "北京是首都", LONG[0]]
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in texts])
    assert run_bulk(tiny_model_dir, corpus, tmp_path / "out", "--long-text", "chunk") == 0
    # [CLS] and [SEP] included, before any windowing: what /tokenize counts.
    want = [len(client.post("/tokenize", json={"inputs": t}).json()[0]) for t in texts]
    assert shards(tmp_path / "out").column("tokens").to_pylist() == want


def test_a_bad_row_gets_the_apis_message_and_the_rest_of_its_call_is_embedded(
    client: httpx.Client, tiny_model_dir: Path, tmp_path: Path
) -> None:
    bad = ["", "   \n", "\u200b\u200b", LONG[1]]
    # With --text-field inputs the job names a text as a one-string request names it.
    rows = [{"inputs": t} for t in [*TEXTS[:10], *bad, *TEXTS[10:20], "\u200b\u200b"]]
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    assert run_bulk(tiny_model_dir, corpus, tmp_path / "out", "--text-field", "inputs") == 3
    got = errors(tmp_path / "out")
    assert [e["id"] for e in got] == ["c.jsonl:11", "c.jsonl:12", "c.jsonl:13", "c.jsonl:14", "c.jsonl:25"]
    for text, entry in zip([*bad, "\u200b\u200b"], got, strict=True):
        api = client.post("/embed", json={"inputs": text}).json()["error"]
        if text is LONG[1]:  # the same words, with the remedy in the job's own terms
            assert entry["error"] == api.split("; ")[0] + "; " + TOO_LONG_BULK
        else:
            assert entry["error"] == api
    assert len(vectors(tmp_path / "out")) == 20


def test_every_bad_row_of_a_call_is_found_in_the_same_engine_call_as_the_good_ones(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    run_texts = Engine.run_texts

    async def counted(self: Engine, texts: list[str], plan: Plan) -> Job:
        calls.append(len(texts))
        return await run_texts(self, texts, plan)

    monkeypatch.setattr(Engine, "run_texts", counted)
    bad = ["", "\u200b\u200b", LONG[0], "   ", LONG[1], "\u200b"]
    rows = [{"text": t} for t in [*TEXTS[:10], *bad, *TEXTS[10:20]]]
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    assert run_bulk(tiny_model_dir, corpus, tmp_path / "out") == 3
    assert [e["id"] for e in errors(tmp_path / "out")] == [f"c.jsonl:{n}" for n in range(11, 17)]
    assert sorted(vectors(tmp_path / "out")) == sorted(
        [f"c.jsonl:{n}" for n in range(1, 11)] + [f"c.jsonl:{n}" for n in range(17, 27)]
    )
    # The options' check, then ONE call for the file's 26 rows: bad rows are not retried one by one.
    assert len(calls) == 2 and calls[0] == 1


def test_a_field_of_the_wrong_type_is_worded_as_the_api_words_a_string_field(
    client: httpx.Client, tiny_model_dir: Path, tmp_path: Path
) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"source_sentence": 5}, {"source_sentence": "好"}])
    assert run_bulk(tiny_model_dir, corpus, tmp_path / "out", "--text-field", "source_sentence") == 3
    api = client.post("/similarity", json={"inputs": {"source_sentence": 5, "sentences": ["a"]}}).json()[
        "error"
    ]
    assert api == "inputs." + errors(tmp_path / "out")[0]["error"]


def test_dimensions_cut_the_vectors_as_post_embed_does_and_are_refused_as_it_refuses_them(
    matryoshka_model_dir: Path, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in TEXTS[:6]])
    assert run_bulk(matryoshka_model_dir, corpus, tmp_path / "full") == 0
    assert run_bulk(matryoshka_model_dir, corpus, tmp_path / "cut", "--dimensions", "16") == 0
    full, cut = vectors(tmp_path / "full"), vectors(tmp_path / "cut")
    for key, whole in full.items():  # the first 16 components of the whole vector, normalised again
        assert cut[key].shape == (16,)
        np.testing.assert_allclose(cut[key], whole[:16] / np.linalg.norm(whole[:16]), atol=1e-5)
    capsys.readouterr()
    assert run_bulk(tiny_model_dir, corpus, tmp_path / "refused", "--dimensions", "16") == 2
    assert "dimensions 16 is not supported" in capsys.readouterr().err
    assert not list((tmp_path / "refused").glob("part-*.parquet"))
