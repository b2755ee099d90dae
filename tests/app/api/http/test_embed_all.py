"""/embed_all against a real server on the tiny model: token vectors equal PyTorch's hidden states at the
same positions, spans index the original text, padding never leaks, batching changes nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import unicodedata
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from app.engine.engine import Engine
from app.engine.work import Job, Need, Seq
from app.settings import Settings
from app.telemetry.metrics import Metrics
from tests.app.conftest import Running, TorchReference, cosine, serving
from tests.app.vectors import assert_same_vectors

TEXTS = ["你好", "今天天气很好，我们去公园散步吧。", "北京是中华人民共和国的首都，有三千多年的建城史。"]
# Latin words that split into wordpieces, digits, full-width punctuation, emoji (outside the BMP, so
# two UTF-16 units in JSON), an accent, and spaces of both widths.
MIXED = "我在Beijing读书，playing football！2024年的iPhone售价8999元😀，café　好吃😂吗？"


def post(client: httpx.Client, **body: object) -> Any:
    response = client.post("/embed_all", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def matrices(client: httpx.Client, **body: object) -> list[np.ndarray]:
    return [np.asarray(rows, dtype=np.float32) for rows in post(client, **body)]


def assert_rows_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    for g, w in zip(got, want, strict=True):
        assert cosine(g, w) >= 0.99999
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("layer", [1, 2, 3, -1, -3])
def test_token_vectors_equal_pytorch_hidden_states(
    client: httpx.Client, torch_ref: TorchReference, layer: int
) -> None:
    got = matrices(client, inputs=TEXTS, layers=[layer])
    for text, rows in zip(TEXTS, got, strict=True):
        states, _ = torch_ref.states(text)
        assert_rows_close(rows, states[layer][1:-1] if layer < 0 else states[layer - 1][1:-1])


def test_special_tokens_add_cls_and_sep(client: httpx.Client, torch_ref: TorchReference) -> None:
    (got,) = matrices(client, inputs=TEXTS[1], special_tokens=True)
    states, _ = torch_ref.states(TEXTS[1])
    assert_rows_close(got, states[-1])
    tokens = post(client, inputs=TEXTS[1], special_tokens=True, return_tokens=True)[0]["tokens"]
    assert [t["text"] for t in (tokens[0], tokens[-1])] == ["[CLS]", "[SEP]"]
    assert tokens[0]["special"] and tokens[-1]["special"] and not tokens[1]["special"]


@pytest.mark.parametrize(
    ("layers", "combine", "weights"),
    [
        ([1, 3], "concat", None),
        ([3, 1, 2], "mean", None),
        ([1, 2, 3], "weighted", [1.0, 2.0, 1.0]),
        ([3, 1], "weighted", [0.0, 5.0]),
        ([3, 1], "difference", None),
        ([-1, 2], "difference", None),
    ],
)
def test_layer_combinations_equal_the_same_arithmetic_on_pytorch(
    client: httpx.Client,
    torch_ref: TorchReference,
    layers: list[int],
    combine: str,
    weights: list[float] | None,
) -> None:
    got = matrices(client, inputs=TEXTS, layers=layers, layer_combine=combine, layer_weights=weights)
    for text, rows in zip(TEXTS, got, strict=True):
        states, _ = torch_ref.states(text)
        picked = [states[layer if layer < 0 else layer - 1][1:-1] for layer in layers]
        if combine == "concat":
            want = np.concatenate(picked, axis=-1)
        elif combine == "mean":
            want = np.mean(picked, axis=0)
        elif combine == "difference":
            want = picked[0] - picked[1]
        else:
            assert weights is not None
            want = np.sum([w * p for w, p in zip(weights, picked, strict=True)], axis=0) / sum(weights)
        assert_rows_close(rows, want)


def normalized(piece: str) -> str:
    """What BERT's normaliser makes of ``piece``: lower case, accents stripped, spaces gone."""
    decomposed = unicodedata.normalize("NFD", piece.lower())
    return "".join(c for c in decomposed if unicodedata.category(c) != "Mn" and not c.isspace())


