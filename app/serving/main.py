"""``python -m app``: check the model (refusing to start with one clear message if it cannot), then serve
it from one process or from ``--workers`` processes behind the one port (:mod:`app.serving.supervisor`,
also for one worker when ``worker_max_memory_mb`` bounds it), and shut down gracefully on SIGTERM or
SIGINT (:mod:`app.serving.server`).
"""

from __future__ import annotations

import logging
import sys

from app.model.manifest import ManifestError
from app.model.runtime import check_model, load_model
from app.serving import supervisor
from app.serving.cluster import resolve_count
from app.serving.factory import create_app
from app.serving.server import http_server
from app.settings import Settings, SettingsError
from app.telemetry import logs

log = logging.getLogger("app")


def main(argv: list[str] | None = None) -> int:
    settings = Settings.from_cli(argv)
    logs.configure(settings.log_format, settings.log_level.upper())
    try:
        settings.api_key_values()  # an unreadable keys file stops us before the model loads
        count = resolve_count(settings)
        # A bound on each worker's memory needs a supervisor to start the replacement, with one worker too.
        if count > 1 or settings.worker_max_memory_mb:
            folder, _, _ = check_model(settings)  # exported once, verified once, before any worker starts
            return supervisor.serve(settings.model_copy(update={"model": str(folder)}), count)
        model = load_model(settings)
    except (ManifestError, SettingsError) as exc:
        print(f"zhembed: cannot start: {exc}", file=sys.stderr)
        return 2
    http_server(create_app(settings, model), settings).run()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
