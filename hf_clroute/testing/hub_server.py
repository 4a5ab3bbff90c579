"""A small, real, file-backed Hugging Face Hub-compatible HTTP server for offline tests.

Why it exists: these machines reach no website, yet the product's stories end in
``push_to_hub`` / ``from_pretrained`` round trips. Mocking ``huggingface_hub`` would
test our assumptions about it, not the client; this server lets the *real* client
(huggingface_hub 2.4, plain-HTTP/LFS path) talk HTTP to something that keeps real
commits on disk. Only the endpoints that client uses for create/upload/download are
implemented (see SPEC.md section 7); every other route fails loudly (HTTP 501, a JSON
body naming the method and path, a line on stderr, and an entry in
``HubServer.unrouted``) so a client upgrade that needs a new endpoint shows up in tests
instead of being silently mis-served.

Storage layout under ``root`` (plain files, inspectable by hand)::

    blobs/<sha256>                        content-addressed file contents
    repos/<model|dataset>/<repo_id>/repo.json
        {"id", "type", "private", "createdAt", "refs": {"main": <commit>},
         "commits": {<commit>: {"id", "parent", "title", "message", "date",
                                "files": {path: {"sha256", "size", "lfs", "oid"}}}}}

Each commit is a full snapshot of the tree, so any old commit id stays readable
(``revision=<old sha>``). Commit ids are 40-hex like git's. ``oid`` is what the Hub
calls a file's blob id: the git-sha1 of the content for regular files, of the LFS
pointer for LFS files. New repos get an initial ``.gitattributes`` commit, as on the
Hub, so a fresh repo already has a ``sha``.

Behaviour choices that mirror the Hub (and why):

* ``preupload`` answers ``"lfs"`` for files >= ``lfs_threshold`` bytes (1 MB), for
  binary suffixes such as ``.safetensors`` and for samples holding NUL bytes, so both
  upload paths (inline base64 and LFS batch + PUT) are exercised by tests.
* A repo created without an organization lands in the user's namespace (``tester``),
  because ``create_repo`` parses the returned URL and needs ``namespace/name``.
* Writes (create/delete repo, preupload, LFS batch, commit) and ``whoami-v2`` need an
  ``Authorization: Bearer <anything>`` header, else 401. The token value is never
  logged or stored. The LFS ``PUT`` URL is "signed" with a per-server secret instead,
  like an S3 pre-signed URL, because the client sends no auth header there.
* ``ETag`` on ``/resolve`` is the quoted git-sha1 (regular) or sha256 (LFS; also sent as
  ``X-Linked-Etag``/``X-Linked-Size``); files are served directly (no CDN redirect).
* Errors carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
  ``EntryNotFound``) and ``X-Error-Message`` headers, which is what
  ``huggingface_hub.utils.hf_raise_for_status`` maps to its exception classes.

Run by hand::

    python -m hf_clroute.testing.hub_server --root runs/hub --port 8765
    # then, in the client's shell, BEFORE importing huggingface_hub:
    export HF_ENDPOINT=http://127.0.0.1:8765 HF_HUB_DISABLE_XET=1 HF_TOKEN=<anything>

``HF_HUB_DISABLE_XET=1`` is required: with ``hf_xet`` installed the client would
otherwise upload through a Xet CAS endpoint this server does not implement.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["HubServer", "HubError", "start_hub_server", "DEFAULT_USER"]

DEFAULT_USER = "tester"
LFS_THRESHOLD = 1_000_000
# Suffixes the Hub's default .gitattributes routes to LFS (abridged).
LFS_SUFFIXES = (
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".npy", ".npz",
    ".pkl", ".pickle", ".joblib", ".arrow", ".parquet", ".zip", ".gz", ".tar", ".png", ".jpg", ".jpeg",
)  # fmt: skip
GITATTRIBUTES = "".join(f"*{s} filter=lfs diff=lfs merge=lfs -text\n" for s in LFS_SUFFIXES).encode()
URL_TYPES = {"models": "model", "datasets": "dataset"}  # /api/{models|datasets}/...
URL_PREFIX = {"model": "", "dataset": "datasets/"}  # /{datasets/}{repo}/resolve/...
_NAME = r"[A-Za-z0-9][\w.\-]*"
REPO = rf"(?P<repo>{_NAME}(?:/{_NAME})?)"
API = rf"/api/(?P<utype>models|datasets)/{REPO}"
GIT = rf"/(?:(?P<dprefix>datasets)/)?{REPO}"
CHUNK = 1 << 20


class HubError(Exception):
    """An HTTP error answer: status, optional ``X-Error-Code`` and a message.

    Handlers raise it instead of writing error responses themselves, so there is one
    place (``_Handler._send``) that formats errors the way the client parses them.
    """

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = headers or {}
        self.extra = extra or {}  # more JSON fields, e.g. the 409 of create_repo carries "url"


def _now() -> str:
    """ISO time in the Hub's format; ``huggingface_hub.utils.parse_datetime`` expects ms + Z."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def _git_sha1(data: bytes) -> str:
    """git's blob id; the client compares it with its own for unchanged regular files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _entry(sha256: str, size: int, lfs: bool, content: bytes | None = None) -> dict[str, Any]:
    """A tree entry; ``oid`` is the git blob id (of the pointer for LFS files)."""
    oid = _git_sha1(_lfs_pointer(sha256, size) if lfs else content or b"")
    return {"sha256": sha256, "size": size, "lfs": lfs, "oid": oid}


def _check_path(path: Any) -> str:
    """Reject paths git/the Hub would reject, so bad client input fails here too."""
    if not isinstance(path, str) or not path or path.startswith("/") or path.endswith("/"):
        raise HubError(400, f"invalid path in repo: {path!r}")
    if any(part in ("", ".", "..", ".git") for part in path.split("/")):
        raise HubError(400, f"invalid path in repo: {path!r}")
    return path


# --------------------------------------------------------------------------------------
# storage
# --------------------------------------------------------------------------------------


class HubStore:
    """Repos, commits and blobs on disk. One lock serialises repo-state changes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs"
        self.repos = root / "repos"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.repos.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()

    # -- blobs --------------------------------------------------------------------
    def blob_path(self, sha256: str) -> Path:
        return self.blobs / sha256

    def has_blob(self, sha256: str, size: int | None = None) -> bool:
        p = self.blob_path(sha256)
        return p.is_file() and (size is None or p.stat().st_size == size)

    def put_bytes(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        if not self.has_blob(sha):
            self._atomic_write(self.blob_path(sha), data)
        return sha

    def put_stream(self, chunks: Iterator[bytes], expected_sha256: str) -> int:
        """Store streamed bytes iff they hash to ``expected_sha256`` (LFS PUT)."""
        h, size = hashlib.sha256(), 0
        fd, tmp = tempfile.mkstemp(dir=self.blobs, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    h.update(chunk)
                    size += len(chunk)
                    f.write(chunk)
            if h.hexdigest() != expected_sha256:
                raise HubError(400, f"uploaded content hashes to {h.hexdigest()}, not the announced {expected_sha256}")
            os.replace(tmp, self.blob_path(expected_sha256))
            return size
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @staticmethod
    def _atomic_write(path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    # -- repos --------------------------------------------------------------------
    def _state_path(self, rtype: str, repo_id: str) -> Path:
        return self.repos / rtype / repo_id / "repo.json"

    def load(self, rtype: str, repo_id: str) -> dict[str, Any]:
        path = self._state_path(rtype, repo_id)
        if not path.is_file():
            raise HubError(404, f"{rtype} repository {repo_id} not found", "RepoNotFound")
        return json.loads(path.read_text())

    def save(self, state: dict[str, Any]) -> None:
        path = self._state_path(state["type"], state["id"])
        path.parent.mkdir(parents=True, exist_ok=True)
        self._atomic_write(path, json.dumps(state, indent=1).encode())

    def create_repo(self, rtype: str, repo_id: str, private: bool) -> bool:
        """Create with an initial ``.gitattributes`` commit; False if it already exists."""
        with self.lock:
            if self._state_path(rtype, repo_id).is_file():
                return False
            state = {"id": repo_id, "type": rtype, "private": private, "createdAt": _now(), "refs": {}, "commits": {}}
            files = {".gitattributes": _entry(self.put_bytes(GITATTRIBUTES), len(GITATTRIBUTES), False, GITATTRIBUTES)}
            self._add_commit(state, "main", files, "initial commit", "")
            self.save(state)
            return True

    def delete_repo(self, rtype: str, repo_id: str) -> None:
        with self.lock:
            self.load(rtype, repo_id)
            shutil.rmtree(self._state_path(rtype, repo_id).parent)

    @staticmethod
    def resolve(state: dict[str, Any], rev: str) -> dict[str, Any]:
        """A branch name or a full commit id -> the commit (else RevisionNotFound)."""
        sha = state["refs"].get(rev, rev)
        commit = state["commits"].get(sha)
        if commit is None:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return commit

    @staticmethod
    def _add_commit(state: dict, branch: str, files: dict, title: str, message: str) -> dict[str, Any]:
        parent = state["refs"].get(branch)
        date = _now()
        seed = json.dumps([parent, files, title, message, date, uuid.uuid4().hex], sort_keys=True)
        sha = hashlib.sha1(seed.encode()).hexdigest()
        commit = {"id": sha, "parent": parent, "title": title, "message": message, "date": date, "files": files}
        state["commits"][sha] = commit
        state["refs"][branch] = sha
        return commit

    def commit(self, rtype: str, repo_id: str, branch: str, header: dict, ops: list[tuple[str, dict]]) -> str:
        """Apply NDJSON operations on top of ``branch`` and return the new commit id."""
        with self.lock:
            state = self.load(rtype, repo_id)
            if branch not in state["refs"]:
                raise HubError(404, f"Invalid rev id: {branch} (commits go to an existing branch)", "RevisionNotFound")
            head = state["refs"][branch]
            parent = header.get("parentCommit")
            if parent and not head.startswith(parent):
                raise HubError(412, f"parentCommit {parent} is not the head of {branch} ({head})")
            files = dict(state["commits"][head]["files"])
            for key, value in ops:
                OPS[key](self, files, value)
            self._add_commit(state, branch, files, header.get("summary", ""), header.get("description", ""))
            self.save(state)
            return state["refs"][branch]

    # -- NDJSON operations (key -> how it changes the tree) -------------------------
    def _op_file(self, files: dict, value: dict) -> None:
        encoding = value.get("encoding", "base64")
        if encoding not in ("base64", "utf-8"):
            raise HubError(400, f"unsupported file encoding {encoding!r}")
        content = value["content"]
        data = base64.b64decode(content) if encoding == "base64" else content.encode()
        files[_check_path(value.get("path"))] = _entry(self.put_bytes(data), len(data), False, data)

    def _op_lfs_file(self, files: dict, value: dict) -> None:
        oid, algo = value.get("oid", ""), value.get("algo", "sha256")
        if algo != "sha256" or not self.has_blob(oid):
            raise HubError(422, f"LFS object {oid} ({algo}) was never uploaded for {value.get('path')!r}")
        size = self.blob_path(oid).stat().st_size
        if value.get("size") not in (None, size):
            raise HubError(422, f"LFS object {oid} has size {size}, not {value['size']}")
        files[_check_path(value.get("path"))] = _entry(oid, size, True)

    @staticmethod
    def _op_deleted_file(files: dict, value: dict) -> None:
        path = value.get("path")
        if files.pop(path, None) is None:
            raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")

    @staticmethod
    def _op_deleted_folder(files: dict, value: dict) -> None:
        prefix = str(value.get("path", "")).rstrip("/") + "/"
        doomed = [p for p in files if p.startswith(prefix)]
        if not doomed:
            raise HubError(404, f"A folder with this name doesn't exist: {prefix}", "EntryNotFound")
        for p in doomed:
            del files[p]


# The commit line keys this server understands; anything else is rejected by name.
OPS: dict[str, Callable[[HubStore, dict, dict], None]] = {
    "file": HubStore._op_file,
    "lfsFile": HubStore._op_lfs_file,
    "deletedFile": lambda store, files, value: HubStore._op_deleted_file(files, value),
    "deletedFolder": lambda store, files, value: HubStore._op_deleted_folder(files, value),
}


# --------------------------------------------------------------------------------------
# HTTP plumbing
# --------------------------------------------------------------------------------------


@dataclass
class Request:
    """What a route handler sees: the matched URL parts, query, headers and body."""

    method: str
    path: str
    params: dict[str, str]
    query: dict[str, str]
    headers: Any
    handler: _Handler

    @property
    def base_url(self) -> str:
        """The address the client used; URLs we hand out (LFS, commit) point back to it."""
        return f"http://{self.headers.get('Host') or self.handler.server.server_address[0]}"

    @property
    def has_token(self) -> bool:
        auth = self.headers.get("Authorization", "")
        return auth.startswith("Bearer ") and len(auth) > len("Bearer ")

    def require_token(self) -> None:
        if not self.has_token:
            raise HubError(401, f"{self.method} {self.path} needs an 'Authorization: Bearer <token>' header")

    def body(self) -> bytes:
        return b"".join(self.handler.body_chunks())

    def json(self) -> Any:
        try:
            return json.loads(self.body() or b"null")
        except json.JSONDecodeError as err:
            raise HubError(400, f"request body is not JSON: {err}") from err

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("1", "true", "yes")


@dataclass
class Response:
    """What a route handler returns; ``_Handler._send`` is the only writer."""

    status: int = 200
    payload: Any = None  # JSON-encoded when not None
    file: Path | None = None  # streamed (with Range support) when set
    headers: dict[str, str] = field(default_factory=dict)


class _Handler(BaseHTTPRequestHandler):
    """Parses requests, finds the route, writes the response. No Hub semantics here."""

    protocol_version = "HTTP/1.1"  # keep-alive, like the Hub; every response has Content-Length
    server: _Server
    timeout = 60

    def do_GET(self) -> None:
        self._dispatch()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_GET

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Method, path (no query: it holds the LFS URL signature) and status; never headers/tokens."""
        self.log_message("%s %s %s", self.command, urlsplit(self.path).path, code)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet unless verbose."""
        if self.server.hub.verbose:
            sys.stderr.write(f"[hub_server] {format % args}\n")

    def _dispatch(self) -> None:
        self._body = self._iter_body()
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        try:
            handler, params = self.server.hub.route(self.command, split.path)
            req = Request(self.command, split.path, params, query, self.headers, self)
            response = handler(req)
        except HubError as err:
            response = Response(err.status, {"error": err.message, **err.extra}, headers=dict(err.headers))
            if err.code:
                response.headers["X-Error-Code"] = err.code
            response.headers["X-Error-Message"] = err.message
        except (KeyError, ValueError, TypeError) as err:  # malformed input (or a bug): loud, not retried
            traceback.print_exc(file=sys.stderr)
            response = Response(400, {"error": f"hub_server could not handle {self.command} {split.path}: {err!r}"})
        except Exception as err:  # a server bug: say so loudly, answer 500
            traceback.print_exc(file=sys.stderr)
            response = Response(500, {"error": f"hub_server internal error: {err!r}"})
        for _ in self.body_chunks():  # drain what the handler did not read (keep-alive)
            pass
        self._send(response)

    def body_chunks(self) -> Iterator[bytes]:
        """The request body as one shared iterator, so the final drain resumes where a handler stopped."""
        return self._body

    def _iter_body(self) -> Iterator[bytes]:
        """Content-Length or chunked transfer encoding (streamed uploads may come either way)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while (size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)) > 0:
                yield from self._read_exact(size)
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
        else:
            yield from self._read_exact(int(self.headers.get("Content-Length") or 0))

    def _read_exact(self, n: int) -> Iterator[bytes]:
        while n > 0:
            chunk = self.rfile.read(min(n, CHUNK))
            if not chunk:
                raise HubError(400, "request body ended early")
            n -= len(chunk)
            yield chunk

    def _send(self, response: Response) -> None:
        headers = {k: _header_safe(v) for k, v in response.headers.items()}
        body, start, length = b"", 0, 0
        if response.file is not None:
            size = response.file.stat().st_size
            start, length, status = self._byte_range(size, response.status, headers)
            response.status = status
            headers.setdefault("Content-Type", "application/octet-stream")
        else:
            if response.payload is not None:
                body = json.dumps(response.payload).encode()
                headers.setdefault("Content-Type", "application/json; charset=utf-8")
            length = len(body)
        self.send_response(response.status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command == "HEAD":
            return
        if response.file is None:
            self.wfile.write(body)
            return
        with open(response.file, "rb") as f:
            f.seek(start)
            while length > 0:
                chunk = f.read(min(length, CHUNK))
                self.wfile.write(chunk)
                length -= len(chunk)

    def _byte_range(self, size: int, status: int, headers: dict[str, str]) -> tuple[int, int, int]:
        """(start, length, status) for a single ``Range: bytes=a-b`` (resumed downloads)."""
        headers["Accept-Ranges"] = "bytes"
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "").strip())
        if status != 200 or match is None or match.groups() == ("", ""):
            return 0, size, status
        first, last = match.groups()
        start = size - int(last) if first == "" else int(first)
        end = size - 1 if first == "" or last == "" else min(int(last), size - 1)
        if start < 0 or start >= size or end < start:
            headers["Content-Range"] = f"bytes */{size}"
            return 0, 0, 416
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        return start, end - start + 1, 206


def _header_safe(value: str) -> str:
    """HTTP headers must be one latin-1 line; error messages may not be."""
    return " ".join(str(value).split()).encode("ascii", "replace").decode()


class _Server(ThreadingHTTPServer):
    """Tracks open connections so ``stop()`` really cuts keep-alive clients off.

    Without that, the client's pooled keep-alive connection would still be served by
    its old handler thread after shutdown and a "server down" test would pass through.
    """

    daemon_threads = True
    allow_reuse_address = True  # restart on the same port right after stop()

    def __init__(self, address: tuple[str, int], hub: HubServer) -> None:
        self.hub = hub
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._conns_lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


# --------------------------------------------------------------------------------------
# the Hub: routes and handlers
# --------------------------------------------------------------------------------------

Route = tuple[frozenset[str], re.Pattern[str], str]


def _routes(*table: tuple[str, str, str]) -> list[Route]:
    return [(frozenset(m.split(",")), re.compile(f"^{rx}$"), name) for m, rx, name in table]


class HubServer:
    """The Hub-compatible server: ``start()``, ``stop()``, ``url``, ``root``, context manager.

    ``stop()`` keeps ``root`` and the port, so ``start()`` again brings the same Hub
    back at the same ``url`` (used to test pushes while the Hub is down).
    """

    # The one routing table: methods, path regex (matched on the raw, still-quoted
    # path; groups are unquoted afterwards), handler method name.
    ROUTES = _routes(
        ("GET", r"/api/whoami-v2", "whoami"),
        ("GET", r"/api/agent-harnesses", "agent_harnesses"),
        ("POST", r"/api/repos/create", "create_repo"),
        ("DELETE", r"/api/repos/delete", "delete_repo"),
        ("POST", r"/api/validate-yaml", "validate_yaml"),
        ("GET", API, "repo_info"),
        ("GET", API + r"/revision/(?P<rev>[^/]+)", "repo_info"),
        ("GET", API + r"/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?", "tree"),
        ("POST", API + r"/preupload/(?P<rev>[^/]+)", "preupload"),
        ("POST", API + r"/commit/(?P<rev>[^/]+)", "commit"),
        ("POST", GIT + r"\.git/info/lfs/objects/batch", "lfs_batch"),
        ("PUT", r"/_lfs/(?P<oid>[0-9a-f]{64})", "lfs_put"),
        ("POST", r"/_lfs/(?P<oid>[0-9a-f]{64})/verify", "lfs_verify"),
        ("GET,HEAD", GIT + r"/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
    )

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        lfs_threshold: int = LFS_THRESHOLD,
        verbose: bool = False,
    ) -> None:
        if root is None:
            root = tempfile.mkdtemp(prefix="hf_clroute_hub_")
            weakref.finalize(self, shutil.rmtree, root, True)  # ours: remove when done
        self.root = Path(root)
        self.store = HubStore(self.root)
        self.host, self.port = host, port
        self.lfs_threshold = lfs_threshold
        self.verbose = verbose
        self.unrouted: list[str] = []  # "METHOD /path" of every request no route matched
        self._secret = secrets.token_hex(16)  # "signs" LFS upload URLs
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The ``HF_ENDPOINT`` for this server."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    def start(self) -> HubServer:
        if self._httpd is None:
            self._httpd = _Server((self.host, self.port), self)
            self.port = self._httpd.server_address[1]
            # short poll interval: stop() (and the "Hub down" fixture) returns in ~50 ms
            serve = self._httpd.serve_forever
            self._thread = threading.Thread(target=serve, args=(0.05,), name="hub_server", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.close_connections()
            httpd.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        """Foreground mode for ``python -m``: start, then block until interrupted."""
        self.start()
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    # -- routing ---------------------------------------------------------------------
    def route(self, method: str, path: str) -> tuple[Callable[[Request], Response], dict[str, str]]:
        known_path = False
        for methods, regex, name in self.ROUTES:
            match = regex.match(path)
            if match:
                known_path = True
                if method in methods:
                    params = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
                    return getattr(self, f"handle_{name}"), params
        what = f"{method} {path}"
        self.unrouted.append(what)
        sys.stderr.write(f"[hub_server] UNSUPPORTED ENDPOINT: {what}\n")
        status = 405 if known_path else 501
        raise HubError(status, f"hub_server does not implement {what} (extend hf_clroute/testing/hub_server.py)")

    def _repo(self, req: Request, *, write: bool = False) -> tuple[str, str, dict[str, Any]]:
        """(repo type, repo id, state) for the repo named in the URL; enforces auth."""
        if write:
            req.require_token()
        utype = req.params.get("utype")
        rtype = URL_TYPES[utype] if utype else ("dataset" if req.params.get("dprefix") else "model")
        repo_id = req.params["repo"]
        with self.store.lock:
            state = self.store.load(rtype, repo_id)
        if state["private"] and not req.has_token:
            raise HubError(404, f"{rtype} repository {repo_id} not found", "RepoNotFound")
        return rtype, repo_id, state

    # -- handlers --------------------------------------------------------------------
    def handle_whoami(self, req: Request) -> Response:
        req.require_token()
        token = {"displayName": "hub_server", "role": "write"}
        user = {"type": "user", "id": "0" * 24, "name": DEFAULT_USER, "fullname": "Test User", "orgs": []}
        return Response(payload={**user, "auth": {"type": "access_token", "accessToken": token}})

    def handle_agent_harnesses(self, req: Request) -> Response:
        """The client fetches this registry once a day to tag its user agent; empty = no agent."""
        return Response(payload={"standardEnvVars": [], "harnesses": {}})

    def _repo_id_from_body(self, body: dict[str, Any]) -> tuple[str, str]:
        rtype = body.get("type") or "model"
        if rtype not in URL_PREFIX:
            raise HubError(400, f"hub_server supports repo types {sorted(URL_PREFIX)}, not {rtype!r}")
        name, org = body.get("name"), body.get("organization") or DEFAULT_USER
        repo_id = f"{org}/{name}"
        if not isinstance(name, str) or not re.fullmatch(REPO, repo_id):
            raise HubError(400, f"invalid repo name: {repo_id!r}")
        return rtype, repo_id

    def handle_create_repo(self, req: Request) -> Response:
        """409 (with ``url``) if it exists: the client treats that as success with exist_ok."""
        req.require_token()
        body = req.json() or {}
        rtype, repo_id = self._repo_id_from_body(body)
        private = body.get("private", body.get("visibility") == "private") or False
        url = f"{req.base_url}/{URL_PREFIX[rtype]}{repo_id}"
        if not self.store.create_repo(rtype, repo_id, bool(private)):
            raise HubError(409, f"You already created this {rtype} repo: {repo_id}", extra={"url": url})
        return Response(payload={"url": url, "name": repo_id, "id": uuid.uuid4().hex[:24]})

    def handle_delete_repo(self, req: Request) -> Response:
        req.require_token()
        self.store.delete_repo(*self._repo_id_from_body(req.json() or {}))
        return Response(payload={})

    def handle_validate_yaml(self, req: Request) -> Response:
        """Parse README front matter (PyYAML ships with huggingface_hub); 400 if invalid."""
        content = (req.json() or {}).get("content", "")
        try:
            _front_matter(content)
        except ValueError as err:
            return Response(400, {"errors": [{"message": str(err)}], "warnings": []})
        return Response(payload={"errors": [], "warnings": []})

    def handle_repo_info(self, req: Request) -> Response:
        rtype, repo_id, state = self._repo(req)
        commit = self.store.resolve(state, req.params.get("rev", "main"))
        siblings = [{"rfilename": p, **self._file_meta(p, e)} for p, e in sorted(commit["files"].items())]
        info: dict[str, Any] = {
            "_id": hashlib.sha1(f"{rtype}/{repo_id}".encode()).hexdigest()[:24],
            "id": repo_id,
            "author": repo_id.split("/")[0] if "/" in repo_id else None,
            "sha": commit["id"],
            "lastModified": commit["date"],
            "createdAt": state["createdAt"],
            "private": state["private"],
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
        }
        if rtype == "model":
            info["modelId"] = repo_id
        card = self._card_data(commit)
        if card:
            info["cardData"] = card
            info["tags"] = list(card.get("tags") or [])
            for key in ("library_name", "pipeline_tag"):
                if key in card:
                    info[key] = card[key]
        return Response(payload=info)

    def _file_meta(self, path: str, entry: dict[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {"size": entry["size"], "blobId": entry["oid"]}
        if entry["lfs"]:
            pointer = _lfs_pointer(entry["sha256"], entry["size"])
            meta["lfs"] = {"sha256": entry["sha256"], "size": entry["size"], "pointerSize": len(pointer)}
        return meta

    def _card_data(self, commit: dict[str, Any]) -> dict[str, Any] | None:
        entry = commit["files"].get("README.md")
        if entry is None:
            return None
        try:
            return _front_matter(self.store.blob_path(entry["sha256"]).read_text(errors="replace"))
        except ValueError:
            return None

    def handle_tree(self, req: Request) -> Response:
        """Children of ``path`` (or all descendants with ``recursive``), files and folders."""
        if req.flag("expand"):
            raise HubError(501, "hub_server does not implement tree listings with expand=True")
        _, _, state = self._repo(req)
        commit = self.store.resolve(state, req.params["rev"])
        base = req.params.get("path", "").strip("/")
        prefix = f"{base}/" if base else ""
        recursive = req.flag("recursive")
        entries: dict[str, dict[str, Any]] = {}
        for path, entry in commit["files"].items():
            if not path.startswith(prefix):
                continue
            parts = path[len(prefix) :].split("/")
            depth = len(parts) if recursive else 1
            for i in range(1, min(depth, len(parts) - 1) + 1):  # folders on the way
                folder = prefix + "/".join(parts[:i])
                oid = hashlib.sha1(f"tree {commit['id']} {folder}".encode()).hexdigest()
                entries.setdefault(folder, {"type": "directory", "oid": oid, "path": folder})
            if recursive or len(parts) == 1:
                entries[path] = {"type": "file", "path": path, "oid": entry["oid"], **self._file_meta(path, entry)}
        if base and not entries:
            raise HubError(404, f"{base} does not exist on {req.params['rev']}", "EntryNotFound")
        for item in entries.values():
            item.pop("blobId", None)
            if "lfs" in item:
                lfs = item["lfs"]
                item["lfs"] = {"oid": lfs["sha256"], "size": lfs["size"], "pointerSize": lfs["pointerSize"]}
        return Response(payload=[entries[p] for p in sorted(entries)])

    def handle_preupload(self, req: Request) -> Response:
        """Decide regular vs LFS per file and report the current oid (the client skips unchanged files)."""
        _, _, state = self._repo(req, write=True)
        commit = self.store.resolve(state, req.params["rev"])
        files = commit["files"]
        answer = []
        for item in (req.json() or {}).get("files", []):
            path = _check_path(item.get("path"))
            sample = base64.b64decode(item.get("sample", ""))
            lfs = int(item.get("size", 0)) >= self.lfs_threshold or path.endswith(LFS_SUFFIXES) or b"\0" in sample
            current = files.get(path)
            oid = None if current is None else (current["sha256"] if current["lfs"] else current["oid"])
            answer.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid})
        return Response(payload={"files": answer, "commitOid": commit["id"]})

    def handle_lfs_batch(self, req: Request) -> Response:
        """git-lfs batch API (upload only): hand out a signed PUT URL per missing object."""
        self._repo(req, write=True)
        body = req.json() or {}
        if body.get("operation") != "upload":
            raise HubError(501, f"hub_server implements LFS batch 'upload' only, not {body.get('operation')!r}")
        objects = []
        for obj in body.get("objects", []):
            oid, size = str(obj.get("oid", "")), int(obj.get("size", -1))
            item: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if not re.fullmatch(r"[0-9a-f]{64}", oid):
                item["error"] = {"code": 422, "message": f"invalid oid {oid!r}"}
            elif not self.store.has_blob(oid, size):
                href = f"{req.base_url}/_lfs/{oid}"
                item["actions"] = {
                    "upload": {"href": f"{href}?size={size}&sig={self._secret}", "header": {}},
                    "verify": {"href": f"{href}/verify", "header": {}},
                }
            objects.append(item)
        return Response(payload={"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

    def handle_lfs_put(self, req: Request) -> Response:
        if not secrets.compare_digest(req.query.get("sig", ""), self._secret):
            raise HubError(403, "LFS upload URL signature is missing or wrong")
        size = self.store.put_stream(req.handler.body_chunks(), req.params["oid"])
        if "size" in req.query and int(req.query["size"]) != size:
            raise HubError(400, f"uploaded {size} bytes, announced {req.query['size']}")
        return Response(payload={})

    def handle_lfs_verify(self, req: Request) -> Response:
        req.require_token()
        body = req.json() or {}
        if not self.store.has_blob(req.params["oid"], body.get("size")):
            raise HubError(404, f"LFS object {req.params['oid']} is not stored (or has another size)")
        return Response(payload={})

    def handle_commit(self, req: Request) -> Response:
        """NDJSON commit: a ``header`` line, then file/lfsFile/deletedFile/deletedFolder lines."""
        rtype, repo_id, _ = self._repo(req, write=True)
        if req.flag("create_pr"):
            raise HubError(501, "hub_server does not implement pull requests (create_pr=1)")
        try:
            lines = [json.loads(line) for line in req.body().splitlines() if line.strip()]
        except json.JSONDecodeError as err:
            raise HubError(400, f"commit payload is not NDJSON: {err}") from err
        if not all(isinstance(line, dict) for line in lines):
            raise HubError(400, "every commit line must be a JSON object with 'key' and 'value'")
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "commit payload must start with a 'header' line")
        unknown = sorted({line.get("key") for line in lines[1:]} - set(OPS))
        if unknown:
            sys.stderr.write(f"[hub_server] UNSUPPORTED COMMIT OPERATION(S): {unknown}\n")
            raise HubError(400, f"hub_server does not implement commit operation(s) {unknown}")
        ops = [(line["key"], line.get("value") or {}) for line in lines[1:]]
        sha = self.store.commit(rtype, repo_id, req.params["rev"], lines[0].get("value") or {}, ops)
        url = f"{req.base_url}/{URL_PREFIX[rtype]}{repo_id}/commit/{sha}"
        payload = {"success": True, "commitOid": sha, "commitUrl": url, "hookOutput": "", "pullRequestUrl": None}
        return Response(payload=payload)

    def handle_resolve(self, req: Request) -> Response:
        _, _, state = self._repo(req)
        commit = self.store.resolve(state, req.params["rev"])
        headers = {"X-Repo-Commit": commit["id"]}
        entry = commit["files"].get(req.params["path"])
        if entry is None:
            raise HubError(404, f"Entry not found: {req.params['path']}", "EntryNotFound", headers)
        etag = entry["sha256"] if entry["lfs"] else entry["oid"]
        headers["ETag"] = f'"{etag}"'
        if entry["lfs"]:
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(entry["size"])})
        return Response(file=self.store.blob_path(entry["sha256"]), headers=headers)


def _front_matter(content: str) -> dict[str, Any] | None:
    """The README's YAML metadata block as a dict (None if absent); ValueError if invalid."""
    match = re.match(r"^---[ \t]*\r?\n(.*?)(?:\r?\n)?^---[ \t]*$", content, re.S | re.M)
    if match is None:
        return None
    try:
        import yaml  # a dependency of huggingface_hub; keeps this module stdlib-only at import
    except ImportError:  # pragma: no cover
        return None
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError as err:
        raise ValueError(f"invalid YAML metadata: {err}") from err
    if data is not None and not isinstance(data, dict):
        raise ValueError("YAML metadata must be a mapping")
    return data


def start_hub_server(root: str | os.PathLike[str] | None = None, port: int = 0, **kwargs: Any) -> HubServer:
    """Start a server on 127.0.0.1 (``port=0``: any free port) and return it; ``.stop()`` when done."""
    return HubServer(root, port, **kwargs).start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Local Hugging Face Hub-compatible server for offline tests.")
    parser.add_argument("--root", required=True, help="directory holding repos and blobs (kept between runs)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--verbose", action="store_true", help="log each request line (never headers)")
    args = parser.parse_args(argv)
    server = HubServer(args.root, args.port, args.host, verbose=args.verbose).start()
    print(f"hub_server: serving {Path(args.root).resolve()} at {server.url}")
    print(f"export HF_ENDPOINT={server.url} HF_HUB_DISABLE_XET=1 HF_TOKEN=<anything>", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
