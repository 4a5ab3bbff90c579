"""Small file helpers: atomic writes, an adapter's file names, "local dir or Hub id" resolution,
Hub calls with a deadline, pushing a folder.

Every file we write goes to a temporary name in the same directory and is then
renamed over the target: a crash or a full disk never leaves a half-written
checkpoint where a good one used to be. A push first writes everything to a
temporary directory and uploads that in one commit, so a failed push leaves the
caller's files exactly as they were and the remote repo at its previous commit.

Every Hub call (an adapter's download, a push) runs under :func:`hub_call`: it is abandoned after
``$HF_CLROUTE_HUB_TIMEOUT`` seconds (60 by default), and its errors become one line naming the
repo and the server (:class:`~hf_clroute.errors.HubError`; a push's, :class:`HubPushError`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from hf_clroute.errors import HubError, UserInputError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


@contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it over ``target`` on success."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        # mkstemp makes the file private (0600); the result gets the mode a plain open() would give.
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def current_umask() -> int:
    """The process umask (read from /proc where there is one: setting it to read it is racy)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def sort_safetensors_header(path: str | os.PathLike) -> None:
    """Rewrite a safetensors file's header in place with its keys sorted: safetensors writes the metadata in
    hash order, which changes from one process to the next, so two identical saves would differ in bytes.
    The header is the same JSON reordered, hence the same length; should it ever not be, it is left as is."""
    with open(path, "r+b") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
        metadata = header.pop("__metadata__", None)
        ordered = ({"__metadata__": dict(sorted(metadata.items()))} if metadata else {}) | dict(sorted(header.items()))
        text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) <= size:
            handle.seek(8)
            handle.write(text + b" " * (size - len(text)))  # safetensors pads its header with spaces too


def sha256_file(path: str | os.PathLike) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks (checkpoints, committed assets)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def atomic_write_text(target: str | os.PathLike, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text)


def resolve_pretrained_dir(path_or_repo_id: str | os.PathLike, *, timeout: float | None = None,
                           **hub_kwargs: Any) -> Path:
    """A local directory as is; anything else is treated as a Hub repo id and downloaded.

    Only safetensors/JSON/Markdown/PNG files are fetched: we never download pickles. The download
    runs under :func:`hub_call` (``timeout`` seconds, default :func:`hub_timeout`), so a Hub that does
    not answer, a missing repo or a garbage answer is a one-line :class:`~hf_clroute.errors.HubError`
    naming the repo and the server.
    """
    path = Path(path_or_repo_id).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise UserInputError(f"{path_or_repo_id} is a file; expected an adapter directory or a Hub repo id")
    if looks_local(str(path_or_repo_id)):
        raise FileNotFoundError(f"no adapter directory at {path_or_repo_id}")
    from huggingface_hub import snapshot_download

    repo_id = str(path_or_repo_id)
    local = hub_call(
        lambda: snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.md", "*.png"], **hub_kwargs),
        what=f"adapter {repo_id!r}", revision=hub_kwargs.get("revision"), timeout=timeout,
    )
    return Path(local)


# ---- Hub calls: a deadline, and errors that name the repo and the server ----
HUB_TIMEOUT_ENV = "HF_CLROUTE_HUB_TIMEOUT"
DEFAULT_HUB_TIMEOUT = 60.0


