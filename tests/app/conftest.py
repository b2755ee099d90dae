"""Fixtures for the service tests: a real server on the tiny exported model, and PyTorch references."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI
from pydantic import SecretStr

from app.serving.factory import create_app
from app.settings import Settings
from app.tasks.service import Service
from loadtest.server import RedisServer


@dataclass
class Running:
    app: FastAPI
    url: str

    @property
    def service(self) -> Service:
        return self.app.state.service


def start_server(
    settings: Settings, model: Any = None, models: Any = None
) -> tuple[Running, uvicorn.Server, threading.Thread]:
    """A real server on a free port; ``model``: an already loaded one (else loaded from ``settings``);
    ``models``: every model of a service of several, already loaded."""
    app = create_app(settings, model=model, models=models)
    # The keep-alive the service configures (app.serving.server.http_server), not uvicorn's 5 s: under
    # load a client reusing a connection as the server closes it for idleness gets a ReadError.
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        loop="asyncio",
        timeout_keep_alive=settings.keep_alive_s,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    running = Running(app, f"http://127.0.0.1:{port}")
    # Not through /ready: with API keys on it may need a key. Several models are marked ready together.
    while not (getattr(app.state, "service", None) is not None and app.state.service.ready):
        if time.monotonic() > deadline:
            raise RuntimeError("the test server did not get ready")
        time.sleep(0.02)
    return running, server, thread


def serve_model(folder: Path, variant: Any = "fp32", cache_bytes: int = 0) -> Iterator[Running]:
    """A real server on the model in ``folder`` while the caller iterates (a fixture's ``for ... yield``)."""
    running, uv, thread = start_server(
        Settings(
            model=str(folder), variant=variant, intra_op_threads=1, cache_bytes=cache_bytes, max_wait_ms=2
        )
    )
    yield running
    uv.should_exit = True
    thread.join(timeout=30)


@pytest.fixture(scope="session")
def tiny_settings(tiny_model_dir: Path) -> Settings:
    # Room for the 200-request concurrency test (~700 inputs) without 429s. No vector cache: these
    # tests check what the engine computes; the cache has its own servers (test_cache_service.py).
    return Settings(
        model=str(tiny_model_dir),
        variant="fp32",
        max_wait_ms=5,
        intra_op_threads=1,
        max_concurrent_inputs=2048,
        cache_bytes=0,
    )


@pytest.fixture(scope="session")
def server(tiny_settings: Settings) -> Iterator[Running]:
    running, uv, thread = start_server(tiny_settings)
    yield running
    uv.should_exit = True
    thread.join(timeout=30)


@pytest.fixture()
def client(server: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@dataclass
class TorchReference:
    """The same tiny model in PyTorch, fed by the Hugging Face tokenizer (not ours)."""

    model: Any
    tokenizer: Any

    def states(self, text: str, max_length: int | None = None) -> tuple[list[np.ndarray], np.ndarray]:
        """Hidden states of layers 1..L ([seq, hidden] each) and the pooler output of one text."""
        import torch

        enc = self.tokenizer(
            text, return_tensors="pt", truncation=max_length is not None, max_length=max_length
        )
        with torch.no_grad():
            out = self.model.bert(**enc, output_hidden_states=True)
        layers = [h[0].numpy() for h in out.hidden_states[1:]]
        return layers, out.pooler_output[0].numpy()

    def embed(
        self,
        text: str,
        pooling: str = "mean",
        layers: list[int] | None = None,
        combine: str = "concat",
        normalize: bool = True,
    ) -> np.ndarray:
        states, pooler = self.states(text)
        n = len(states)
        if pooling == "pooler":
            vector = pooler
        else:
            chosen = [(layer if layer > 0 else n + 1 + layer) for layer in (layers or [n])]
            pooled = [
                states[layer - 1][0] if pooling == "cls" else states[layer - 1].mean(axis=0)
                for layer in chosen
            ]
            vector = np.concatenate(pooled) if combine == "concat" else np.mean(pooled, axis=0)
        return vector / np.linalg.norm(vector) if normalize else vector


@pytest.fixture(scope="session")
def torch_ref(tiny_source_dir: Path) -> TorchReference:
    from transformers import BertForPreTraining, BertTokenizerFast

    model = BertForPreTraining.from_pretrained(tiny_source_dir).eval()
    return TorchReference(model, BertTokenizerFast.from_pretrained(tiny_source_dir))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


# A tagger's labels (BIO over people, places and organisations), for the tiny token classifier.
ENTITY_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]


def tiny_head_dir(
    factory: pytest.TempPathFactory, name: str, architecture: str, labels: list[str], seed: int, std: float
) -> Path:
    """A fine-tuned head of ``architecture`` on a tiny BERT of its own weights (``seed``), exported fp32."""
    from tests.checkpoints import export, save_head
    from tests.conftest import make_tiny_source

    base = make_tiny_source(factory.mktemp(f"{name}-base"), seed=seed)
    source = save_head(factory.mktemp(f"{name}-source"), base, architecture, labels, std=std)
    return export(source, factory.mktemp(name) / "model")


@pytest.fixture(scope="session")
def tiny_reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cross-encoder (one label)."""
    return tiny_head_dir(
        tmp_path_factory, "tiny-reranker", "BertForSequenceClassification", ["LABEL_0"], 21, 0.3
    )


@pytest.fixture(scope="session")
def tiny_tagger_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A token classifier of ``ENTITY_LABELS``."""
    return tiny_head_dir(
        tmp_path_factory, "tiny-tagger", "BertForTokenClassification", ENTITY_LABELS, 22, 1.0
    )


@pytest.fixture(scope="session")
def tiny_model(tiny_settings: Settings) -> Any:
    from app.model.runtime import load_model

    return load_model(tiny_settings)


# --- Redis and extra servers -------------------------------------------------------------------------


def wait_until(condition: Callable[[], bool], seconds: float = 30.0, every: float = 0.02) -> None:
    """Poll ``condition`` until it holds; fail the test after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {seconds} s"
        time.sleep(every)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One Redis for the tests that only read and write it (keys never collide across tests' texts)."""
    proc = RedisServer().start()
    yield proc
    proc.stop()


@pytest.fixture()
def own_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own, which it may stop and restart."""
    proc = RedisServer().start()
    yield proc
    proc.stop()


@contextmanager
def serving(settings: Settings, model: Any = None, models: Any = None) -> Iterator[Running]:
    """A real server for ``settings`` (on ``model``, or ``models``, if given), stopped on exit."""
    running, uv, thread = start_server(settings, model, models)
    try:
        yield running
    finally:
        uv.should_exit = True
        thread.join(timeout=30)


def samples(client: httpx.Client, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample called ``name`` on /metrics (parsed with prometheus_client), by sorted labels."""
    from prometheus_client.parser import text_string_to_metric_families

    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def metric(client: httpx.Client, name: str, **labels: str) -> float:
    """One sample's value on /metrics; 0 when the series does not exist yet."""
    return samples(client, name).get(tuple(sorted(labels.items())), 0.0)


def total(client: httpx.Client, name: str) -> float:
    """The sum of every sample called ``name`` (e.g. a gauge over all its urgencies).

    Raises:
        AssertionError: there is no such sample at all (a sum of nothing would prove nothing).
    """
    found = samples(client, name)
    assert found, f"no {name} on /metrics"
    return sum(found.values())


def with_cache(settings: Settings, redis_url: str | None, **changes: Any) -> Settings:
    """``settings`` with the in-process cache on, Redis at ``redis_url`` (None: none), no warm-up. A Redis
    call times out after 10 s, not the service's 50 ms: a loaded test machine must not turn a hit into a
    miss (the tests of a slow or stalled Redis set the 50 ms themselves)."""
    url = SecretStr(redis_url) if redis_url is not None else None
    update = {"cache_bytes": 64 << 20, "redis_url": url, "warmup": False, "redis_timeout_ms": 10_000.0}
    return settings.model_copy(update={**update, **changes})


def gate_inference(monkeypatch: pytest.MonkeyPatch, running: Running) -> threading.Event:
    """Make every batch wait for the returned event before it runs."""
    model = running.service.model
    original: Callable[..., list[np.ndarray]] = model.encode
    gate = threading.Event()

    def gated(*args: Any, **kwargs: Any) -> list[np.ndarray]:
        assert gate.wait(timeout=120), "the test never opened the gate"
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "encode", gated)
    return gate
