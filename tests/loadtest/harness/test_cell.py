"""loadtest.harness.cell: what a cell sends, and bodies of texts never sent before."""

from __future__ import annotations

import orjson

from loadtest.corpus import load_corpus
from loadtest.harness.cell import Cell, distinct_bodies, parse_cells


def test_every_request_carries_texts_never_sent_before() -> None:
    corpus = load_corpus()
    make = distinct_bodies(corpus, texts=32, start=0)
    texts: list[str] = []
    for n in range(2 * len(corpus) // 32 + 3):  # past the corpus's end, twice
        body, count = make(n)
        inputs = orjson.loads(body)["inputs"]
        assert count == len(inputs) == 32
        texts.extend(inputs)
    assert len(set(texts)) == len(texts)
    single, count = distinct_bodies(corpus, texts=1, start=5)(0)
    assert count == 1 and isinstance(orjson.loads(single)["inputs"], str)


def test_each_cell_sends_distinct_texts_in_its_encoding() -> None:
    corpus = load_corpus()
    seen: set[str] = set()
    sent = 0
    for spec, start in ((Cell(4, 32, "base64"), 0), (Cell(4, 1), 10_000_000)):
        make = distinct_bodies(corpus, spec.texts, start, spec.encoding)
        for n in range(2 * len(corpus) // spec.texts + 3):  # past the corpus's end, twice
            body, count = make(n)
            payload = orjson.loads(body)
            inputs = payload["inputs"] if spec.texts > 1 else [payload["inputs"]]
            assert count == len(inputs) == spec.texts
            assert payload.get("encoding", "float") == spec.encoding
            assert all(5 <= len(t) <= 120 for t in inputs)
            seen.update(inputs)
            sent += count
    assert len(seen) == sent  # not one text twice, across requests and cells


def test_cells_parse_as_clients_by_texts() -> None:
    assert parse_cells("8x32, 256x1") == [Cell(8, 32), Cell(256, 1)]
    assert [c.label for c in parse_cells("8x32")] == ["8x32"]
    assert Cell(256, 32, "base64").label == "256x32 base64"
    assert Cell(64, 32, urgency=7).headers == {"Priority": "u=7"} and Cell(8, 1).headers == {}


def test_a_rerank_cell_sends_a_query_and_its_documents_naming_its_model() -> None:
    corpus = load_corpus()
    make = distinct_bodies(corpus, 8, 0, route="/rerank", model="rerank")
    seen: list[str] = []
    for n in range(3):
        body, count = make(n)
        payload = orjson.loads(body)
        assert count == len(payload["texts"]) == 8 and payload["truncate"] is True
        assert payload["model"] == "rerank" and "inputs" not in payload
        seen += [payload["query"], *payload["texts"]]
    assert len(set(seen)) == len(seen) == 3 * 9  # the query is a text never sent before too
    single = orjson.loads(distinct_bodies(corpus, 1, 0, route="/token-classification", model="ner")(0)[0])
    assert isinstance(single["inputs"], str) and single["model"] == "ner"
