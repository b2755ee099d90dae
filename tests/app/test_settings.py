"""Settings: one frozen object from ZHEMBED_* variables and flags of the same names."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.settings import Settings, SettingsError


def test_environment_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZHEMBED_MAX_BATCH_TOKENS", "1234")
    monkeypatch.setenv("ZHEMBED_PROVIDERS", "CPUExecutionProvider")
    settings = Settings.from_cli(["--max-batch-size", "3", "--variant", "int8"])
    assert settings.max_batch_tokens == 1234
    assert settings.max_batch_size == 3 and settings.variant == "int8"
    assert settings.provider_list == ["CPUExecutionProvider"]
    assert settings.port == 8080 and settings.model == "bert-base-chinese"
    assert Settings.from_cli(["--max-batch-tokens", "99"]).max_batch_tokens == 99  # a flag wins


def test_frozen_and_validated() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.port = 1
    with pytest.raises(ValidationError):
        Settings(variant="bf16")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="never be admitted"):
        Settings(max_inputs_per_request=10, max_concurrent_inputs=5)


def test_served_model_name_is_a_name_or_left_to_the_model() -> None:
    assert Settings().served_model_name is None  # then the manifest's source names it
    assert Settings(served_model_name="bert-base-chinese").served_model_name == "bert-base-chinese"
    for bad in ("", "x" * 257):
        with pytest.raises(ValidationError):
            Settings(served_model_name=bad)


def test_help_is_the_field_descriptions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        Settings.from_cli(["--help"])
    out = capsys.readouterr().out
    assert "--max-batch-tokens" in out and "padding included" in out
    assert "--max-body-bytes" in out


def test_api_keys_from_a_list_or_a_file(tmp_path: Path) -> None:
    assert Settings().api_key_values() == ()
    assert Settings(api_keys=" a , b,,c ").api_key_values() == ("a", "b", "c")  # type: ignore[arg-type]
    path = tmp_path / "keys"
    path.write_text("# comment\nk1\nk2,k3\n\n")
    assert Settings(api_keys=f"@{path}").api_key_values() == ("k1", "k2", "k3")  # type: ignore[arg-type]
    assert "k1" not in repr(Settings(api_keys="k1"))  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [" , ", "@/nonexistent/keys"])
def test_unusable_api_keys_stop_start_up(value: str) -> None:
    with pytest.raises(SettingsError):
        Settings(api_keys=value).api_key_values()  # type: ignore[arg-type]


def test_an_api_key_may_carry_its_requests_default_urgency() -> None:
    settings = Settings(api_keys="bulk-key:u=7, live-key, a:b:u=0")  # type: ignore[arg-type]
    assert settings.api_key_entries() == (("bulk-key", 7), ("live-key", None), ("a:b", 0))
    assert settings.api_key_values() == ("bulk-key", "live-key", "a:b")


@pytest.mark.parametrize("entry", ["secret-key:u=8", "secret-key:u=", "secret-key:u=-1", "secret-key:u=x"])
def test_a_bad_key_urgency_stops_start_up_without_showing_the_key(entry: str) -> None:
    with pytest.raises(SettingsError, match="integer from 0 to 7") as caught:
        Settings(api_keys=entry).api_key_entries()  # type: ignore[arg-type]
    assert "secret-key" not in str(caught.value)
