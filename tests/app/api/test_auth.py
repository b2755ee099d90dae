"""API keys: off by default; when on, data routes need a Bearer key, ops routes only if configured."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from pydantic import SecretStr

from app.api.auth import ApiKeys
from app.settings import Settings
from tests.app.conftest import Running, metric, serving

KEYS = ("key-one-Ab3", "key-two-Cd4")


@pytest.fixture(scope="module")
def keyed(tiny_settings: Settings) -> Iterator[Running]:
    settings = tiny_settings.model_copy(update={"api_keys": SecretStr(",".join(KEYS)), "warmup": False})
    with serving(settings) as running:
        yield running


def test_off_by_default(client: httpx.Client) -> None:
    assert client.post("/embed", json={"inputs": "无钥匙"}).status_code == 200


def test_data_routes_need_a_known_key(keyed: Running) -> None:
    with httpx.Client(base_url=keyed.url, timeout=30) as client:
        for headers, words in [
            ({}, "no API key"),
            ({"Authorization": "Basic abc"}, "malformed"),
            ({"Authorization": "Bearer wrong-key"}, "unknown API key"),
            ({"Authorization": f"Bearer {KEYS[0]}x"}, "unknown API key"),
        ]:
            response = client.post("/embed", json={"inputs": "钥匙"}, headers=headers)
            assert response.status_code == 401, headers
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["error_type"] == "unauthorized" and words in response.json()["error"]
            assert "wrong-key" not in response.text
        for key in KEYS:
            ok = client.post("/embed", json={"inputs": "钥匙"}, headers={"Authorization": f"Bearer {key}"})
            assert ok.status_code == 200
        assert client.post("/nope").status_code == 401  # unknown routes reveal nothing either
        assert metric(client, "zhembed_failures_total", reason="unauthorized") == 5


def test_ops_routes_stay_open_by_default(keyed: Running) -> None:
    with httpx.Client(base_url=keyed.url, timeout=30) as client:
        for path in ("/health", "/ready", "/metrics", "/openapi.json"):
            assert client.get(path).status_code == 200, path


def test_openai_client_with_and_without_the_key(keyed: Running) -> None:
    good = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEYS[1], max_retries=0)
    assert len(good.embeddings.create(model="m", input="开放接口").data) == 1
    bad = openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.embeddings.create(model="m", input="开放接口")
    assert caught.value.type == "authentication_error" and caught.value.code == "unauthorized"


def test_keys_from_a_file_and_ops_routes_locked(tiny_settings: Settings, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# ops team\nfile-key-1\nfile-key-2, file-key-3\n")
    settings = tiny_settings.model_copy(
        update={"api_keys": SecretStr(f"@{keys}"), "auth_ops_routes": True, "warmup": False}
    )
    with serving(settings) as running, httpx.Client(base_url=running.url, timeout=30) as client:
        assert client.get("/metrics").status_code == 401
        auth = {"Authorization": "Bearer file-key-3"}
        assert client.get("/metrics", headers=auth).status_code == 200
        assert client.get("/health", headers=auth).status_code == 200


def test_every_key_is_compared() -> None:
    keys = ApiKeys(KEYS)
    assert keys.check(f"Bearer {KEYS[0]}".encode()) == (None, None)
    assert keys.check(f"Bearer {KEYS[1]}".encode()) == (None, None)
    assert keys.check(b"Bearer ")[0] is not None
    assert keys.check(f"Bearer {KEYS[0][:-1]}".encode())[0] == "unknown API key"


def test_the_check_says_what_is_missing_or_wrong() -> None:
    keys = ApiKeys(KEYS)
    assert keys.check(None) == ("no API key: send the header Authorization: Bearer <key>", None)
    for malformed in (b"Basic abc", b"Bearer", b"Bearer   ", KEYS[0].encode()):
        problem, _ = keys.check(malformed)
        assert problem == "malformed Authorization header: send Authorization: Bearer <key>", malformed
    assert keys.check(b"Bearer wrong-key") == ("unknown API key", None)
    assert keys.check(f"bearer  {KEYS[0]} ".encode()) == (
        None,
        None,
    )  # the scheme in any case, spaces trimmed


def test_a_valid_key_gives_its_default_urgency_and_only_a_valid_one() -> None:
    keys = ApiKeys.from_entries((("bulk-key", 7), ("live-key", None)))
    assert keys.check(b"Bearer bulk-key") == (None, 7)
    assert keys.check(b"Bearer live-key") == (None, None)
    assert keys.check(b"Bearer bulk-ke") == ("unknown API key", None)


def test_a_keys_default_urgency_applies_where_the_request_sets_none(tiny_settings: Settings) -> None:
    settings = tiny_settings.model_copy(
        update={"api_keys": SecretStr("bulk-key:u=7,live-key"), "warmup": False}
    )
    with serving(settings) as running, httpx.Client(base_url=running.url, timeout=30) as client:
        for key, headers in [
            ("bulk-key", {}),
            ("bulk-key", {"Priority": "u=1"}),
            ("live-key", {}),
            ("live-key", {"Priority": "u=7"}),
        ]:
            sent = {"Authorization": f"Bearer {key}", **headers}
            assert client.post("/embed", json={"inputs": "紧急"}, headers=sent).status_code == 200
        counted = {
            u: metric(
                client, "zhembed_requests_total", route="/embed", status="200", protocol="http", urgency=u
            )
            for u in ("1", "3", "7")
        }
        assert counted == {"1": 1.0, "3": 1.0, "7": 2.0}
        assert running.service.engine.batcher.stats.by_urgency[7] == 2  # the engine ran them at 7
