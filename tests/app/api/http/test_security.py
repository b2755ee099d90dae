"""The security properties SECURITY.md claims, each checked: keys on every data route (including routes
added later), the input limits, no pickle or eval on any load path, namespaced Redis keys, a non-root
container."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.routing import APIRoute
from pydantic import SecretStr

from app.api.auth import OPS_PATHS
from app.api.http.openai_routes import router as openai_router
from app.api.http.routes import router as data_router
from app.cache import keys as cache_keys
from app.settings import Settings
from tests.app.conftest import Running, serving

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def keyed(tiny_settings: Settings) -> Iterator[Running]:
    settings = tiny_settings.model_copy(update={"api_keys": SecretStr("the-only-key"), "warmup": False})
    with serving(settings) as running:
        yield running


def test_every_route_but_the_ops_ones_needs_a_key(keyed: Running) -> None:
    # Every documented operation, and every route of the routers (some are left out of the docs).
    routes = {
        (method.upper(), path)
        for path, operations in keyed.app.openapi()["paths"].items()
        for method in operations
    }
    routes |= {
        (method, r.path)
        for r in (*data_router.routes, *openai_router.routes)
        if isinstance(r, APIRoute)
        for method in r.methods or ()
    }
    data = sorted((method, path) for method, path in routes if path not in OPS_PATHS)
    assert len(data) >= 6  # embed, similarity, fill-mask, tokenize, info, both embeddings paths
    with httpx.Client(base_url=keyed.url, timeout=30) as client:
        for method, path in data:
            response = client.request(method, path, json={"inputs": "钥匙", "input": "钥匙"})
            assert response.status_code == 401, (method, path, response.status_code)


def test_a_request_with_the_key_passes(keyed: Running) -> None:
    with httpx.Client(base_url=keyed.url, timeout=30) as client:
        headers = {"Authorization": "Bearer the-only-key"}
        assert client.post("/embed", json={"inputs": "钥匙"}, headers=headers).status_code == 200


def test_limits_are_on_by_default() -> None:
    settings = Settings()
    assert settings.max_body_bytes <= 16 << 20
    assert settings.max_inputs_per_request <= 1024
    assert settings.max_input_chars <= 65536
    assert settings.max_concurrent_inputs <= 16384


FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "marshal", "shelve", "joblib", "yaml"}


def test_no_pickle_or_eval_in_the_service() -> None:
    problems = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in FORBIDDEN_CALLS
            ):
                problems.append(f"{path.name}:{node.lineno} calls {node.func.id}")
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                problems += [
                    f"{path.name}:{node.lineno} imports {n}"
                    for n in names
                    if n.split(".")[0] in FORBIDDEN_MODULES
                ]
            if isinstance(node, ast.keyword) and node.arg == "allow_pickle":
                problems.append(f"{path.name}:{node.lineno} passes allow_pickle")
    assert not problems, problems


def test_redis_keys_are_namespaced() -> None:
    prefix = cache_keys.space("0123456789abcdef", dict.fromkeys(cache_keys.OPTION_FIELDS, "x"))
    key = cache_keys.key(prefix, "文本")
    assert key.startswith(cache_keys.NAMESPACE + ":0123456789abcdef:")
    assert "文本" not in key  # texts are hashed, never stored in clear in a key


def test_the_container_runs_as_non_root() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", dockerfile, flags=re.MULTILINE)
    runtimes = [s for s in stages if re.match(r"\S+ AS runtime-", s)]
    assert len(runtimes) == 2
    for stage in runtimes:
        users = re.findall(r"^USER (\S+)", stage, flags=re.MULTILINE)
        assert users and users[-1].split(":")[0] not in {"0", "root"}, users
