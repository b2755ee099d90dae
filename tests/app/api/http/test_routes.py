"""/embed, TEI's root route, /similarity, /tokenize, /info, /health, /ready against a real server on the tiny model."""

from __future__ import annotations

import base64
import inspect
import json

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from app.serving.factory import create_app
from app.settings import Settings
from tests.app.conftest import Running, TorchReference, cosine
from tests.app.vectors import assert_same_bits, assert_same_vectors

TEXTS = ["你好", "今天天气很好，我们去公园散步吧。", "北京是中华人民共和国的首都，有三千多年的建城史。"]
TIMING_HEADERS = ("x-queue-time", "x-tokenization-time", "x-inference-time", "x-total-time")


def embed(client: httpx.Client, **body: object) -> list[np.ndarray]:
    response = client.post("/embed", json=body)
    assert response.status_code == 200, response.text
    return [np.asarray(v, dtype=np.float32) for v in response.json()]


@pytest.mark.parametrize("pooling", ["cls", "mean", "pooler"])
@pytest.mark.parametrize("normalize", [True, False])
def test_embed_equals_pytorch_for_each_pooling(
    client: httpx.Client, torch_ref: TorchReference, pooling: str, normalize: bool
) -> None:
    got = embed(client, inputs=TEXTS, pooling=pooling, normalize=normalize)
    for text, vector in zip(TEXTS, got, strict=True):
        want = torch_ref.embed(text, pooling=pooling, normalize=normalize)
        assert cosine(vector, want) >= 0.99999
        np.testing.assert_allclose(vector, want, rtol=1e-3, atol=1e-4)
    if normalize:
        assert all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in got)


@pytest.mark.parametrize(
    ("layers", "combine"),
    [([1], "concat"), ([-2], "concat"), ([1, 2, 3], "concat"), ([-1, -3], "mean"), ([2, 3], "mean")],
)
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_embed_equals_pytorch_for_layers(
    client: httpx.Client, torch_ref: TorchReference, layers: list[int], combine: str, pooling: str
) -> None:
    got = embed(client, inputs=TEXTS, pooling=pooling, layers=layers, layer_combine=combine, normalize=False)
    for text, vector in zip(TEXTS, got, strict=True):
        want = torch_ref.embed(text, pooling=pooling, layers=layers, combine=combine, normalize=False)
        assert vector.shape == want.shape
        assert cosine(vector, want) >= 0.99999


def test_embed_base64_decodes_to_the_float_vectors(client: httpx.Client, torch_ref: TorchReference) -> None:
    response = client.post("/embed", json={"inputs": TEXTS, "encoding": "base64"})
    floats = embed(client, inputs=TEXTS)
    for encoded, want, text in zip(response.json(), floats, TEXTS, strict=True):
        decoded = np.frombuffer(base64.b64decode(encoded), dtype="<f4")
        assert_same_vectors(decoded, want)
        assert cosine(decoded, torch_ref.embed(text)) >= 0.99999


def test_embed_int8_decodes_close_to_the_float_vectors(client: httpx.Client) -> None:
    response = client.post("/embed", json={"inputs": TEXTS, "encoding": "int8", "normalize": False})
    floats = embed(client, inputs=TEXTS, normalize=False)
    for encoded, want in zip(response.json(), floats, strict=True):
        values = np.asarray(encoded["values"])
        assert values.min() >= -127 and values.max() <= 127
        decoded = values * encoded["scale"]
        assert np.abs(decoded - want).max() <= encoded["scale"] / 2 + 1e-6
        assert cosine(decoded, want) >= 0.999


