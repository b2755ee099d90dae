"""``python -m app``: load the model (refusing to start with one clear message if it cannot), then serve
with uvicorn on uvloop and httptools."""

from __future__ import annotations

import logging
import sys

import uvicorn

from app.main import create_app
from app.model.manifest import ManifestError
from app.model.runtime import load_model
from app.settings import Settings, SettingsError


def main(argv: list[str] | None = None) -> int:
    settings = Settings.from_cli(argv)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings.api_key_values()  # an unreadable keys file stops us before the model loads
        model = load_model(settings)
    except (ManifestError, SettingsError) as exc:
        print(f"zhembed: cannot start: {exc}", file=sys.stderr)
        return 2
    app = create_app(settings, model)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level,
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
