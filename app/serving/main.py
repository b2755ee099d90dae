"""``python -m app``: check the model, or each of several (refusing to start with one clear message, naming
the model, if one cannot), then serve them from one process or from ``--workers`` processes behind the one port (:mod:`app.serving.supervisor`,
also for one worker when ``worker_max_memory_mb`` bounds it), and shut down gracefully on SIGTERM or
SIGINT (:mod:`app.serving.server`).
"""

from __future__ import annotations

import logging
import sys

from app.model.manifest import ManifestError
from app.model.runtime import check_models, load_models
from app.serving import supervisor
from app.serving.cluster import resolve_count
from app.serving.factory import create_app
from app.serving.server import http_server
from app.settings import Settings, SettingsError
from app.settings.models import with_sources
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
            folders = check_models(settings)  # exported once, verified once, before any worker starts
            return supervisor.serve(with_sources(settings, [str(f) for f in folders]), count)
        models = load_models(settings)
    except (ManifestError, SettingsError) as exc:
        print(f"zhembed: cannot start: {exc}", file=sys.stderr)
        return 2
    server = http_server(create_app(settings, models=models), settings)
    server.run()
    log.info("stopped, exit status %d", server.exit_status)
    return server.exit_status


if __name__ == "__main__":
    sys.exit(main())
