"""On-disk storage for the local Hub server (``hub_server``): repos, commits and blobs.

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
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Suffixes the Hub's default .gitattributes routes to LFS (abridged).
LFS_SUFFIXES = (
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".npy", ".npz",
    ".pkl", ".pickle", ".joblib", ".arrow", ".parquet", ".zip", ".gz", ".tar", ".png", ".jpg", ".jpeg",
)  # fmt: skip
GITATTRIBUTES = "".join(f"*{s} filter=lfs diff=lfs merge=lfs -text\n" for s in LFS_SUFFIXES).encode()


class HubError(Exception):
    """An HTTP error answer: status, optional ``X-Error-Code`` and a message.

    Handlers raise it instead of writing error responses themselves, so there is one
    place (``_Handler._dispatch``) that formats errors the way the client parses them.
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

    def create_branch(self, rtype: str, repo_id: str, branch: str, start: str | None) -> bool:
        """A new branch at ``start`` (a branch or commit; main by default); False if it already exists."""
        with self.lock:
            state = self.load(rtype, repo_id)
            if branch in state["refs"]:
                return False
            state["refs"][branch] = self.resolve(state, start or "main")["id"]
            self.save(state)
            return True

    def open_pull_request(self, rtype: str, repo_id: str, base: str) -> str:
        """A new ``refs/pr/<n>`` ref at the head of ``base``, as the Hub opens one for a commit with create_pr."""
        with self.lock:
            state = self.load(rtype, repo_id)
            number = 1 + sum(ref.startswith("refs/pr/") for ref in state["refs"])
            ref = f"refs/pr/{number}"
            state["refs"][ref] = self.resolve(state, base)["id"]
            self.save(state)
            return ref

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