@pytest.mark.parametrize("encoding", ["binary", "ubinary"])
def test_embed_binary_packs_the_signs_of_the_float_vectors(client: httpx.Client, encoding: str) -> None:
    # 64 dimensions: 8 bytes; widths that are not a multiple of 8 are tested in tests/app/api/test_encoding.py
    response = client.post("/embed", json={"inputs": TEXTS, "encoding": encoding})
    assert response.status_code == 200, response.text
    packed = response.json()
    floats = embed(client, inputs=TEXTS)
    assert [len(p) for p in packed] == [-(-len(f) // 8) for f in floats] == [8] * len(TEXTS)
    assert all(isinstance(x, int) for p in packed for x in p)
    assert_same_bits(packed, floats, signed=encoding == "binary")


def test_embed_single_string_gives_one_vector_and_timing_headers(client: httpx.Client) -> None:
    response = client.post("/embed", json={"inputs": "你好"})
    assert response.status_code == 200
    assert len(response.json()) == 1
    for header in TIMING_HEADERS:
        assert float(response.headers[header]) >= 0


def long_text(tokens: int) -> str:
    # Each of these characters is one token in the bert-base-chinese vocab.
    return "".join("北京天气很好我们去公园"[i % 11] for i in range(tokens))


def test_long_text_error_names_the_token_count_and_limit(client: httpx.Client) -> None:
    response = client.post("/embed", json={"inputs": ["你好", long_text(300)]})
    assert response.status_code == 422
    assert "302 tokens" in response.json()["error"] and "128" in response.json()["error"]


def test_long_text_truncate_equals_pytorch_truncation(
    client: httpx.Client, torch_ref: TorchReference
) -> None:
    text = long_text(300)
    (got,) = embed(client, inputs=text, long_text="truncate", pooling="cls")
    states, _ = torch_ref.states(text, max_length=128)
    assert cosine(got, states[-1][0]) >= 0.99999
    (tei,) = embed(client, inputs=text, truncate=True, pooling="cls")
    assert_same_vectors(tei, got)


def test_long_text_truncate_left_keeps_the_end(client: httpx.Client, torch_ref: TorchReference) -> None:
    text = long_text(300)
    (got,) = embed(client, inputs=text, long_text="truncate", truncation_direction="left", normalize=False)
    want = torch_ref.embed(text[-126:], normalize=False)
    assert cosine(got, want) >= 0.99999


def test_long_text_chunk_is_the_token_weighted_mean_of_windows(
    client: httpx.Client, torch_ref: TorchReference
) -> None:
    text = long_text(300)  # windows of 126 + 126 + 48 tokens
    (got,) = embed(client, inputs=text, long_text="chunk", normalize=False)
    windows = [text[0:126], text[126:252], text[252:]]
    parts = [torch_ref.embed(w, normalize=False) for w in windows]
    want = np.sum([p * len(w) for p, w in zip(parts, windows, strict=True)], axis=0) / len(text)
    assert cosine(got, want) >= 0.99999


def test_similarity_source_and_sentences(client: httpx.Client, torch_ref: TorchReference) -> None:
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS}, "pooling": "cls"}
    response = client.post("/similarity", json=body)
    assert response.status_code == 200
    want = [cosine(torch_ref.embed(TEXTS[0], "cls"), torch_ref.embed(t, "cls")) for t in TEXTS]
    np.testing.assert_allclose(response.json(), want, atol=1e-5)
    assert "x-inference-time" in response.headers


def test_similarity_pairs(client: httpx.Client, torch_ref: TorchReference) -> None:
    pairs = [[TEXTS[0], TEXTS[1]], [TEXTS[2], TEXTS[2]]]
    response = client.post("/similarity", json={"pairs": pairs, "layers": [1, 3]})
    assert response.status_code == 200
    want = [cosine(torch_ref.embed(a, layers=[1, 3]), torch_ref.embed(b, layers=[1, 3])) for a, b in pairs]
    np.testing.assert_allclose(response.json(), want, atol=1e-5)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"pooling": "cls", "layers": [1, 3], "normalize": False},
        {"encoding": "base64"},
        {"encoding": "int8"},
        {"encoding": "ubinary"},
    ],
)
def test_root_route_embeds_texts_as_embed_does(client: httpx.Client, options: dict[str, object]) -> None:
    for inputs in (TEXTS[1], TEXTS):
        root = client.post("/", json={"inputs": inputs, **options})
        assert root.status_code == 200, root.text
        assert root.json() == client.post("/embed", json={"inputs": inputs, **options}).json()
        assert "x-inference-time" in root.headers


