"""A Hugging Face hub mirror on loopback for the tests: one repository served from a local folder through
the URL layout huggingface_hub reads from ``HF_ENDPOINT`` (what hf-mirror.com and other mirrors serve).

Only what ``list_repo_files`` and ``snapshot_download`` ask for: the file tree, the revision's info and
``/{repo}/resolve/{revision}/{file}`` (HEAD and GET). Every request path is kept in :attr:`requests`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubMirror:
    """Serves ``folder``'s files as the hub repository ``repo_id`` at every revision (commit ``COMMIT``);
    a context manager; :attr:`endpoint` is what ``HF_ENDPOINT`` names."""

    def __init__(self, repo_id: str, folder: Path) -> None:
        self.repo_id = repo_id
        self.files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
        self.requests: list[str] = []
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                mirror._answer(self, body=True)

            def do_HEAD(self) -> None:
                mirror._answer(self, body=False)

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

    def _answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(handler.path).path)
        self.requests.append(f"{handler.command} {path}")
        api = f"/api/models/{self.repo_id}/"
        resolve = f"/{self.repo_id}/resolve/"
        if path.startswith(api + "tree/"):
            tree = [
                {"type": "file", "path": name, "size": file.stat().st_size, "oid": _sha1(file)}
                for name, file in self.files.items()
            ]
            self._send(handler, 200, json.dumps(tree).encode(), body, {"Content-Type": "application/json"})
        elif path.startswith(api + "revision/"):
            info = {"id": self.repo_id, "sha": COMMIT, "siblings": [{"rfilename": n} for n in self.files]}
            self._send(handler, 200, json.dumps(info).encode(), body, {"Content-Type": "application/json"})
        elif path.startswith(resolve) and (name := path[len(resolve) :].partition("/")[2]) in self.files:
            data = self.files[name].read_bytes()
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{_sha1(self.files[name])}"'}
            self._send(handler, 200, data, body, headers)
        else:
            self._send(handler, 404, b'{"error": "not found"}', body, {"X-Error-Code": "EntryNotFound"})

    @staticmethod
    def _send(
        handler: BaseHTTPRequestHandler, status: int, data: bytes, body: bool, headers: dict[str, str]
    ) -> None:
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)


def _sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()
