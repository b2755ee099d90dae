"""/v1/embeddings and /embeddings through the official openai client against a real server."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

from tests.app.conftest import Running

TEXTS = ["你好", "今天天气很好，我们去公园散步吧。"]


def client_for(server: Running, path: str = "/v1") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + path, api_key="unused", max_retries=0, timeout=30)


def native(client: httpx.Client, texts: list[str]) -> list[np.ndarray]:
    response = client.post("/embed", json={"inputs": texts})
    return [np.asarray(v, dtype=np.float32) for v in response.json()]


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_openai_client_gets_the_same_vectors_as_embed(
    server: Running, client: httpx.Client, encoding_format: str
) -> None:
    response = client_for(server).embeddings.create(
        model="bert-base-chinese", input=TEXTS, encoding_format=encoding_format, user="someone"
    )
    assert [d.index for d in response.data] == [0, 1]
    assert response.model == server.service.model.manifest.source.model
    tokens = [len(server.service.model.tokenizer.encode_batch([t], True)[0].ids) for t in TEXTS]
    assert response.usage.prompt_tokens == response.usage.total_tokens == sum(tokens)
    want = native(client, TEXTS)
    for got, expected in zip(response.data, want, strict=True):
        if encoding_format == "base64":  # asked for explicitly, the client hands the string over
            assert isinstance(got.embedding, str)
            vector = np.frombuffer(base64.b64decode(got.embedding), dtype="<f4")
        else:
            vector = np.asarray(got.embedding, dtype=np.float32)
        np.testing.assert_array_equal(vector, expected)


def test_openai_client_default_and_single_string_on_the_alias(server: Running, client: httpx.Client) -> None:
    # Without encoding_format the client asks for base64 and decodes it.
    response = client_for(server, "").embeddings.create(model="any", input=TEXTS[0])
    assert len(response.data) == 1
    np.testing.assert_array_equal(
        np.asarray(response.data[0].embedding, np.float32), native(client, TEXTS[:1])[0]
    )


def test_errors_come_in_openai_shape(server: Running, client: httpx.Client) -> None:
    with pytest.raises(openai.BadRequestError) as empty:
        client_for(server).embeddings.create(model="m", input=[""])
    assert empty.value.code == "empty" and empty.value.type == "invalid_request_error"
    with pytest.raises(openai.UnprocessableEntityError) as wide:
        client_for(server).embeddings.create(model="m", input="x", dimensions=5)
    assert "dimensions 5" in wide.value.message
    response = client.post("/v1/embeddings", json={"input": [1, 2, 3], "model": "m"})
    assert response.status_code == 422
    assert set(response.json()["error"]) == {"message", "type", "code"}
    # The native routes keep their own shape.
    assert set(client.post("/embed", json={"inputs": ""}).json()) == {"error", "error_type"}


def test_the_model_width_is_accepted_as_dimensions(server: Running) -> None:
    width = server.service.model.hidden_size
    response = client_for(server).embeddings.create(model="m", input="维度", dimensions=width)
    assert len(response.data[0].embedding) == width
