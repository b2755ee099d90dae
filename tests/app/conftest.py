"""Fixtures for the service tests: a real server on the tiny exported model, and PyTorch references."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI

from app.main import create_app
from app.service import Service
from app.settings import Settings


@dataclass
class Running:
    app: FastAPI
    url: str

    @property
    def service(self) -> Service:
        return self.app.state.service


def start_server(settings: Settings) -> tuple[Running, uvicorn.Server, threading.Thread]:
    app = create_app(settings)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", loop="asyncio")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    running = Running(app, f"http://127.0.0.1:{port}")
    while httpx.get(running.url + "/ready").status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError("the test server did not get ready")
        time.sleep(0.02)
    return running, server, thread


@pytest.fixture(scope="session")
def tiny_settings(tiny_model_dir: Path) -> Settings:
    # Room for the 200-request concurrency test (~700 inputs) without 429s.
    return Settings(
        model=str(tiny_model_dir),
        variant="fp32",
        max_wait_ms=5,
        intra_op_threads=1,
        max_concurrent_inputs=2048,
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


@pytest.fixture(scope="session")
def tiny_model(tiny_settings: Settings) -> Any:
    from app.model.runtime import load_model

    return load_model(tiny_settings)
