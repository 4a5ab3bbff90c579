"""Load an adapter by its repo id or directory alone, as PEFT's ``AutoPeftModel`` does.

The adapter records its backbone (``base_model_name_or_path``, the Hub commit it was loaded
at, a fingerprint of its config); ``AutoCLModel.from_pretrained`` loads that backbone with
transformers (through :func:`hf_clroute.backbones.load_backbone`, so ViT, BERT and char-level
GPT-2 with their processors all work), then attaches the adapter to it::

    model = AutoCLModel.from_pretrained("me/my-adapter")
    model, processor = AutoCLModel.from_pretrained("me/my-adapter", return_processor=True)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .backbones import load_backbone
from .config import CLConfig
from .io import looks_local, resolve_pretrained_dir
from .model import CLModel


class AutoCLModel:
    """Builds a :class:`~hf_clroute.model.CLModel` with its recorded backbone; not instantiated."""

    def __init__(self) -> None:
        raise TypeError("AutoCLModel is not instantiated; use AutoCLModel.from_pretrained(repo_id_or_path)")

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo_id: str | os.PathLike,
        revision: str | None = None,
        *,
        return_processor: bool = False,
        backbone_kwargs: dict[str, Any] | None = None,
        **hub_kwargs: Any,
    ) -> CLModel | tuple[CLModel, Any]:
        """The adapter at a local directory or Hub repo id on the backbone it was saved on.

        ``revision`` is the adapter repo's (branch, tag or commit); the backbone loads at the commit
        recorded in the adapter (its main branch when none was recorded: it came from a local
        directory or was loaded without :func:`~hf_clroute.backbones.load_backbone`), and the
        fingerprint check of ``CLModel.from_pretrained`` refuses it if its config has changed since.
        ``backbone_kwargs`` go to the backbone's ``from_pretrained`` (e.g. ``attn_implementation``),
        ``hub_kwargs`` (``token``, ``cache_dir``, ``force_download``) to the adapter's download.
        With ``return_processor``: ``(model, processor)``, the backbone's image processor or tokenizer.
        """
        directory = resolve_pretrained_dir(path_or_repo_id, revision=revision, **hub_kwargs)
        config = CLConfig.from_pretrained(directory)
        base = config.base_model_name_or_path
        if not base:
            raise ValueError(
                f"adapter {path_or_repo_id} records no backbone (base_model_name_or_path); load the backbone "
                "yourself and use CLModel.from_pretrained(backbone, ...)"
            )
        is_dir = Path(base).expanduser().is_dir()
        if ":" in base and not is_dir:
            raise ValueError(
                f"adapter {path_or_repo_id} records backbone {base!r}, a bench suite's backbone name rather than a Hub "
                "id or a directory; load it with hf_clroute.bench.suites.load_suite_backbone and use "
                "CLModel.from_pretrained(backbone, ...)"
            )
        if looks_local(base) and not is_dir:
            raise FileNotFoundError(
                f"adapter {path_or_repo_id} was saved on the local backbone {base!r}, which is not on this machine; "
                "load that backbone yourself and use CLModel.from_pretrained(backbone, ...)"
            )
        backbone, processor = load_backbone(base, revision=config.base_model_revision, **(backbone_kwargs or {}))
        model = CLModel.from_pretrained(backbone, directory)
        return (model, processor) if return_processor else model


__all__ = ["AutoCLModel"]
