"""No request within the limits holds the event loop (issue 50): each route's heaviest allowed request is
held at its heavy step, and /health on the same worker answers while it is held.

Structural, not timed: a step that ran on the event loop would hold the loop while held, so /health
could not answer before the test lets the step go (``python -m loadtest.loop_lag`` measures the time).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

import app.api.http.routes
import app.tasks.entities
import app.tasks.tokens
from tests.app.conftest import Running, metric, serve_model, wait_until

# What the test waits for /health: a loop held by the step waits as long as the step is held (60 s).
HEALTH_TIMEOUT_S = 10.0

FILL_MASK = {
    "inputs": ["北京是中国的首都" + "[MASK]" * 64] * 2,
    "top_k": 50,
}  # 128 masks (tiny model: 128 tokens)
TOKENIZE = {"inputs": ["北" * 1000] * 64}  # 64,128 tokens, within max_tokenize_tokens
EMBED_ALL = {"inputs": ["北" * 126] * 32}  # 4,032 token vectors, within max_embed_all_tokens
TAGGED = {"inputs": ["李雷在北京大学读书" * 14] * 64}  # 64 inputs of 126 tokens


@dataclass
class Held:
    """A function made to wait, where it is called, until the test releases it."""

    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


def hold(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> Held:
    """``owner.name`` (a module's function or an object's method) held at its first call."""
    held = Held()
    original: Callable[..., Any] = getattr(owner, name)

    def waiting(*args: Any, **kwargs: Any) -> Any:
        held.entered.set()
        assert held.release.wait(60), "the test never released the held step"
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, waiting)
    return held


def health_answers_while_held(running: Running, held: Held, path: str, body: Any) -> None:
    """POST ``body`` to ``path``; once it is held, /health answers (and the POST is still in flight);
    released, the POST answers 200."""
    with ThreadPoolExecutor(1) as pool:
        heavy = pool.submit(httpx.post, running.url + path, json=body, timeout=120)
        try:
            assert held.entered.wait(60), f"{path} never reached the held step"
            health = httpx.get(running.url + "/health", timeout=HEALTH_TIMEOUT_S)
            assert health.status_code == 200
            assert not heavy.done()
        finally:
            held.release.set()
        answer = heavy.result()
    assert answer.status_code == 200, answer.text


def test_fill_mask_writes_its_candidates_beside_the_loop(
    server: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = hold(monkeypatch, server.service.model.tokenizer, "decode")  # each candidate's token_str
    health_answers_while_held(server, held, "/fill-mask", FILL_MASK)


def test_tokenize_builds_its_table_beside_the_loop(server: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    held = hold(monkeypatch, app.tasks.tokens, "token_table")
    health_answers_while_held(server, held, "/tokenize", TOKENIZE)


def test_embed_all_combines_its_vectors_beside_the_loop(
    server: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = hold(monkeypatch, app.tasks.tokens, "token_vectors")
    health_answers_while_held(server, held, "/embed_all", EMBED_ALL)


@pytest.mark.parametrize(("path", "body"), [("/fill-mask", FILL_MASK), ("/embed_all", EMBED_ALL)])
def test_large_answers_are_encoded_beside_the_loop(
    server: Running, monkeypatch: pytest.MonkeyPatch, path: str, body: Any
) -> None:
    held = hold(monkeypatch, app.api.http.routes, "json_pieces")
    health_answers_while_held(server, held, path, body)


@pytest.fixture(scope="module")
def tagger(tiny_tagger_dir: Path) -> Iterator[Running]:
    yield from serve_model(tiny_tagger_dir)


def test_token_classification_groups_entities_beside_the_loop(
    tagger: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = hold(monkeypatch, app.tasks.entities, "entities")
    health_answers_while_held(tagger, held, "/token-classification", TAGGED)


# Each route's heaviest allowed request on the tiny model (128 tokens a sequence), held at inference.
HEAVIEST = {
    "/embed": {"inputs": ["北京" * 4096] * 64, "long_text": "chunk"},  # 64 × 8192 characters, 4,160 windows
    "/": {"inputs": ["北" * 126] * 64},
    "/similarity": {"inputs": {"source_sentence": "北" * 126, "sentences": ["京" * 126] * 63}},
    "/v1/embeddings": {"input": ["北" * 126] * 64},
    "/embed_all": EMBED_ALL,
    "/fill-mask": FILL_MASK,
}


@pytest.mark.parametrize("path", list(HEAVIEST))
def test_health_answers_while_the_heaviest_request_runs(
    server: Running, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    held = hold(monkeypatch, server.service.model, "encode")
    health_answers_while_held(server, held, path, HEAVIEST[path])


def test_a_client_that_leaves_tokenize_stops_its_work(
    server: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = hold(monkeypatch, app.tasks.tokens, "token_table")
    body = orjson.dumps(TOKENIZE)
    host, port = server.url.removeprefix("http://").split(":")
    with httpx.Client(base_url=server.url, timeout=60) as client:
        before = metric(client, "zhembed_failures_total", reason="client_closed")
        try:
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(
                    b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                assert held.entered.wait(60), "/tokenize never reached its table"
            # Gone while its answer is built: its request is cancelled and counted, not left to finish.
            wait_until(lambda: metric(client, "zhembed_failures_total", reason="client_closed") == before + 1)
        finally:
            held.release.set()
