"""The API keys setting (``api_keys``): keys given inline or in a file (``@path``), each with an optional
default urgency (``key:u=N``)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import SecretStr


class SettingsError(ValueError):
    """A setting that passed validation cannot be used (e.g. an unreadable keys file)."""


# A key's default urgency: the entry's last ":u=..." (a key may hold colons of its own).
_URGENCY_SUFFIX = re.compile(r"^(?P<key>.+):u=(?P<value>[^:]*)$")


def key_entries(api_keys: SecretStr | None) -> tuple[tuple[str, int | None], ...]:
    """Each key of ``api_keys`` with its default urgency, None where it names none; empty when keys are off.

    Raises:
        SettingsError: the file cannot be read, the setting names no keys, or a key's urgency is bad.
    """
    if api_keys is None:
        return ()
    raw = api_keys.get_secret_value().strip()
    if raw.startswith("@"):
        path = Path(raw[1:]).expanduser()
        try:
            raw = path.read_text()
        except OSError as exc:
            raise SettingsError(f"api-keys names {path}, which cannot be read: {exc.strerror}") from None
    lines = [line for line in raw.splitlines() if not line.lstrip().startswith("#")]
    entries = tuple(_key_entry(k.strip()) for line in lines for k in line.split(",") if k.strip())
    if not entries:
        raise SettingsError("api-keys is set but names no keys")
    return entries


def _key_entry(entry: str) -> tuple[str, int | None]:
    """``key`` or ``key:u=N`` as (key, urgency or None).

    Raises:
        SettingsError: the urgency is not an integer from 0 to 7 (the message never shows the key).
    """
    match = _URGENCY_SUFFIX.match(entry)
    if match is None:
        return entry, None
    value = match["value"]
    if not (value.isascii() and value.isdigit() and int(value) <= 7):
        raise SettingsError(
            f"an api-keys entry ends in :u={value!r}; the urgency must be an integer from 0 to 7"
        )
    return match["key"], int(value)