def test_root_route_scores_source_and_sentences_as_similarity_does(
    client: httpx.Client, torch_ref: TorchReference
) -> None:
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}, "pooling": "cls"}
    root = client.post("/", json=body)
    assert root.status_code == 200, root.text
    assert root.json() == client.post("/similarity", json=body).json()
    want = [cosine(torch_ref.embed(TEXTS[0], "cls"), torch_ref.embed(t, "cls")) for t in TEXTS[1:]]
    np.testing.assert_allclose(root.json(), want, atol=1e-5)


def test_root_route_names_its_three_forms_when_given_another(client: httpx.Client) -> None:
    response = client.post("/", json={"inputs": 5})
    assert response.status_code == 422
    assert response.json()["error"] == (
        "inputs must be a string, a list of strings, or {source_sentence, sentences}, not a number"
    )
    missing = client.post("/", json={"inputs": {"source_sentence": "a"}})
    assert missing.json()["error"] == "inputs.sentences is required"


def test_tokenize_gives_ids_tokens_and_character_offsets(
    client: httpx.Client, torch_ref: TorchReference
) -> None:
    text = "你好 world"
    response = client.post("/tokenize", json={"inputs": [text]})
    assert response.status_code == 200
    (tokens,) = response.json()
    assert [t["id"] for t in tokens] == torch_ref.tokenizer(text)["input_ids"]
    assert tokens[0]["special"] and tokens[-1]["special"]
    assert [text[t["start"] : t["stop"]] for t in tokens[1:-1]] == ["你", "好", "world"]


def test_a_short_request_is_tokenized_on_the_event_loop_and_a_long_one_is_not(client: httpx.Client) -> None:
    def on_the_loop() -> int:
        return int(client.get("/info").json()["stats"]["requests_tokenized_on_the_event_loop"])

    before = on_the_loop()
    short = client.post("/tokenize", json={"inputs": "你好"})
    long = client.post("/tokenize", json={"inputs": "你好" * 200})  # 400 characters, past the bound
    assert short.status_code == long.status_code == 200
    assert on_the_loop() == before + 1
    assert len(short.json()[0]) == 4 and len(long.json()[0]) == 402


def test_health_ready_info_docs(client: httpx.Client) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {"ready": True}
    info = client.get("/info").json()
    assert info["weights"] in ("pretrained", "random")
    assert info["variant"] == "fp32" and info["provider"] == "CPUExecutionProvider"
    assert info["intra_op_threads"] == 1  # the tests' setting
    assert info["max_input_length"] == 128 and info["batching"]["max_batch_size"] >= 1
    assert client.get("/docs").status_code == 200


def test_fastapi_native_telemetry_is_off(server: Running) -> None:
    """FastAPI versions with OpenTelemetry hooks would consult the global providers on every request."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        pytest.skip("this FastAPI has no native telemetry")
    config = server.app._telemetry
    assert (config["tracing"], config["metrics"], config["logs"]) == (False, False, False)


def test_embed_sparse_on_a_model_without_the_sparse_graph_says_how_to_get_one(client: httpx.Client) -> None:
    response = client.post("/embed_sparse", json={"inputs": TEXTS})
    assert response.status_code == 400 and response.json()["error_type"] == "unsupported"
    assert (
        "has no sparse (SPLADE) output: export it with `python -m export --sparse max`"
        in response.json()["error"]
    )
    assert "/embed_sparse" not in client.get("/info").json()["routes"]


def test_root_route_documents_the_heads_answers_too() -> None:
    """A classifier or reranker answers the root route as /predict does, a tagger as /token-classification
    (the property suite found a tagger's entities outside the documented answer)."""
    spec = create_app(Settings(model="unused")).openapi()
    answer = json.dumps(spec["paths"]["/"]["post"]["responses"]["200"])
    for shape in ("Int8Vector", "LabelScore", "Entity"):
        assert f"#/components/schemas/{shape}" in answer, shape
