"""A stand-in for the Hugging Face hub: a local HTTP server with the hub's HTTP layout.

The one test double of the hub download tests, because the public hub is out of reach here. It serves
what ``huggingface_hub`` (2.4) calls to download a model, with the headers and error codes the real hub
sends:

- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}`` (``?blobs=true``: sizes, blob ids,
  LFS sha256): id, sha, gated, siblings.
- ``GET /api/models/{repo}/tree/{rev}?recursive=true``: the file listing.
- ``HEAD`` / ``GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag`` (git blob id), for LFS files
  ``X-Linked-Etag`` (sha256) and ``X-Linked-Size``, ``Content-Length``; the body on GET.
- errors as the hub reports them, by ``X-Error-Code``: ``RepoNotFound`` (401 without a token, else 404),
  ``RevisionNotFound`` and ``EntryNotFound`` (404), ``GatedRepo`` (401 without a token, 403 with a token not
  granted access); an unknown token gets 401 "Invalid credentials in Authorization header" everywhere.

Like the hub, a gated repository's metadata and listing are public; its files need a granted token.
Every request is recorded in ``requests`` (method, path) so tests can count downloads.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from urllib.parse import parse_qs, unquote, urlsplit

_LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".onnx", ".model", ".pth")
_LFS_MIN_SIZE = 10 * 1024 * 1024  # the hub stores files above 10 MB with LFS


@dataclass(frozen=True)
class _File:
    path: str
    data: bytes

    @property
    def git_oid(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()

    @property
    def lfs(self) -> bool:
        return self.path.endswith(_LFS_SUFFIXES) or len(self.data) >= _LFS_MIN_SIZE

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class _Repo:
    repo_id: str
    files: dict[str, _File]
    gated: bool
    branches: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit

    @property
    def commit(self) -> str:
        digest = hashlib.sha1(self.repo_id.encode())
        for name in sorted(self.files):
            digest.update(name.encode() + self.files[name].git_oid.encode())
        return digest.hexdigest()

    def resolve(self, revision: str) -> str | None:
        if revision == self.commit:
            return revision
        return self.branches.get(revision)


class HubStandIn:
    """``with HubStandIn() as hub: hub.add_repo("org/name", model_dir)``; ``hub.url`` is HF_ENDPOINT."""

    def __init__(self) -> None:
        self.repos: dict[str, _Repo] = {}
        self.tokens: dict[str, set[str]] = {}  # token -> gated repos it was granted
        self.requests: list[tuple[str, str]] = []
        self.seconds_per_mb = 0.0  # > 0: file bodies are sent slowly, 1 MB at a time
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(self, repo_id: str, source: Path | dict[str, bytes], *, gated: bool = False) -> str:
        """Serve directory ``source`` (or a name -> content map) at branch main; returns the commit."""
        if isinstance(source, Path):
            content = {
                p.relative_to(source).as_posix(): p.read_bytes() for p in source.rglob("*") if p.is_file()
            }
        else:
            content = dict(source)
        repo = _Repo(repo_id, {name: _File(name, data) for name, data in content.items()}, gated)
        repo.branches["main"] = repo.commit
        self.repos[repo_id] = repo
        return repo.commit

    def add_token(self, token: str, *, granted: tuple[str, ...] = ()) -> None:
        """A valid token, granted access to the gated repositories named."""
        self.tokens[token] = set(granted)

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _handler(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet: tests read `requests`
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, *, body: bool) -> None:
            url = urlsplit(self.path)
            path = unquote(url.path)
            with hub._lock:
                hub.requests.append((self.command, path))
            token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip() or None
            if token is not None and token not in hub.tokens:
                return self._error(401, None, "Invalid credentials in Authorization header", body=body)
            if path.startswith("/api/models/"):
                return self._api(path.removeprefix("/api/models/"), parse_qs(url.query), body=body)
            parts = path.lstrip("/").split("/", 4)
            if len(parts) == 5 and parts[2] == "resolve":
                return self._resolve(f"{parts[0]}/{parts[1]}", unquote(parts[3]), parts[4], token, body=body)
            self._error(404, None, "Not found", body=body)

        def _repo(self, repo_id: str, *, body: bool) -> _Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                authenticated = self.headers.get("Authorization") is not None
                self._error(404 if authenticated else 401, "RepoNotFound", "Repository not found", body=body)
            return repo

        def _api(self, rest: str, query: dict[str, list[str]], *, body: bool) -> None:
            org, _, rest = rest.partition("/")
            name, _, rest = rest.partition("/")
            repo = self._repo(f"{org}/{name}", body=body)
            if repo is None:
                return
            kind, _, revision = rest.partition("/")
            revision = unquote(revision) or "main"
            commit = repo.resolve(revision)
            if commit is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", body=body)
            if kind == "tree":
                return self._json(_tree(repo), body=body)
            blobs = query.get("blobs") == ["true"] or query.get("blobs") == ["True"]
            siblings = [_sibling(f, blobs=blobs) for f in repo.files.values()]
            doc = {
                "id": repo.repo_id,
                "sha": commit,
                "private": False,
                "gated": "auto" if repo.gated else False,
            }
            self._json(doc | {"siblings": siblings}, body=body)

        def _resolve(self, repo_id: str, revision: str, name: str, token: str | None, *, body: bool) -> None:
            repo = self._repo(repo_id, body=body)
            if repo is None:
                return
            commit = repo.resolve(revision)
            if commit is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", body=body)
            if repo.gated and (token is None or repo_id not in hub.tokens[token]):
                message = (
                    f"Access to model {repo_id} is restricted. You must have access to it and be "
                    "authenticated"
                    if token is None
                    else f"Access to model {repo_id} is restricted and you are not in the authorized list"
                )
                return self._error(401 if token is None else 403, "GatedRepo", message, body=body)
            served = repo.files.get(name)
            if served is None:
                return self._error(404, "EntryNotFound", f"{name} does not exist", body=body, commit=commit)
            headers = {"X-Repo-Commit": commit, "ETag": f'"{served.git_oid}"', "Accept-Ranges": "none"}
            if served.lfs:
                headers |= {"X-Linked-Etag": f'"{served.sha256}"', "X-Linked-Size": str(len(served.data))}
            self._send(200, headers, served.data, body=body, content_type="application/octet-stream")

        def _json(self, doc: object, *, body: bool) -> None:
            self._send(200, {}, json.dumps(doc).encode(), body=body, content_type="application/json")

        def _error(
            self, status: int, code: str | None, message: str, *, body: bool, commit: str | None = None
        ) -> None:
            headers = {"X-Error-Message": message} | ({"X-Error-Code": code} if code else {})
            if commit:
                headers["X-Repo-Commit"] = commit
            self._send(status, headers, json.dumps({"error": message}).encode(), body=body)

        def _send(
            self,
            status: int,
            headers: dict[str, str],
            data: bytes,
            *,
            body: bool,
            content_type: str = "application/json",
        ) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if not body:
                return
            step = 1 << 20
            for start in range(0, len(data), step):
                self.wfile.write(data[start : start + step])
                if hub.seconds_per_mb and content_type == "application/octet-stream":
                    self.wfile.flush()
                    time.sleep(hub.seconds_per_mb)

    return Handler


def _lfs(f: _File, sha_key: str) -> dict[str, object] | None:
    return {sha_key: f.sha256, "size": len(f.data), "pointerSize": 134} if f.lfs else None


def _sibling(f: _File, *, blobs: bool) -> dict[str, object]:
    if not blobs:
        return {"rfilename": f.path}
    entry: dict[str, object] = {"rfilename": f.path, "size": len(f.data), "blobId": f.git_oid}
    if (lfs := _lfs(f, "sha256")) is not None:
        entry["lfs"] = lfs
    return entry


def _tree(repo: _Repo) -> list[dict[str, object]]:
    """The recursive listing: folders, then files."""
    folders = sorted({name.rsplit("/", 1)[0] for name in repo.files if "/" in name})
    listing: list[dict[str, object]] = [
        {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
        for d in folders
    ]
    return listing + [_tree_entry(f) for f in repo.files.values()]


def _tree_entry(f: _File) -> dict[str, object]:
    entry: dict[str, object] = {"type": "file", "oid": f.git_oid, "size": len(f.data), "path": f.path}
    if (lfs := _lfs(f, "oid")) is not None:
        entry["lfs"] = lfs
    return entry
