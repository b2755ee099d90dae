"""Find the model folder for ``--model``: a folder with a manifest, or an export made on first use.

A hub id, a ``modelscope:ORG/NAME`` id (or a plain Hugging Face folder) is exported into ``--cache-dir`` by running the exporter as a
subprocess: the service process never imports torch. The subprocess inherits the environment untouched,
so ``HF_ENDPOINT`` (a hub mirror), ``HF_HUB_OFFLINE``, ``HF_HOME`` and ``MODELSCOPE_CACHE`` reach the
libraries that read them. An export there of an older schema is ours: it is
exported again. A folder the user exported is not ours to rewrite: it is refused with the command that
re-exports it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import subprocess
import sys
from pathlib import Path

from app.model.manifest import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    ManifestError,
    OutdatedManifestError,
    check_schema,
)

log = logging.getLogger(__name__)

# The exporter's exit statuses for faults the user can act on (one line on stderr says which): the
# service answers each with what to do in its own terms.
EXIT_EXPORT_ERROR = 2
EXIT_HUB_UNREACHABLE = 3
# ``--model modelscope:ORG/NAME``: the checkpoint comes from ModelScope (modelscope.cn), not the hub.
MODELSCOPE_PREFIX = "modelscope:"


def cache_folder(model: str, revision: str | None, cache_dir: Path) -> Path:
    """Where an export of ``model`` at ``revision`` lives: readable, and unique per source."""
    key = f"{model}@{revision or 'default'}"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", key).strip("-")[-80:]
    return cache_dir / f"{slug}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def resolve_model(model: str, revision: str | None, cache_dir: Path) -> Path:
    """The folder holding ``manifest.json`` for ``model``, exporting it first when needed.

    Raises:
        OutdatedManifestError: ``model`` is an exported folder of an older schema (the message gives the
            command that exports it again).
        ManifestError: the exporter failed or is not installed (its last line of output says why).
    """
    given = Path(model).expanduser()
    if (given / MANIFEST_NAME).is_file():
        check_schema(given)
        return given
    out = cache_folder(str(given.resolve()) if given.is_dir() else model, revision, cache_dir)
    command = [sys.executable, "-m", "export", "--model", model, "--out", str(out)]
    if revision:
        command += ["--revision", revision]
    if (out / MANIFEST_NAME).is_file():
        try:
            check_schema(out)
        except OutdatedManifestError as old:
            # --force: an outdated folder must never pass for up to date, whatever the exporter checks.
            command.append("--force")
            log.info(
                "the export in %s has schema_version %d, older than this build's %d; exporting it again: %s",
                out,
                old.found,
                SCHEMA_VERSION,
                " ".join(command),
            )
        else:
            return out
    else:
        log.info("no exported model for %s; exporting into %s: %s", model, out, " ".join(command))
    out.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == EXIT_HUB_UNREACHABLE and model.startswith(MODELSCOPE_PREFIX):
        raise ManifestError(
            f"cannot reach ModelScope to fetch {model.removeprefix(MODELSCOPE_PREFIX)}, and it is not in the "
            "local modelscope cache (MODELSCOPE_CACHE). Point ZHEMBED_MODEL at a local copy of the model (a "
            "folder with config.json, the weights and vocab.txt; it is exported on first use), or at its hub "
            "id with HF_ENDPOINT naming a reachable hub mirror"
        )
    if done.returncode == EXIT_HUB_UNREACHABLE:
        raise ManifestError(
            f"cannot reach the Hugging Face hub to fetch {model}, and it is not in the local Hugging Face "
            "cache. Point ZHEMBED_MODEL at a local copy of the model (a folder with config.json, the weights "
            "and vocab.txt; it is exported on first use), e.g. ZHEMBED_MODEL=/path/to/bert-base-chinese make "
            "serve; or fetch it through a hub mirror (HF_ENDPOINT=https://MIRROR) or from ModelScope "
            "(ZHEMBED_MODEL=modelscope:ORG/NAME); or try the service on random weights of the same shape: "
            "make serve-twin"
        )
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        last = lines[-1] if lines else f"exit status {done.returncode}"
        hint = (
            "point ZHEMBED_MODEL at a local checkpoint folder or an exported one"
            if done.returncode == EXIT_EXPORT_ERROR  # the exporter's own one-line answer says what is wrong
            else "install the export extra (pip install 'zhembed[export]') or point ZHEMBED_MODEL at an exported folder"
        )
        raise ManifestError(f"exporting {model} failed ({last}); {hint}")
    if not (out / MANIFEST_NAME).is_file():
        raise ManifestError(f"the exporter finished but wrote no {MANIFEST_NAME} into {out}")
    return out
