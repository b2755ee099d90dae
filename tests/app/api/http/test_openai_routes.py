"""/v1/embeddings and /embeddings through the official openai client against a real server."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Literal

import httpx
import numpy as np
import openai
import pytest

from app.settings import Settings
from tests.app.conftest import Running, serving
from tests.app.vectors import assert_same_bits, assert_same_vectors

TEXTS = ["你好", "今天天气很好，我们去公园散步吧。"]


def client_for(server: Running, path: str = "/v1") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + path, api_key="unused", max_retries=0, timeout=30)


def native(client: httpx.Client, texts: list[str]) -> list[np.ndarray]:
    response = client.post("/embed", json={"inputs": texts})
    return [np.asarray(v, dtype=np.float32) for v in response.json()]


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_openai_client_gets_the_same_vectors_as_embed(
    server: Running, client: httpx.Client, encoding_format: Literal["float", "base64"]
) -> None:
    response = client_for(server).embeddings.create(
        model="bert-base-chinese", input=TEXTS, encoding_format=encoding_format, user="someone"
    )
    assert [d.index for d in response.data] == [0, 1]
    assert response.model == server.service.model.manifest.source.name() == "tiny-source0"
    tokens = [len(server.service.model.tokenizer.encode_batch([t], True)[0].ids) for t in TEXTS]
    assert response.usage.prompt_tokens == response.usage.total_tokens == sum(tokens)
    want = native(client, TEXTS)
    for got, expected in zip(response.data, want, strict=True):
        if encoding_format == "base64":  # asked for explicitly, the client hands the string over
            assert isinstance(got.embedding, str)
            vector = np.frombuffer(base64.b64decode(got.embedding), dtype="<f4")
        else:
            vector = np.asarray(got.embedding, dtype=np.float32)
        assert_same_vectors(vector, expected)


@pytest.mark.parametrize("encoding_format", ["binary", "ubinary"])
def test_binary_encoding_formats_pack_the_signs_as_embed_does(
    client: httpx.Client, encoding_format: str
) -> None:
    response = client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": encoding_format})
    assert response.status_code == 200, response.text
    packed = [d["embedding"] for d in response.json()["data"]]
    assert_same_bits(packed, native(client, TEXTS), signed=encoding_format == "binary")


def test_openai_client_default_and_single_string_on_the_alias(server: Running, client: httpx.Client) -> None:
    # Without encoding_format the client asks for base64 and decodes it.
    response = client_for(server, "").embeddings.create(model="any", input=TEXTS[0])
    assert len(response.data) == 1
    assert_same_vectors(response.data[0].embedding, native(client, TEXTS[:1])[0])


def test_errors_come_in_openai_shape(server: Running, client: httpx.Client) -> None:
    with pytest.raises(openai.BadRequestError) as empty:
        client_for(server).embeddings.create(model="m", input=[""])
    assert empty.value.code == "empty" and empty.value.type == "invalid_request_error"
    with pytest.raises(openai.UnprocessableEntityError) as wide:
        client_for(server).embeddings.create(model="m", input="x", dimensions=5)
    # The one refusal of every embedding route: this model was not trained for shorter vectors.
    native_refusal = client.post("/embed", json={"inputs": "x", "dimensions": 5}).json()["error"]
    assert native_refusal.startswith("dimensions 5 is not supported: the vectors have 64 dimensions")
    assert isinstance(wide.value.body, dict) and wide.value.body["message"] == native_refusal
    response = client.post("/v1/embeddings", json={"input": {"text": "a"}, "model": "m"})
    assert response.status_code == 422
    assert response.json()["error"]["message"] == (
        "input must be a string, a list of strings, a list of token ids or a list of such lists, not an object"
    )
    assert set(response.json()["error"]) == {"message", "type", "code"}
    # The native routes keep their own shape.
    assert set(client.post("/embed", json={"inputs": ""}).json()) == {"error", "error_type"}


def test_the_model_width_is_accepted_as_dimensions(server: Running, client: httpx.Client) -> None:
    width = server.service.model.hidden_size
    response = client_for(server).embeddings.create(model="m", input="维度", dimensions=width)
    assert len(response.data[0].embedding) == width  # nothing cut: the vector without dimensions
    assert_same_vectors(response.data[0].embedding, native(client, ["维度"])[0])


def token_ids(client: httpx.Client, texts: list[str]) -> list[list[int]]:
    """The ids ``/tokenize`` gives, [CLS] and [SEP] included: what TEI and OpenAI clients send."""
    tokens = client.post("/tokenize", json={"inputs": texts}).json()
    return [[t["id"] for t in row] for row in tokens]


def test_token_ids_embed_like_their_text(server: Running, client: httpx.Client) -> None:
    ids = token_ids(client, TEXTS)
    response = client_for(server).embeddings.create(model="m", input=ids)
    assert response.usage.prompt_tokens == sum(len(x) for x in ids)
    for got, want in zip(response.data, native(client, TEXTS), strict=True):
        assert_same_vectors(got.embedding, want)
    # One list of ids is one input.
    (one,) = client_for(server).embeddings.create(model="m", input=ids[1]).data
    assert_same_vectors(one.embedding, native(client, TEXTS[1:])[0])


def test_token_ids_run_as_given_without_added_special_tokens(server: Running, client: httpx.Client) -> None:
    # As TEI: the ids are the sequence; ids without [CLS]/[SEP] are another sequence, not the text's.
    (with_specials,) = token_ids(client, [TEXTS[1]])
    bare = with_specials[1:-1]
    vectors = [
        np.asarray(d.embedding, np.float32)
        for d in client_for(server).embeddings.create(model="m", input=[with_specials, bare]).data
    ]
    assert float(vectors[0] @ vectors[1]) < 0.9999


def test_a_token_id_outside_the_vocabulary_is_refused_in_openai_shape(server: Running) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client_for(server).embeddings.create(model="m", input=[[101, 21128, 102]])
    assert "input[0][1] is 21128, not a token id of this model (0..21127)" in refused.value.message


def test_the_model_list_names_the_served_model(server: Running) -> None:
    client = client_for(server)
    (card,) = client.models.list().data
    assert card.id == "tiny-source0" and card.object == "model" and card.owned_by == "zhembed"
    assert card.created > 0
    assert client.models.retrieve("tiny-source0").id == "tiny-source0"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("text-embedding-3-small")
    assert "this server serves 'tiny-source0'" in missing.value.message


def test_a_served_model_name_is_what_every_client_sees(tiny_settings: Settings) -> None:
    settings = tiny_settings.model_copy(update={"served_model_name": "google-bert/bert-base-chinese"})
    with serving(settings) as running, httpx.Client(base_url=running.url, timeout=30) as http:
        client = client_for(running)
        assert client.embeddings.create(model="x", input="你好").model == "google-bert/bert-base-chinese"
        assert [m.id for m in client.models.list().data] == ["google-bert/bert-base-chinese"]
        assert client.models.retrieve("google-bert/bert-base-chinese").id == "google-bert/bert-base-chinese"
        assert http.get("/info").json()["model_id"] == "google-bert/bert-base-chinese"
        assert 'model="google-bert/bert-base-chinese"' in http.get("/metrics").text


def test_no_path_of_the_server_reaches_a_client(
    server: Running, client: httpx.Client, tiny_model_dir: Path, tiny_source_dir: Path
) -> None:
    answers = [
        client.get("/info").text,
        client.get("/metrics").text,
        client.get("/v1/models").text,
        client.get("/openapi.json").text,
        client.post("/v1/embeddings", json={"input": "你好"}).text,
        client.post("/v1/embeddings", json={"input": [[1, 10**6]]}).text,
        client.post("/embed", json={"inputs": "x" * 9000}).text,
    ]
    for answer in answers:
        for path in (tiny_model_dir, tiny_source_dir, tiny_model_dir.parent.parent):
            assert str(path) not in answer