def hub_timeout() -> float:
    """Seconds a Hub call (an adapter download, a push) may take before it is abandoned:
    ``$HF_CLROUTE_HUB_TIMEOUT``, else 60."""
    raw = os.environ.get(HUB_TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_HUB_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise UserInputError(f"{HUB_TIMEOUT_ENV}={raw!r} must be a finite number of seconds above 0")
    return value


def hub_endpoint() -> str:
    """The Hub (or Hub-compatible server) the client talks to: ``HF_ENDPOINT`` as the client read it."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_call(fn: Callable[[], Any], *, what: str, revision: str | None = None, timeout: float | None = None) -> Any:
    """``fn()`` (a ``huggingface_hub`` call) with a deadline, its errors turned into one-line
    :class:`~hf_clroute.errors.HubError` errors naming ``what`` (e.g. ``adapter 'me/x'``) and the server.

    The client itself waits without limit on some requests (a commit) and retries others, so a
    server that accepts and never answers would hang the caller: the call runs in a daemon thread
    and is abandoned after ``timeout`` seconds (default :func:`hub_timeout`).
    """
    timeout = hub_timeout() if timeout is None else timeout
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as err:  # handed to the caller's thread below
            outcome["error"] = err

    worker = threading.Thread(target=target, name=f"hf_clroute hub call: {what}", daemon=True)
    worker.start()
    worker.join(timeout)
    endpoint = hub_endpoint()
    if worker.is_alive():  # abandoned, not cancelled: a late answer may still complete it
        raise HubError(f"the Hub at {endpoint} did not answer within {timeout:g} s ({what}); "
                       f"set {HUB_TIMEOUT_ENV} to wait longer")
    if "error" in outcome:
        err = outcome["error"]
        raise HubError(describe_hub_error(err, what, endpoint, revision)) from err
    return outcome["value"]


def describe_hub_error(err: BaseException, what: str, endpoint: str, revision: str | None = None) -> str:
    """One line for a failed Hub call: not found, not JSON, timed out, unreachable, or the server's own words."""
    from huggingface_hub import errors as hub_errors

    chain = _causes(err)
    found = {type(e).__name__: e for e in chain}
    if any(isinstance(e, hub_errors.RevisionNotFoundError) for e in chain):
        return f"revision {revision!r} of {what} not found on {endpoint}"
    if any(isinstance(e, hub_errors.RepositoryNotFoundError) for e in chain):
        return f"{what} not found on {endpoint}"
    answered = _http_answer(chain, endpoint, what)
    if answered:
        return answered
    if any(isinstance(e, json.JSONDecodeError) for e in chain):
        return (f"the Hub at {endpoint} answered ({what}) with something that is not JSON: "
                f"{_first_line(found['JSONDecodeError'])}")
    if any(isinstance(e, TimeoutError) or "Timeout" in type(e).__name__ for e in chain):
        return f"the Hub at {endpoint} did not answer in time ({what}): {_first_line(err)}"
    if any("ConnectError" in type(e).__name__ or isinstance(e, ConnectionError) for e in chain):
        return f"could not reach the Hub at {endpoint} ({what}): {_first_line(err)}"
    if any(isinstance(e, hub_errors.LocalEntryNotFoundError) for e in chain):
        return f"{what} is not in the local cache, and the Hub at {endpoint} is off (HF_HUB_OFFLINE=1) or unreachable"
    if any(isinstance(e, hub_errors.EntryNotFoundError) for e in chain):
        return f"{what} on {endpoint} lacks a file: {_first_line(err)}"
    return f"the Hub at {endpoint} failed ({what}): {type(err).__name__}: {_first_line(err)}"


def _http_answer(chain: list[BaseException], endpoint: str, what: str) -> str | None:
    """The server's own answer, when one in ``chain`` was an HTTP error (a 500, a 429, a 403...); None when
    none was, or when it was a 404 (the not-found cases above and below name what was not found)."""
    from http import HTTPStatus

    for err in chain:
        status = getattr(getattr(err, "response", None), "status_code", None)
        if not isinstance(status, int) or status < 400 or status == 404:
            continue
        try:
            reason = f" {HTTPStatus(status).phrase}"
        except ValueError:
            reason = ""
        said = getattr(err, "server_message", None) or ""
        said = f": {' '.join(said.split())[:200]}" if said.strip() else ""
        advice = "; the server failed, try again later" if status >= 500 else ""
        return f"the Hub at {endpoint} answered HTTP {status}{reason} ({what}){said}{advice}"
    return None


def _causes(err: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# ---- which files hold an adapter ----
#: hf_clroute's own files, in every directory it saves (before 0.2, a non-PEFT adapter used PEFT's names)
CONFIG_NAME = "hf_clroute_config.json"
WEIGHTS_NAME = "hf_clroute_model.safetensors"
#: PEFT's files, written beside ours only by a method that is PEFT's own (LoRA, prompt tuning)
PEFT_CONFIG_NAME = "adapter_config.json"
PEFT_WEIGHTS_NAME = "adapter_model.safetensors"


def adapter_config_file(directory: str | os.PathLike, source: str | os.PathLike | None = None) -> Path:
    """The file holding hf_clroute's config in an adapter directory, in any layout:
    ``hf_clroute_config.json``, or (saved before 0.2) an ``adapter_config.json`` without ``peft_type``.
    A PEFT adapter without our config is pointed to PEFT."""
    directory, source = Path(directory), source or directory
    ours, theirs = directory / CONFIG_NAME, directory / PEFT_CONFIG_NAME
    if ours.is_file():
        return ours
    if not theirs.is_file():
        raise FileNotFoundError(
            f"no {CONFIG_NAME} (nor an older {PEFT_CONFIG_NAME}) in {source}: not an hf_clroute adapter")
    peft_type = read_json(theirs).get("peft_type")
    if peft_type:
        raise UserInputError(f"{source} holds a PEFT {peft_type} adapter without hf_clroute's {CONFIG_NAME}; "
                             "load it with peft.PeftModel.from_pretrained")
    return theirs


def is_adapter_dir(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` holds a saved hf_clroute adapter (either layout, config and weights)."""
    try:
        config = adapter_config_file(directory)
    except (FileNotFoundError, UserInputError):
        return False
    weights = WEIGHTS_NAME if config.name == CONFIG_NAME else PEFT_WEIGHTS_NAME
    return (Path(directory) / weights).is_file()


def read_json(path: str | os.PathLike, what: str = "") -> dict[str, Any]:
    """A JSON object from ``path``; a file that is not one is an error naming it (``what``: e.g. "run config")."""
    name = f"{what} {path}" if what else str(path)
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise UserInputError(f"{name} is not valid JSON{'' if what else ' (corrupted checkpoint?)'}: {err}") from err
    if not isinstance(data, dict):
        raise UserInputError(f"{name} must hold a JSON object, not {'a ' if what else ''}{type(data).__name__}")
    return data


def looks_local(text: str) -> bool:
    """Whether a name that is not a directory was meant as a local path, not a Hub repo id:
    it starts with ``./``, ``../``, ``/`` or ``~``, has more than one ``/`` (a repo id has one),
    or its parent directory exists here (``runs/typo`` beside an existing ``runs/``)."""
    if text.startswith(("./", "../", "/", "~", "." + os.sep, ".." + os.sep, os.sep)) or text in (".", ".."):
        return True
    if text.replace(os.sep, "/").count("/") > 1:
        return True
    parent = Path(text).parent
    return str(parent) not in ("", ".") and parent.is_dir()


def refuse_pickles(directory: Path, expected: str) -> None:
    """Raise when a directory holds pickle weights instead of the safetensors we expect."""
    if (directory / expected).is_file():
        return
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(
            f"{directory} holds pickle file(s) {pickles} but no {expected}; hf_clroute refuses to "
            "load pickles (they can run arbitrary code). Convert the weights to safetensors."
        )
    raise FileNotFoundError(f"no {expected} in {directory}")


# ---- pushing to the Hub (or any Hub-compatible server at ``HF_ENDPOINT``) ----
class HubPushError(RuntimeError):
    """A push failed; the local files are untouched."""


def push_folder(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    commit_message: str = "Upload hf_clroute adapter",
    what: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    timeout: float | None = None,
    repo_type: str | None = None,
    delete_patterns: list[str] | None = None,
) -> str:
    """Create the repo if needed and upload ``folder`` in one commit; returns the commit URL
    (with ``create_pr``, the pull request's).

    ``repo_type``: None (a model repo) or ``"dataset"``; ``delete_patterns``: the repo's files an earlier push
    left that this commit removes (those ``folder`` brings again are replaced).

    ``revision``: the branch to commit to, created from main when missing (as transformers'
    ``push_to_hub`` does); with ``create_pr`` the commit opens a pull request against it instead.
    The whole push has one deadline (``timeout``, default :func:`hub_timeout`). ``what`` names what
    the caller pushed in an error (``folder`` is often a temporary staging directory, gone by the
    time the user reads the message)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)

    target = f"dataset {repo_id!r}" if repo_type == "dataset" else repr(repo_id)

    def push() -> Any:
        api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True)
        if revision is not None and not create_pr and not revision.startswith("refs/"):
            api.create_branch(repo_id, repo_type=repo_type, branch=revision, exist_ok=True)
        return api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type=repo_type,
                                 commit_message=commit_message, revision=revision, create_pr=create_pr or None,
                                 delete_patterns=delete_patterns)

    try:
        info = hub_call(push, what=f"push to {target}", revision=revision, timeout=timeout)
    except HubError as err:  # the message never holds the token: only the error's type and words
        raise HubPushError(f"push of {what or folder} to {target} failed: {err}; local files are intact") from err
    return str(getattr(info, "pr_url", None) or info) if create_pr else str(info)


def push_adapter(model: Any, repo_id: str, *, extra_dir: str | os.PathLike | None = None,
                 card: str | None = None, **kwargs) -> str:
    """Save ``model`` (plus files in ``extra_dir``, e.g. a card and plots) and push them.

    ``card`` is written as ``README.md`` unless ``extra_dir`` brings its own
    (``CLModel.push_to_hub`` passes a minimal card from the adapter's config).
    """
    with tempfile.TemporaryDirectory(prefix="hf_clroute_push_") as tmp:
        if extra_dir is not None:
            shutil.copytree(extra_dir, tmp, dirs_exist_ok=True)
        if card is not None and not (Path(tmp) / "README.md").exists():
            atomic_write_text(Path(tmp) / "README.md", card)
        model.save_pretrained(Path(tmp))  # keeps the card as README.md (adding the line that loads it if missing)
        what = f"this {model.config.method} adapter"
        what = f"{extra_dir} with {what}" if extra_dir else what
        return push_folder(tmp, repo_id, what=kwargs.pop("what", what), **kwargs)
