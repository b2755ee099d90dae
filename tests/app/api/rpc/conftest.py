"""The client side of the gRPC tests: stubs generated now from the project's protos, as a user of
text-embeddings-inference's proto would generate theirs.

The server runs in a process of its own (:mod:`tests.app.api.rpc.grpc_process`): its generated modules
and these define the same protobuf symbols, which cannot meet in one descriptor pool. So no test in this
process imports ``app.api.rpc.proto``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.app.api.rpc.grpc_process import Server, start_grpc_server, stop_grpc_server

PROTOS = Path(__file__).resolve().parents[4] / "app" / "api" / "rpc" / "proto"


@pytest.fixture(scope="session")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModuleType]:
    """tei_pb2, tei_pb2_grpc, zhembed_pb2, zhembed_pb2_grpc, generated now from app/api/rpc/proto."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("grpc-client")
    code = protoc.main(
        [
            "protoc",
            f"-I{PROTOS}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(PROTOS / "tei.proto"),
            str(PROTOS / "zhembed.proto"),
        ]
    )
    assert code == 0
    sys.path.insert(0, str(out))
    try:
        return {
            n: importlib.import_module(n)
            for n in ("tei_pb2", "tei_pb2_grpc", "zhembed_pb2", "zhembed_pb2_grpc")
        }
    finally:
        sys.path.remove(str(out))


@pytest.fixture(scope="session")
def server(tiny_model_dir: Path) -> Iterator[Server]:
    """``python -m app`` with gRPC on the tiny plain BERT (not trained for shorter vectors), no cache."""
    running = start_grpc_server(tiny_model_dir, ZHEMBED_SHUTDOWN_DRAIN_S="0.2")
    yield running
    stop_grpc_server(running)


@pytest.fixture(scope="session")
def matryoshka_server(matryoshka_model_dir: Path) -> Iterator[Server]:
    """``python -m app`` with gRPC on the tiny BERT whose config lists Matryoshka widths, with a cache."""
    running = start_grpc_server(matryoshka_model_dir, ZHEMBED_CACHE_BYTES=str(8 << 20))
    yield running
    stop_grpc_server(running)
