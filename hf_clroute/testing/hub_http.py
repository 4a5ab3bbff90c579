"""HTTP plumbing for the local Hub server (``hub_server``): request parsing, routing
dispatch, response writing (JSON, files with Range support) and connection tracking.

No Hub semantics live here; ``HubServer`` (in ``hub_server``) owns the routes and handlers.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hf_clroute.testing.hub_store import HubError

CHUNK = 1 << 20


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
    raw: bytes | None = None  # sent as it is (a fault mode's garbage answer)


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
        fault = self.server.hub.fault_for(self.command, split.path)
        if fault == "hang":  # accept and never answer, until the fault is cleared or the server stops
            self.server.hub.wait_while_hanging()
            self.close_connection = True
            return
        if fault == "garbage":  # what a proxy or captive portal answers: 200 and HTML, not JSON
            for _ in self.body_chunks():
                pass
            self._send(Response(raw=b"<html><body>Service temporarily unavailable</body></html>",
                                headers={"Content-Type": "text/html"}))
            return
        if fault == "error":  # the server's own failure: 500 with a JSON error, as the Hub answers one
            for _ in self.body_chunks():
                pass
            message = f"hub_server: injected fault (500) on {self.command} {split.path}"
            self._send(Response(500, {"error": message}, headers={"X-Error-Message": message}))
            return
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
        elif response.raw is not None:
            body, length = response.raw, len(response.raw)
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

    def __init__(self, address: tuple[str, int], hub: Any) -> None:  # the HubServer that owns the routes
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
