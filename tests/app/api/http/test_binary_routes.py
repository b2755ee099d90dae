"""``binary`` / ``ubinary`` on ``/embed``, TEI's root route and ``/v1/embeddings``: the bytes of
sentence-transformers' ``quantize_embeddings`` of the float vectors the service answers for the same text
(one text a request, so the float and the packed answer come from the same batch shape)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

TEXTS = ["你好", "今天天气很好，我们去公园散步吧。", "北京是中华人民共和国的首都，有三千多年的建城史。"]


@pytest.mark.parametrize("precision", ["binary", "ubinary"])
def test_packed_answers_are_quantize_embeddings_of_the_float_answer(
    client: httpx.Client, precision: str
) -> None:
    from sentence_transformers import quantize_embeddings

    for text in TEXTS:
        floats = np.asarray(client.post("/embed", json={"inputs": text}).json(), np.float32)
        want = quantize_embeddings(floats, precision=precision).tolist()  # type: ignore[arg-type]
        assert client.post("/embed", json={"inputs": text, "encoding": precision}).json() == want
        assert client.post("/", json={"inputs": text, "encoding": precision}).json() == want
        openai = client.post("/v1/embeddings", json={"input": text, "encoding_format": precision}).json()
        assert [d["embedding"] for d in openai["data"]] == want
