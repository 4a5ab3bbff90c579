"""Which backbone an adapter belongs to: its name, revision and fingerprints.

An adapter records the backbone it was created on (``CLConfig.base_model_*``): the name (a Hub id,
a directory, or a package backbone name such as ``pretrained-vit:vit-mnist-stream``, never a cache
directory), the Hub commit (or ``sha256:<hex>`` of a committed backbone's weights) and a
fingerprint of its config and of a few of its weight tensors. Loading refuses a backbone of
another architecture, and one of the same architecture with other weights unless asked to
(``allow_backbone_mismatch``): an adapter on other weights scores near chance without a word.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from typing import Any

import torch
from torch import nn

from hf_clroute.backbones.catalog import get_base_model, is_backbone_name, loaded_name
from hf_clroute.core.config import CLConfig
from hf_clroute.errors import UserInputError

#: config fields that do not define the backbone's architecture: where it was loaded from, the
#: library version, labels and settings of a task head the base model drops, output and dtype choices
_NOT_ARCHITECTURE = frozenset({
    "_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype", "id2label", "label2id",
    "num_labels", "problem_type", "finetuning_task", "task_specific_params", "output_attentions",
    "output_hidden_states", "return_dict", "use_cache", "tokenizer_class", "prefix", "torchscript",
})
#: how many weight tensors, and values of each, the weights fingerprint reads
_SAMPLED_TENSORS, _SAMPLED_VALUES = 8, 4096


def backbone_fingerprint(model_or_config: Any) -> str:
    """``'<model_type>:<hash>'`` of a backbone config's architecture-defining fields, the same for a
    local copy and its Hub original, and for a task model and its base model; any change of shape,
    vocabulary, norm epsilon or activation changes it. Only fields that differ from the config class's
    defaults count, so a field a newer transformers adds (at its default) leaves it as it was."""
    config = getattr(model_or_config, "config", model_or_config)
    try:
        defaults = type(config)().to_dict()
    except (TypeError, ValueError):  # a config class without defaults for everything: every field counts
        defaults = {}
    fields = {
        k: v for k, v in config.to_dict().items()
        if k not in _NOT_ARCHITECTURE and not k.startswith("_") and (k not in defaults or defaults[k] != v)
    }
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()
    return f"{config.model_type}:{digest[:16]}"


@torch.no_grad()
def weights_fingerprint(backbone: nn.Module) -> str | None:
    """``'w<hash>'`` of a few of the backbone's weight tensors, sampled deterministically: 8 tensors
    evenly spaced in name order, up to 4096 evenly strided values of each, rounded to bfloat16 (so a
    copy loaded in float32 or bfloat16 gives the same hash). Names are the base model's, so a task
    model and its base model agree; a pooler (initialised afresh when a checkpoint without one is
    loaded) is left out. None when the weights cannot be read here (meta or sharded tensors)."""
    base = get_base_model(backbone)
    named = sorted((n, p) for n, p in base.named_parameters() if "pooler" not in n.split("."))
    if not named:
        return None
    picks = sorted({round(i * (len(named) - 1) / max(_SAMPLED_TENSORS - 1, 1)) for i in range(_SAMPLED_TENSORS)})
    digest = hashlib.sha256()
    try:
        for index in picks:
            name, tensor = named[index]
            flat = tensor.detach().reshape(-1)
            values = flat[:: max(1, flat.numel() // _SAMPLED_VALUES)][:_SAMPLED_VALUES]
            digest.update(f"{name}:{tuple(tensor.shape)}".encode())
            digest.update(values.to("cpu", torch.float32).to(torch.bfloat16).view(torch.int16).numpy().tobytes())
    except (RuntimeError, NotImplementedError, TypeError):  # meta, sharded or quantised tensors
        return None
    return "w" + digest.hexdigest()[:16]


def recorded_fingerprint(backbone: nn.Module) -> str:
    """What an adapter records of its backbone: ``'<model_type>:<config hash>:w<weights hash>'``
    (:func:`backbone_fingerprint`, then :func:`weights_fingerprint` when the weights can be read)."""
    weights = weights_fingerprint(backbone)
    return backbone_fingerprint(backbone) + (f":{weights}" if weights else "")


def _split_fingerprint(fingerprint: str) -> tuple[str, str | None]:
    """(config part, weights part or None) of a recorded fingerprint (adapters before 0.2 have no weights part)."""
    parts = fingerprint.split(":")
    if len(parts) == 3 and parts[2].startswith("w"):
        return ":".join(parts[:2]), parts[2]
    return fingerprint, None


def record_backbone(config: CLConfig, backbone: nn.Module, name: str | None, revision: str | None,
                    fingerprint: str) -> None:
    """Fill in what ``config`` does not say yet about its backbone: the name ``load_backbone`` was given
    (a Hub id or a package backbone name, never a cache directory) or the model's own ``name_or_path``;
    the Hub commit or, for a committed ``pretrained-vit:<name>``, the sha256 of its weights; and
    :func:`recorded_fingerprint`."""
    own = getattr(backbone, "name_or_path", None) or None
    if config.base_model_name_or_path is None:
        config.base_model_name_or_path = name or own
    recorded = config.base_model_name_or_path
    if config.base_model_revision is None:
        if recorded is not None and recorded in (name, own):
            config.base_model_revision = revision
        elif recorded is not None and is_backbone_name(recorded):  # the bench names its suite's backbone
            from hf_clroute.backbones.assets import asset_revision

            config.base_model_revision = asset_revision(recorded)
    if config.base_model_fingerprint is None:
        config.base_model_fingerprint = fingerprint


def check_backbone(config: CLConfig, backbone: nn.Module, source: str, fingerprint: str, *,
                   allow_mismatch: bool = False, suggest_auto: bool = True) -> None:
    """Refuse a backbone the adapter was not saved on, naming both fingerprints:

    * another architecture or config (:func:`backbone_fingerprint`): always refused;
    * the same architecture with other weights (:func:`weights_fingerprint`): refused unless
      ``allow_mismatch``, which warns instead. An adapter that saves every backbone tensor (its
      backbone is not frozen) does not depend on the weights given, and is not checked; one saved
      before weights were fingerprinted loads with a warning.

    ``fingerprint``: the backbone's :func:`recorded_fingerprint` (from before any adapter trained it).
    Warns when only the names differ (a local copy of a Hub model, say)."""
    recorded_name, given_name = config.base_model_name_or_path or "", getattr(backbone, "name_or_path", "") or ""
    unnamed = "an unnamed backbone"
    recorded, given = recorded_name or unnamed, loaded_name(backbone) or given_name or unnamed
    if config.base_model_fingerprint is None:
        return
    saved_config, saved_weights = _split_fingerprint(config.base_model_fingerprint)
    given_config, given_weights = _split_fingerprint(fingerprint)
    load_hint = f"load {recorded!r} (hf_clroute.backbones.catalog.load_backbone)"
    if suggest_auto:
        load_hint += f", or load both with hf_clroute.AutoCLModel.from_pretrained({source!r})"
    if saved_config != given_config:
        raise UserInputError(
            f"adapter {source} was saved on backbone {recorded!r} (fingerprint {saved_config}); "
            f"the backbone given, {given!r} (fingerprint {given_config}), does not match it: another architecture or "
            f"config. {load_hint[0].upper()}{load_hint[1:]}"
        )
    if config.freeze_backbone and saved_weights is None:
        warnings.warn(f"adapter {source} records no weights fingerprint of its backbone "
                      f"(saved by an older hf_clroute): the weights of {given!r} cannot be checked against "
                      f"{recorded!r}'s", stacklevel=3)
    elif config.freeze_backbone and given_weights is not None and saved_weights != given_weights:
        message = (f"adapter {source} was saved on backbone {recorded!r} with weights fingerprint {saved_weights}; "
                   f"the backbone given, {given!r}, has its architecture but other weights (fingerprint "
                   f"{given_weights}), so the adapter's scores on it mean nothing")
        if not allow_mismatch:
            raise UserInputError(f"{message}. To use it, {load_hint}; to load it anyway, pass "
                                 "allow_backbone_mismatch=True")
        warnings.warn(f"{message} (allow_backbone_mismatch=True)", stacklevel=3)
    # A package backbone name ('pretrained-vit:...') names no directory: only the fingerprint says anything.
    if recorded_name and given_name and not is_backbone_name(recorded_name) and ":" not in recorded_name \
            and not _same_name(recorded_name, given_name) and recorded_name != loaded_name(backbone):
        warnings.warn(
            f"adapter {source} was saved on backbone {recorded!r} and is loaded onto {given_name!r}: the names differ, "
            "the fingerprints match", stacklevel=3,
        )


def _same_name(a: str, b: str) -> bool:
    if os.path.isdir(a) and os.path.isdir(b):
        return os.path.samefile(a, b)
    return a.rstrip("/") == b.rstrip("/")


__all__ = ["backbone_fingerprint", "check_backbone", "record_backbone", "recorded_fingerprint", "weights_fingerprint"]
