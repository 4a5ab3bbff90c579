"""Load an adapter by its repo id or directory alone, as PEFT's ``AutoPeftModel`` does.

The adapter records its backbone (``base_model_name_or_path``, the Hub commit it was loaded
at, a fingerprint of its config and weights); ``AutoCLModel.from_pretrained`` loads that backbone
(through :func:`hf_clroute.backbones.catalog.load_backbone`, so ViT, BERT and char-level GPT-2 with their
processors all work, and so do the package's own backbone names: ``pretrained-vit:<name>``, the
committed ViTs, installed into the cache when missing, and ``minilm``), then attaches the adapter::

    model = AutoCLModel.from_pretrained("me/my-adapter")
    model, processor = AutoCLModel.from_pretrained("me/my-adapter", return_processor=True)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hf_clroute.backbones.catalog import is_backbone_name, load_backbone
from hf_clroute.core.model import CLModel, load_config
from hf_clroute.errors import UserInputError
from hf_clroute.hub.io import looks_local, resolve_pretrained_dir


class AutoCLModel:
    """Builds a :class:`~hf_clroute.core.model.CLModel` with its recorded backbone; not instantiated."""

    def __init__(self) -> None:
        raise TypeError("AutoCLModel is not instantiated; use AutoCLModel.from_pretrained(repo_id_or_path)")

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo_id: str | os.PathLike,
        revision: str | None = None,
        *,
        return_processor: bool = False,
        is_trainable: bool = False,
        allow_backbone_mismatch: bool = False,
        backbone_kwargs: dict[str, Any] | None = None,
        **hub_kwargs: Any,
    ) -> CLModel | tuple[CLModel, Any]:
        """The adapter at a local directory or Hub repo id on the backbone it was saved on.

        ``revision`` is the adapter repo's (branch, tag or commit); the backbone loads at the commit
        recorded in the adapter (its main branch when none was recorded: it came from a local
        directory or was loaded without :func:`~hf_clroute.backbones.catalog.load_backbone`), and the
        fingerprint check of ``CLModel.from_pretrained`` refuses it if its config or weights have
        changed since (``allow_backbone_mismatch=True`` loads other weights with a warning). The
        model is in eval mode and frozen, or in train mode with a trainable adapter with
        ``is_trainable=True``. ``backbone_kwargs`` go to the backbone's ``from_pretrained`` (e.g.
        ``attn_implementation``), ``hub_kwargs`` (``token``, ``cache_dir``, ``force_download``,
        ``timeout``) to the adapter's download. With ``return_processor``: ``(model, processor)``,
        the backbone's image processor or tokenizer.
        """
        source = str(path_or_repo_id)
        directory = resolve_pretrained_dir(path_or_repo_id, revision=revision, **hub_kwargs)
        config = load_config(directory, source)
        base = config.base_model_name_or_path
        if not base:
            raise UserInputError(
                f"adapter {source} records no backbone (base_model_name_or_path); load the backbone "
                "yourself and use CLModel.from_pretrained(backbone, ...)"
            )
        is_dir = Path(base).expanduser().is_dir()
        if ":" in base and not is_dir and not is_backbone_name(base):
            raise UserInputError(
                f"adapter {source} records backbone {base!r}, which this package cannot build by name (it resolves "
                "Hub ids, directories, 'pretrained-vit:<name>' and 'minilm'; a bench stand-in, 'standin:<name>', is "
                "built by hf_clroute.bench.harness.suites.resolve_backbone_path); load it with "
                "hf_clroute.backbones.catalog.load_backbone and use CLModel.from_pretrained(backbone, ...)"
            )
        if looks_local(base) and not is_dir:
            raise FileNotFoundError(
                f"adapter {source} was saved on the local backbone {base!r}, which is not on this machine; "
                "load that backbone yourself and use CLModel.from_pretrained(backbone, ...)"
            )
        backbone, processor = load_backbone(base, revision=config.base_model_revision, **(backbone_kwargs or {}))
        model = CLModel._load(backbone, directory, source, is_trainable, allow_backbone_mismatch, suggest_auto=False)
        return (model, processor) if return_processor else model


__all__ = ["AutoCLModel"]
