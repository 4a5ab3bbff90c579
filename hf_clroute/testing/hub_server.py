"""A small, real, file-backed Hugging Face Hub-compatible HTTP server for offline tests.

Why it exists: these machines reach no website, yet the product's stories end in
``push_to_hub`` / ``from_pretrained`` round trips. Mocking ``huggingface_hub`` would
test our assumptions about it, not the client; this server lets the *real* client
(huggingface_hub 2.4, plain-HTTP/LFS path) talk HTTP to something that keeps real
commits on disk. Only the endpoints that client uses for create/upload/download are
implemented; every other route fails loudly (HTTP 501, a JSON body naming the method and
path, a line on stderr, and an entry in ``HubServer.unrouted``) so a client upgrade that
needs a new endpoint shows up in tests instead of being silently mis-served.

Storage (layout and commit model) lives in ``hub_store``; the HTTP plumbing (request
parsing, response writing) in ``hub_http``. This module holds the routes, the Hub
handlers and the ``python -m`` entry point.

The behaviour choices that mirror the Hub, and why, are listed on :class:`HubServer`.

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
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from hf_clroute.testing.hub_http import Request, Response, _Server
from hf_clroute.testing.hub_store import (
    LFS_SUFFIXES,
    OPS,
    HubError,
    HubStore,
    _check_path,
    _lfs_pointer,
)

__all__ = ["HubServer", "HubError", "start_hub_server", "DEFAULT_USER"]

DEFAULT_USER = "tester"
FAULTS = ("garbage", "hang", "error")
LFS_THRESHOLD = 1_000_000
URL_TYPES = {"models": "model", "datasets": "dataset"}  # /api/{models|datasets}/...
URL_PREFIX = {"model": "", "dataset": "datasets/"}  # /{datasets/}{repo}/resolve/...
_NAME = r"[A-Za-z0-9][\w.\-]*"
REPO = rf"(?P<repo>{_NAME}(?:/{_NAME})?)"
API = rf"/api/(?P<utype>models|datasets)/{REPO}"
GIT = rf"/(?:(?P<dprefix>datasets)/)?{REPO}"


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
    * Branches (``create_branch``) and pull requests (a commit with ``create_pr=1`` goes to a new
      ``refs/pr/<n>``) are kept like any ref; discussions themselves are not implemented.
    * ``with server.faulty("garbage")`` answers every request with 200 and an HTML body (not JSON),
      ``with server.faulty("hang")`` accepts every request and never answers, ``with server.faulty("error")``
      answers 500 with a JSON error body, so tests can check that the client's errors and timeouts name
      the server. ``routes=("commit",)`` limits the fault to those handlers (names from ``ROUTES``): a push
      whose uploads pass and whose commit fails, the way a push breaks half-way.
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
        ("POST", API + r"/branch/(?P<branch>[^/]+)", "create_branch"),
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
        #: a fault to answer requests with, for tests of the client's error handling: None (serve),
        #: "garbage" (200 with an HTML body, not JSON), "hang" (accept, never answer) or "error" (500)
        self.fault: str | None = None
        #: the handlers (route names) the fault applies to; None: every request
        self.fault_routes: frozenset[str] | None = None
        self._released = threading.Event()
        self._released.set()
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

    @contextmanager
    def faulty(self, mode: str, routes: tuple[str, ...] | None = None) -> Iterator[HubServer]:
        """Answer requests with the fault ``mode`` ("garbage", "hang" or "error") while the block runs:
        every request, or only those ``routes`` handle (route names from :attr:`ROUTES`, e.g. "commit")."""
        if mode not in FAULTS:
            raise ValueError(f"unknown fault mode {mode!r}; known: {FAULTS}")
        known = {name for _, _, name in self.ROUTES}
        unknown = sorted(set(routes or ()) - known)
        if unknown:
            raise ValueError(f"unknown route(s) {unknown} for a fault; known: {sorted(known)}")
        self.fault, self.fault_routes = mode, (frozenset(routes) if routes else None)
        self._released.clear()
        try:
            yield self
        finally:
            self.fault, self.fault_routes = None, None
            self._released.set()  # hung requests end (their connections close unanswered)

    def fault_for(self, method: str, path: str) -> str | None:
        """The fault to answer ``method path`` with, if any (routes are matched without recording misses)."""
        if self.fault is None or self.fault_routes is None:
            return self.fault
        for methods, regex, name in self.ROUTES:
            if method in methods and regex.match(path):
                return self.fault if name in self.fault_routes else None
        return None

    def wait_while_hanging(self) -> None:
        self._released.wait()

    def stop(self) -> None:
        self._released.set()
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

    def handle_create_branch(self, req: Request) -> Response:
        """409 if it exists: the client treats that as success with exist_ok."""
        rtype, repo_id, _ = self._repo(req, write=True)
        start = (req.json() or {}).get("startingPoint")
        if not self.store.create_branch(rtype, repo_id, req.params["branch"], start):
            raise HubError(409, f"Reference already exists: {req.params['branch']}")
        return Response(payload={})

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
        branch, pr_url = req.params["rev"], None
        if req.flag("create_pr"):  # the commit goes to a new refs/pr/<n> opened from the branch's head
            branch = self.store.open_pull_request(rtype, repo_id, branch)
            pr_url = f"{req.base_url}/{URL_PREFIX[rtype]}{repo_id}/discussions/{branch.rsplit('/', 1)[1]}"
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
        sha = self.store.commit(rtype, repo_id, branch, lines[0].get("value") or {}, ops)
        url = f"{req.base_url}/{URL_PREFIX[rtype]}{repo_id}/commit/{sha}"
        payload = {"success": True, "commitOid": sha, "commitUrl": url, "hookOutput": "", "pullRequestUrl": pr_url}
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
