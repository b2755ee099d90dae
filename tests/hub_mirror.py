"""Model hubs on loopback for the tests: one repository served from a local folder through the URL layout
that a hub's own client reads from its endpoint variable.

- :class:`HubMirror`: the Hugging Face hub as ``huggingface_hub`` reads it from ``HF_ENDPOINT`` (what
  hf-mirror.com and other mirrors serve): the file tree, the revision's info and
  ``/{repo}/resolve/{revision}/{file}`` (HEAD and GET).
- :class:`ModelScopeMirror`: ModelScope as ``modelscope``'s ``snapshot_download`` reads it from
  ``MODELSCOPE_ENDPOINT``: ``/api/v1/models/{repo}/repo/files`` and ``/api/v1/models/{repo}/repo?FilePath=``.

Only what those clients ask for to download a snapshot; anything else is a 404. Every request is kept in
``requests`` as ``"METHOD /path?query"``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
Answer = tuple[int, bytes, dict[str, str]]


class _LoopbackRepo:
    """Serves ``folder``'s files as the repository ``repo_id``; a context manager; :attr:`endpoint` is the
    URL the client's endpoint variable names."""

    def __init__(self, repo_id: str, folder: Path) -> None:
        self.repo_id = repo_id
        self.files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
        self.requests: list[str] = []
        repo = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                repo._reply(self, body=True)

            def do_HEAD(self) -> None:
                repo._reply(self, body=False)

            def log_message(self, format: str, *args: object) -> None:  # quiet
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, path: str, query: dict[str, list[str]]) -> Answer:
        raise NotImplementedError

    def _reply(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        url = urlsplit(handler.path)
        self.requests.append(f"{handler.command} {unquote(handler.path)}")
        status, data, headers = self._answer(unquote(url.path), parse_qs(url.query))
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)


class HubMirror(_LoopbackRepo):
    """The Hugging Face hub's layout: every revision is commit ``COMMIT``."""

    def _answer(self, path: str, query: dict[str, list[str]]) -> Answer:
        api = f"/api/models/{self.repo_id}/"
        resolve = f"/{self.repo_id}/resolve/"
        if path.startswith(api + "tree/"):
            tree = [
                {"type": "file", "path": name, "size": file.stat().st_size, "oid": _digest(file, "sha1")}
                for name, file in self.files.items()
            ]
            return 200, json.dumps(tree).encode(), {"Content-Type": "application/json"}
        if path.startswith(api + "revision/"):
            info = {"id": self.repo_id, "sha": COMMIT, "siblings": [{"rfilename": n} for n in self.files]}
            return 200, json.dumps(info).encode(), {"Content-Type": "application/json"}
        if path.startswith(resolve) and (name := path[len(resolve) :].partition("/")[2]) in self.files:
            file = self.files[name]
            return 200, file.read_bytes(), {"X-Repo-Commit": COMMIT, "ETag": f'"{_digest(file, "sha1")}"'}
        return 404, b'{"error": "not found"}', {"X-Error-Code": "EntryNotFound"}


class ModelScopeMirror(_LoopbackRepo):
    """ModelScope's layout (its ``/api/v1`` file listing and file route): every revision serves the same
    files."""

    def _answer(self, path: str, query: dict[str, list[str]]) -> Answer:
        repo = f"/api/v1/models/{self.repo_id}/repo"
        json_type = {"Content-Type": "application/json"}
        if path == repo + "/files":
            listing = [
                {
                    "Path": n,
                    "Name": n,
                    "Type": "blob",
                    "Size": f.stat().st_size,
                    "Sha256": _digest(f, "sha256"),
                }
                for n, f in self.files.items()
            ]
            return 200, json.dumps({"Code": 200, "Data": {"Files": listing}}).encode(), json_type
        if path == repo and (name := query.get("FilePath", [""])[0]) in self.files:
            return 200, self.files[name].read_bytes(), {"Content-Type": "application/octet-stream"}
        return 404, json.dumps({"Code": 404, "Message": f"not found: {path}"}).encode(), json_type


def _digest(path: Path, name: str) -> str:
    return hashlib.new(name, path.read_bytes()).hexdigest()