def test_spans_map_back_to_the_exact_substrings(client: httpx.Client, torch_ref: TorchReference) -> None:
    # ensure_ascii: the emoji travel as surrogate pairs ("\ud83d\ude00"), as many clients send them.
    body = json.dumps({"inputs": MIXED, "return_tokens": True}, ensure_ascii=True)
    assert "\\ud83d" in body
    response = client.post("/embed_all", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    (entry,) = response.json()
    tokens = entry["tokens"]
    assert [t["id"] for t in tokens] == torch_ref.tokenizer(MIXED)["input_ids"][1:-1]
    assert len(entry["vectors"]) == len(tokens)
    assert any(t["text"].startswith("##") for t in tokens), "the text must exercise wordpieces"
    previous_stop = 0
    for t in tokens:
        piece = MIXED[t["start"] : t["stop"]]
        assert t["start"] >= previous_stop and piece, t
        previous_stop = t["stop"]
        if t["text"] == "[UNK]":
            continue
        assert normalized(piece) == t["text"].removeprefix("##"), (t, piece)
    # Emoji are one code point each (two UTF-16 units in the JSON): spans count code points, like str.
    assert [MIXED[t["start"] : t["stop"]] for t in tokens] == [
        *"我在", "Beijing", *"读书，", "play", "ing", "f", "oot", "ball", "！", "202", "4", *"年的",
        "iPhone", *"售价", "899", "9", "元", "😀", "，", "café", *"好吃😂吗？",
    ]  # fmt: skip


def test_spans_find_the_vectors_of_a_word(client: httpx.Client, torch_ref: TorchReference) -> None:
    text = TEXTS[2]
    (entry,) = post(client, inputs=text, return_tokens=True, layers=[2])
    start, stop = text.index("北京"), text.index("北京") + 2
    picked = [i for i, t in enumerate(entry["tokens"]) if start <= t["start"] and t["stop"] <= stop]
    assert "".join(entry["tokens"][i]["text"] for i in picked) == "北京"
    states, _ = torch_ref.states(text)
    got = np.asarray([entry["vectors"][i] for i in picked], dtype=np.float32)
    assert_rows_close(got, states[1][1 : 1 + len(picked)])


def test_padding_never_appears(client: httpx.Client, torch_ref: TorchReference) -> None:
    texts = ["好", TEXTS[2] * 2, "你好吗", TEXTS[1]]
    got = matrices(client, inputs=texts)
    for text, rows in zip(texts, got, strict=True):
        real = len(torch_ref.tokenizer(text)["input_ids"]) - 2
        assert rows.shape == (real, 64)
        assert_rows_close(rows, torch_ref.states(text)[0][-1][1:-1])


def test_batching_does_not_change_any_token_vector(tiny_model: Any, tiny_settings: Settings) -> None:
    # A huge per-batch overhead (the constant cost model) makes sharing one batch always worth its
    # padding: the point here.
    update = {"max_wait_ms": 200, "measure_batch_cost": False, "batch_overhead_tokens": 100_000}
    engine = Engine(tiny_model, tiny_settings.model_copy(update=update), Metrics())
    engine.start()
    short = np.array([101, 872, 1962, 102], dtype=np.int64)  # [CLS] 你 好 [SEP]
    longer = [np.array([101, *([791] * n), 102], dtype=np.int64) for n in (40, 90)]
    need = Need(layers=(1, 3), tokens=True)

    async def run(sequences: list[np.ndarray]) -> Job:
        job = Job(asyncio.get_running_loop(), len(sequences))
        enqueued = engine.clock.now()
        return await engine.run(job, [Seq(s, need, job, i, enqueued) for i, s in enumerate(sequences)])

    try:
        alone = asyncio.run(run([short]))
        together = asyncio.run(run([longer[0], short, longer[1]]))
    finally:
        engine.stop()
    assert len(together.batches) == 1 and engine.batcher.stats.largest_batch == 3  # one batch of 3
    for states, ids in zip(together.token_states, [longer[0], short, longer[1]], strict=True):
        assert states is not None and states.shape == (2, len(ids), 64)  # only the sequence's own rows
    assert len(alone.batches) == 1 and alone.count == 1
    together_short, alone_short = together.token_states[1], alone.token_states[0]
    assert together_short is not None and alone_short is not None
    np.testing.assert_allclose(together_short, alone_short, rtol=1e-5, atol=1e-5)


def test_norms_are_taken_before_normalize(client: httpx.Client) -> None:
    (raw,) = post(client, inputs=TEXTS[1], norms=True)
    (unit,) = post(client, inputs=TEXTS[1], norms=True, normalize=True)
    assert set(raw) == {"vectors", "norms"}
    vectors = np.asarray(raw["vectors"], dtype=np.float32)
    np.testing.assert_allclose(raw["norms"], np.linalg.norm(vectors, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(unit["norms"], raw["norms"], rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(unit["vectors"]), axis=-1), 1.0, atol=1e-5)


def test_base64_decodes_to_the_float_vectors(client: httpx.Client) -> None:
    (encoded,) = post(client, inputs=TEXTS[1], encoding="base64", layers=[1, 2])
    (floats,) = matrices(client, inputs=TEXTS[1], layers=[1, 2])
    decoded = np.stack([np.frombuffer(base64.b64decode(row), dtype="<f4") for row in encoded])
    assert_same_vectors(decoded, floats)


def test_long_text_truncate_keeps_the_first_tokens(client: httpx.Client, torch_ref: TorchReference) -> None:
    text = "北京天气很好我们去公园" * 30  # 330 tokens
    (entry,) = post(client, inputs=text, truncate=True, return_tokens=True)
    states, _ = torch_ref.states(text, max_length=128)
    assert_rows_close(np.asarray(entry["vectors"], dtype=np.float32), states[-1][1:-1])
    assert [t["start"] for t in entry["tokens"]] == list(range(126))
    (left,) = post(client, inputs=text, long_text="truncate", truncation_direction="left", return_tokens=True)
    assert [t["start"] for t in left["tokens"]] == list(range(len(text) - 126, len(text)))


def test_long_text_error_and_chunk_give_422(client: httpx.Client) -> None:
    text = "北京天气很好我们去公园" * 30
    response = client.post("/embed_all", json={"inputs": text})
    assert response.status_code == 422 and "332 tokens" in response.json()["error"]
    response = client.post("/embed_all", json={"inputs": text, "long_text": "chunk"})
    assert response.status_code == 422 and "chunk" in response.json()["error"]


@pytest.fixture(scope="module")
def bounded(tiny_settings: Settings) -> Iterator[Running]:
    """A server that returns at most 20 token vectors per /embed_all request."""
    settings = tiny_settings.model_copy(update={"max_embed_all_tokens": 20, "warmup": False})
    with serving(settings) as running:
        yield running


def test_the_token_bound_gives_422_with_the_count_and_the_limit(bounded: Running) -> None:
    with httpx.Client(base_url=bounded.url, timeout=60) as client:
        assert len(post(client, inputs=["一二三四五六七八九十"] * 2)[1]) == 10  # 20 tokens: at the bound
        computed = bounded.service.engine.stats()["batched_items"]
        response = client.post("/embed_all", json={"inputs": ["一二三四五六七八九十"] * 2 + ["你好吗"]})
    assert response.status_code == 422, response.text
    assert response.json()["error_type"] == "validation"
    assert "23 token vectors" in response.json()["error"] and "limit is 20" in response.json()["error"]
    assert bounded.service.engine.stats()["batched_items"] == computed  # refused before inference


def test_the_token_bound_counts_each_layer_held_whatever_the_mix(bounded: Running) -> None:
    text = "一二三四五六七八九十"
    with httpx.Client(base_url=bounded.url, timeout=60) as client:
        assert len(post(client, inputs=text, layers=[1, 2])[0]) == 10
        computed = bounded.service.engine.stats()["batched_items"]
        # A mean of the tiny model's 3 layers holds 3 rows a token, as concat does (it was counted as 1).
        for combine in ("concat", "mean"):
            response = client.post(
                "/embed_all", json={"inputs": text, "layers": [1, 2, 3], "layer_combine": combine}
            )
            assert response.status_code == 422, response.text
            assert "30 token vectors (10 tokens × 3 layers held)" in response.json()["error"]
    assert bounded.service.engine.stats()["batched_items"] == computed  # refused before inference


def test_a_layer_named_twice_is_refused_naming_it(client: httpx.Client) -> None:
    for layers, named in (([2, 2], "layer 2 as 2, 2"), ([-1, 3], "layer 3 as -1, 3")):
        response = client.post(
            "/embed_all", json={"inputs": "你好", "layers": layers, "layer_combine": "mean"}
        )
        assert response.status_code == 422, response.text
        assert named in response.json()["error"]
        response = client.post("/embed", json={"inputs": "你好", "layers": layers})
        assert response.status_code == 422 and named in response.json()["error"], response.text


def test_an_input_without_real_tokens_is_refused_like_an_empty_one(client: httpx.Client) -> None:
    for inputs, words in (
        (["你", "   "], "inputs[1] is only whitespace"),
        ("\u200b", "inputs has no tokens"),
    ):
        response = client.post("/embed_all", json={"inputs": inputs, "special_tokens": True})
        assert response.status_code == 400, response.text
        assert response.json()["error_type"] == "empty" and words in response.json()["error"]
