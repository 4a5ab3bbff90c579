"""The pretrained backbones committed with the package, installed into the cache and re-verified.

``hf_clroute/backbones/pretraining/assets/<name>/`` holds a built checkpoint: its small files as they are,
the weights xz-compressed, and ``SHA256SUMS`` of the files as installed. A backbone named
``pretrained-vit:<name>`` (what the bench records in an adapter) resolves here, in the core, so
``AutoCLModel.from_pretrained`` loads such an adapter alone:

* :func:`installed_asset_path` installs the asset into ``cache_dir()/models/<name>`` when it is
  missing, and re-checks a cached copy against the asset's ``SHA256SUMS`` once per process per
  file; a copy that does not match (an older build left in the cache) is replaced from the
  asset, with a warning;
* :func:`asset_revision` is the asset's identity beside its name: the sha256 of its weights.

Building an asset (training) stays in :mod:`hf_clroute.backbones.pretraining.recipes`.
"""

from __future__ import annotations

import lzma
import os
import shutil
import tempfile
import warnings
from pathlib import Path

from hf_clroute.errors import UserInputError
from hf_clroute.hub.io import sha256_file

PREFIX = "pretrained-vit:"
CHECKSUMS_NAME = "SHA256SUMS"  # `sha256sum -c SHA256SUMS` format, over the installed (decompressed) files
WEIGHTS_FILE = "model.safetensors"
ASSET_FILES = ("config.json", "preprocessor_config.json", WEIGHTS_FILE, "pretrain_report.json", "README.md")
# Only the weights are worth compressing; xz is lossless, so the installed file is byte-identical.
COMPRESSED = {WEIGHTS_FILE: WEIGHTS_FILE + ".xz"}

#: (path, size, mtime_ns, expected sha256) of every installed file verified by this process
_VERIFIED: set[tuple[str, int, int, str]] = set()


def assets_root() -> Path:
    """``hf_clroute/backbones/pretraining/assets``: shipped as package data, so an installed wheel has it."""
    return Path(__file__).resolve().parent / "pretraining" / "assets"


def models_dir() -> Path:
    """Where installed backbones live: ``cache_dir()/models``."""
    from hf_clroute.data.sources import cache_dir

    return cache_dir() / "models"


def available_assets(root: Path | None = None) -> list[str]:
    root = root or assets_root()
    return sorted(p.name for p in root.iterdir() if (p / CHECKSUMS_NAME).is_file()) if root.is_dir() else []


def asset_name(backbone: str) -> str | None:
    """``'vit-mnist-stream'`` for ``'pretrained-vit:vit-mnist-stream'``; None for any other name."""
    return backbone[len(PREFIX):] if backbone.startswith(PREFIX) else None


def committed_asset(name: str) -> Path:
    """The committed asset ``name``; an unknown one is an error listing those there are."""
    path = assets_root() / name
    if not (path / CHECKSUMS_NAME).is_file():
        raise UserInputError(f"no committed pretrained backbone {PREFIX}{name}; this hf_clroute ships "
                             f"{[PREFIX + a for a in available_assets()]}")
    return path


def resolve_asset(backbone: str) -> str:
    """The installed directory of ``pretrained-vit:<name>`` (installed or re-verified here)."""
    name = asset_name(backbone)
    if name is None:
        raise UserInputError(f"{backbone!r} is not a committed backbone name ({PREFIX}<name>)")
    return str(installed_asset_path(committed_asset(name), models_dir() / name))


def asset_revision(backbone: str) -> str | None:
    """``'sha256:<hex>'`` of the committed weights of ``pretrained-vit:<name>``: with the name, the
    backbone's identity (the asset can be rebuilt under the same name). None for another name."""
    name = asset_name(backbone)
    if name is None or not (assets_root() / name / CHECKSUMS_NAME).is_file():
        return None
    return "sha256:" + read_checksums(assets_root() / name / CHECKSUMS_NAME)[WEIGHTS_FILE]


def read_checksums(path: Path) -> dict[str, str]:
    sums = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            sums[name.lstrip("*")] = digest
    return sums


def install_asset(asset: Path, out: Path) -> None:
    """Copy (and decompress) ``asset`` into ``out``; every file must match ``SHA256SUMS``."""
    sums = read_checksums(asset / CHECKSUMS_NAME)
    for name in ASSET_FILES:
        stored = asset / COMPRESSED.get(name, name)
        if name not in sums or not stored.is_file():
            raise FileNotFoundError(f"pretrained-ViT asset {asset} is incomplete: it needs {stored.name} "
                                    f"and its sha256 in {CHECKSUMS_NAME}")
        expected = sums[name]
        if name in COMPRESSED:
            with lzma.open(stored) as src, open(out / name, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copyfile(stored, out / name)
        actual = sha256_file(out / name)
        if actual != expected:
            raise ValueError(
                f"pretrained-ViT asset {asset}: {name} has sha256 {actual}, but {CHECKSUMS_NAME} says {expected}; "
                f"the asset is damaged (reinstall the package) or edited (rebuild it with "
                f"`python training/pretrain_vit.py --recipe {asset.name} --out <dir> --asset`)"
            )
    shutil.copyfile(asset / CHECKSUMS_NAME, out / CHECKSUMS_NAME)


def mismatched_files(asset: Path, installed: Path) -> list[str]:
    """The files of ``installed`` that are missing or differ from the asset's ``SHA256SUMS``
    (each file hashed once per process while it stays unchanged on disk)."""
    bad = []
    for name, expected in read_checksums(asset / CHECKSUMS_NAME).items():
        path = installed / name
        if not path.is_file():
            bad.append(name)
            continue
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns, expected)
        if key in _VERIFIED:
            continue
        if sha256_file(path) != expected:
            bad.append(name)
        else:
            _VERIFIED.add(key)
    return bad


def installed_asset_path(asset: Path, final: Path) -> Path:
    """``final`` holding exactly ``asset``: installed when missing; a copy whose files differ from
    the asset's ``SHA256SUMS`` is replaced from the asset with a warning. Files are written into a
    temporary sibling renamed into place when complete, so an interrupted or concurrent install
    never leaves a half-written checkpoint under the final name."""
    if final.is_dir():
        bad = mismatched_files(asset, final)
        if not bad:
            return final
        warnings.warn(f"the cached backbone {final} differs from the committed asset {asset} ({', '.join(bad)} "
                      f"do not match its {CHECKSUMS_NAME}: an older build?); replacing it from the asset", stacklevel=2)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.installing-", dir=final.parent))
    try:
        install_asset(asset, tmp)
        if final.is_dir() and not mismatched_files(asset, final):
            return final  # another process installed it meanwhile: a copy it may be reading stays put
        if final.exists():  # the stale copy: renamed away first, so no moment shows a half-deleted one
            trash = Path(tempfile.mkdtemp(prefix=f".{final.name}.stale-", dir=final.parent))
            os.replace(final, trash / final.name)
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.replace(tmp, final)  # atomic on one filesystem; fails if another install won the race
        except OSError:
            if mismatched_files(asset, final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


__all__ = ["PREFIX", "asset_name", "asset_revision", "available_assets", "installed_asset_path", "resolve_asset"]
