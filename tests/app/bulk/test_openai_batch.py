"""Each line of an OpenAI batch file gets one answer: the route's (its 4xx in OpenAI's error shape
included), or, for a line no route sees, an ``error`` with a code; the job goes on past every one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import orjson

from app.bulk.cli import main
from app.bulk.openai_batch import Line, batch_routes, ids_of, record
from tests.app.bulk.test_batch_job import batch_args, read_output


def embeddings(custom_id: str, body: Any) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body})


def test_malformed_lines_are_answered_each_on_its_line_and_the_job_goes_on(
    tiny_model_dir: Path, tmp_path: Path, client: httpx.Client
) -> None:
    lines = [
        embeddings("ok-1", {"input": "你好"}),
        b"{not json",
        b"[1, 2]",
        orjson.dumps({"method": "POST", "url": "/v1/embeddings", "body": {"input": "a"}}),
        embeddings("ok-1", {"input": "重复"}),
        orjson.dumps({"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": {}}),
        orjson.dumps({"custom_id": "get", "method": "GET", "url": "/v1/embeddings", "body": {"input": "a"}}),
        orjson.dumps({"custom_id": "list-url", "method": "POST", "url": ["/v1/embeddings"], "body": {}}),
        b"",
        embeddings("number", {"input": 5}),
        embeddings("bad-format", {"input": "a", "encoding_format": "hex"}),
        embeddings("no-body", None),
        embeddings("ok-2", {"input": ["北京", "上海"], "encoding_format": "base64"}),
    ]
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "results.jsonl"
    assert main(batch_args(tiny_model_dir, requests, out)) == 3
    answers = read_output(out)
    assert [a["custom_id"] for a in answers] == [
        "ok-1", None, None, None, "ok-1", "chat", "get", "list-url", "number", "bad-format", "no-body", "ok-2",
    ]  # fmt: skip
    codes = [(a["response"]["status_code"], (a["error"] or {}).get("code")) for a in answers]
    assert codes == [
        (200, None),
        (400, "invalid_json"),
        (400, "invalid_request"),
        (400, "invalid_custom_id"),
        (400, "duplicate_custom_id"),
        (404, "unsupported_url"),
        (405, "method_not_allowed"),
        (404, "unsupported_url"),
        (422, None),
        (422, None),
        (422, None),
        (200, None),
    ]
    assert answers[1]["error"]["message"].startswith("line 2 is not JSON")
    assert answers[4]["error"]["message"].startswith("custom_id 'ok-1' is used by an earlier line")
    for answer, body in [(answers[8], {"input": 5}), (answers[9], {"input": "a", "encoding_format": "hex"})]:
        assert answer["response"]["body"] == client.post("/v1/embeddings", json=body).json()
    sent = {"input": ["北京", "上海"], "encoding_format": "base64"}
    assert answers[11]["response"]["body"] == client.post("/v1/embeddings", json=sent).json()


def test_a_body_is_spliced_into_its_record_as_the_route_wrote_it() -> None:
    line = Line(3, "c")
    body = b'{"data":[{"embedding":[0.1234567]}]}'
    got = orjson.loads(record(line, 200, body))
    id_, request_id = ids_of(line)
    assert got == {
        "id": id_,
        "custom_id": "c",
        "response": {"status_code": 200, "request_id": request_id, "body": orjson.loads(body)},
        "error": None,
    }
    assert body in record(line, 200, body)
    assert ids_of(Line(3, "c")) == ids_of(line) != ids_of(Line(4, "c"))


def test_the_urls_served_are_the_http_routes_of_the_batch_urls() -> None:
    routes = batch_routes()
    assert "/v1/embeddings" in routes
    assert set(routes) <= {"/v1/embeddings", "/v1/rerank", "/v2/embed"}


def test_a_line_only_the_stdlib_reads_reaches_the_route_as_it_was_written(tmp_path: Path) -> None:
    from app.bulk.openai_batch import read_lines

    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(
        b'{"custom_id": "nan", "url": "/v1/embeddings", "body": {"input": "a", "dimensions": NaN}}\n'
        b'{"custom_id": 123456789012345678901234567890, "url": "/v1/embeddings", "body": {}}\n'
    )
    nan, big = read_lines(requests, batch_routes())
    assert nan.error is None and nan.body == b'{"input": "a", "dimensions": NaN}'
    assert big.custom_id is None and big.error is not None and big.error[1] == "invalid_custom_id"


def test_cohere_embed_and_rerank_lines_are_answered_by_their_routes(
    tiny_model_dir: Path, tmp_path: Path, client: httpx.Client
) -> None:
    assert {"/v1/embeddings", "/v1/rerank", "/v2/embed"} <= set(batch_routes())
    embed = {"texts": ["北京", "上海"], "embedding_types": ["float", "int8"], "input_type": "search_document"}
    rerank = {
        "query": "北京的天气",
        "documents": ["北京今天晴", "上海下雨了"],
    }  # the tiny embedder: no reranker
    lines = [
        orjson.dumps({"custom_id": "embed", "method": "POST", "url": "/v2/embed", "body": embed}),
        orjson.dumps({"custom_id": "rerank", "method": "POST", "url": "/v1/rerank", "body": rerank}),
    ]
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "results.jsonl"
    assert main(batch_args(tiny_model_dir, requests, out)) == 3  # the rerank line's 4xx
    embedded, reranked = read_output(out)
    direct = client.post("/v2/embed", json=embed)
    assert embedded["response"]["status_code"] == direct.status_code == 200
    assert embedded["response"]["body"]["embeddings"]["int8"] == direct.json()["embeddings"]["int8"]
    assert embedded["response"]["body"]["embeddings"]["float"] == direct.json()["embeddings"]["float"]
    refused = client.post("/v1/rerank", json=rerank)
    assert 400 <= refused.status_code < 500
    assert reranked["response"]["status_code"] == refused.status_code
    assert reranked["response"]["body"] == refused.json()
