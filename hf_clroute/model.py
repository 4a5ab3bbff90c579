"""The wrapper that attaches a continual method to an unmodified HF backbone.

``get_cl_model(backbone, config)`` freezes the backbone (unless the method trains
it), adds a classification head that grows with the stream for image/text
backbones (``config.head``: the incremental linear head, or a closed-form
statistics head that the model itself feeds in ``after_step`` and solves in
``before_evaluation``), and lets the method add its own modules.
``save_pretrained`` writes only what the method changed (PEFT-like
``adapter_config.json`` + ``adapter_model.safetensors``): every trainable tensor,
every buffer the method or head added, and the non-tensor state (head size and
settings, counters, slot statistics) as JSON in the safetensors metadata, guarded by
a checksum of the tensor bytes so a corrupted file is refused, not half-loaded.
A method that is PEFT's own (LoRA, prompt tuning) is saved in PEFT's format, with
the rest beside it (see ``save_pretrained``).

The adapter records its backbone: name, Hub commit and a fingerprint of the config
(:func:`backbone_fingerprint`); ``from_pretrained`` refuses a backbone with another
fingerprint, and ``hf_clroute.AutoCLModel`` loads the recorded backbone itself.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from .backbones import get_backbone_spec, get_base_model, loaded_revision, pooled_features
from .config import CONFIG_NAME, PEFT_LAYOUT_CONFIG_NAME, CLConfig
from .heads import StatisticsHead, build_head
from .io import atomic_path, atomic_write_text, refuse_pickles, resolve_pretrained_dir
from .methods.base import ContinualMethod, StepContext
from .labels import record_labels
from .outputs import CLModelOutput, backbone_inputs, model_inputs
from .registry import get_method

WEIGHTS_NAME = "adapter_model.safetensors"
#: beside PEFT's own files, in a directory saved in PEFT's format: our tensors that are not PEFT's
#: (head, class statistics), the non-tensor state, and the checksum of both weight files
PEFT_LAYOUT_WEIGHTS_NAME = "hf_clroute_model.safetensors"
_STATE_KEY = "hf_clroute.state"
_CHECKSUM_KEY = "hf_clroute.sha256"
_PEFT_KEYS_KEY = "hf_clroute.peft_keys"


class CLModel(nn.Module):
    """A backbone + incremental head + one continual method, saved as an adapter."""

    def __init__(self, backbone: nn.Module, config: CLConfig) -> None:
        super().__init__()
        # A backbone another CLModel already adapted (README's `same = type(model).from_pretrained(backbone,
        # ...)` right after training on `backbone`) is not adapted twice, which would stack a second
        # adapter on the first: this model is built on a copy of the backbone as it was before then.
        revision = loaded_revision(backbone)
        backbone = _unadapted_copy(backbone)
        skeleton = _skeleton(backbone)
        self.spec = get_backbone_spec(backbone)
        entry = get_method(config.method)
        if not isinstance(config, entry.config_class):
            raise ValueError(f"config for {config.method!r} must be a {entry.config_class.__name__}")
        method = entry.method_class(config)
        if self.spec.modality not in method.supported_modalities:
            raise ValueError(
                f"method {config.method!r} supports {method.supported_modalities} backbones, "
                f"not a {self.spec.modality} backbone ({backbone.config.model_type}) {method.unsupported_hint}".rstrip()
            )
        self.config = config
        # Image/text classification works on the base model's pooled features; an
        # LM keeps its own LM head.
        self.backbone = backbone if self.spec.modality == "lm" else get_base_model(backbone)
        if config.base_model_name_or_path is None:
            config.base_model_name_or_path = getattr(backbone, "name_or_path", None) or None
        if config.base_model_revision is None and config.base_model_name_or_path == getattr(backbone, "name_or_path", None):
            config.base_model_revision = revision
        if config.base_model_fingerprint is None:
            config.base_model_fingerprint = backbone_fingerprint(backbone)
        if config.freeze_backbone:
            self.backbone.requires_grad_(False)
        # The backbone's own tensors stay on its own checkpoint and are never saved
        # here unless trained. Tracked by identity, not name, so a method may wrap or
        # rename modules (PEFT's LoRA moves weights under `base_layer`). Strong
        # references keep the ids from being reused if a method drops a module.
        self._original_tensors = [*self.backbone.parameters(), *self.backbone.buffers()]
        self.head: nn.Module | None = None
        if self.spec.modality != "lm" and method.uses_head:
            self.head = build_head(config.head, self.spec.hidden_size(self.backbone), **config.head_build_options())
        elif config.head != "linear":
            owner = "a causal LM keeps its own LM head" if self.spec.modality == "lm" else "it has its own classifier"
            raise ValueError(f"method {config.method!r} cannot use head {config.head!r}: {owner}; leave head='linear'")
        self.method = method
        method.attach(self)
        _ADAPTED[backbone] = skeleton

    # ---- forward ---------------------------------------------------------------
    def extract_features(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Pooled backbone features; precomputed ``features`` in the batch are used as is
        (the bench caches them for methods that leave the frozen backbone untouched)."""
        if "features" in inputs:
            return inputs["features"]
        outputs = self.backbone(**backbone_inputs(inputs))
        return pooled_features(self.spec, outputs, inputs.get("attention_mask"))

    def reads_frozen_features(self) -> bool:
        """True when the classifier sees only the frozen backbone's pooled features, so
        precomputed features (``extract_features``) can stand in for the inputs with identical
        results: every backbone tensor is frozen, no backbone module was replaced or wrapped by an
        adapter (routed attention, LoRA, patch FFNs), no hook changes its forward (visual prompts),
        and the method reads the backbone's own pooled features."""
        if self.spec.modality == "lm" or any(p.requires_grad for p in self.backbone.parameters()):
            return False
        for module in self.backbone.modules():
            if type(module).__module__.startswith(("hf_clroute", "peft")):
                return False
            if module._forward_hooks or module._forward_pre_hooks:
                return False
        return type(self.method).features is ContinualMethod.features

    def forward(self, **batch: torch.Tensor) -> CLModelOutput:
        """One call per step, as in Accelerate's examples: ``out = model(**batch)``.

        ``out.logits`` are over every class seen so far (a causal LM: next-token logits);
        with ``labels`` in the batch, ``out.loss`` is the method's whole loss (named terms
        in ``out.losses``), computed here so the graph runs under DDP as one forward.
        """
        return self.method(self, batch)

    # ---- the engine's hooks: the model's own bookkeeping, then the method's -------
    def begin_task(self, experience: Any, ctx: StepContext) -> None:
        """An experience starts (the head has grown to its classes): its class names and
        dataset labels join ``config.id2label`` / ``class_order`` / ``training_history``
        (refused when they collide with the classes the adapter knows), then the method's hook."""
        record_labels(self.config, experience)
        self.method.begin_task(self, experience, ctx)

    @torch.no_grad()
    def predict(self, **inputs: torch.Tensor) -> list[str]:
        """The predicted class name of every example of a batch, from ``config.id2label``
        (``str(id)`` for an id without a recorded name), e.g.
        ``model.predict(**processor(images=images, return_tensors="pt"))``."""
        if self.spec.modality == "lm":
            raise ValueError("predict() names classes; a causal-LM adapter predicts tokens (use the logits or generate)")
        was_training = self.training
        self.eval()
        try:
            logits = self(**model_inputs(inputs)).logits
        finally:
            self.train(was_training)
        id2label = self.config.id2label or {}
        return [id2label.get(i, str(i)) for i in logits.argmax(-1).tolist()]

    def after_step(self, batch: dict[str, torch.Tensor], out: CLModelOutput, ctx: StepContext) -> None:
        """After every training step (every batch, for models with nothing to train).

        A statistics head adds the batch's ``out.features`` (what the classifier read) to its
        pending sums. With several processes, process 0 adds the whole global batch, gathered
        without the samples repeated to even out a last batch, and the others add nothing:
        :meth:`before_evaluation` sums over processes, so every example counts exactly once.
        """
        if isinstance(self.head, StatisticsHead):
            features, labels = out.features, batch["labels"]
            if ctx.num_processes > 1:
                features, labels = ctx.gather(features), ctx.gather(labels)
            if ctx.process_index == 0:
                self.head.accumulate(features, labels)
        self.method.after_step(self, batch, out, ctx)

    def before_evaluation(self, ctx: StepContext) -> None:
        """Before every evaluation or checkpoint: fold in statistics pending on any process
        (a statistics head's sums are reduced over processes and its classifier re-solved)."""
        if isinstance(self.head, StatisticsHead):
            self.head.sync(ctx.reduce)
        self.method.before_evaluation(self, ctx)

    def end_task(self, experience: Any, ctx: StepContext) -> None:
        """After an experience's last batch."""
        self.method.on_task_end(self, experience, ctx)

    def grow_head(self, num_classes: int) -> None:
        """Grow the head to ``num_classes`` outputs (never shrinks).

        New rows of a linear head come from a generator seeded by (head_init_seed,
        current size), so they are the same whether or not the run was stopped and
        resumed before. A statistics head grows with zero statistics (unseen classes
        score -inf until they have examples).
        """
        if self.head is None or num_classes <= self.head.num_classes:
            return
        if isinstance(self.head, StatisticsHead):
            self.head.grow(num_classes)
        else:
            seed = self.config.head_init_seed * 1_000_003 + self.head.num_classes
            self.head.grow(num_classes, generator=torch.Generator().manual_seed(seed))

    # ---- bookkeeping -----------------------------------------------------------
    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def parameter_counts(self) -> dict[str, float]:
        backbone_total = sum(p.numel() for k, p in self.backbone.named_parameters())
        trainable = sum(p.numel() for p in self.trainable_parameters())
        return {
            "trainable_params": trainable,
            "backbone_params": backbone_total,
            "trainable_pct": 100.0 * trainable / max(backbone_total, 1),
        }

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor the adapter owns: all but the frozen, untouched backbone tensors."""
        # A method that trains the backbone may freeze parts of it for a while (APN's
        # FFN-only adaptation): its weights still belong to the adapter.
        original = set() if not self.config.freeze_backbone else {id(t) for t in self._original_tensors}
        keep = {n for n, p in self.named_parameters(remove_duplicate=False) if p.requires_grad or id(p) not in original}
        keep |= {n for n, b in self.named_buffers(remove_duplicate=False) if id(b) not in original}
        return {key: tensor for key, tensor in self.state_dict().items() if key in keep}

    def extra_state(self) -> dict[str, Any]:
        state = {
            "num_classes": self.head.num_classes if self.head is not None else 0,
            "method": self.method.extra_state(),
        }
        if isinstance(self.head, StatisticsHead):
            state["head"] = self.head.extra_state()
        return state

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`extra_state` before the tensors load: the head (and the method's
        grown modules) take the saved shapes, so the saved tensors fit them exactly."""
        if isinstance(self.head, StatisticsHead) and "head" in state:
            self.head.load_extra_state(state["head"])
        else:
            self.grow_head(int(state.get("num_classes", 0)))
        self.method.load_extra_state(state.get("method", {}))

    # ---- saving and loading ------------------------------------------------------
    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """Write the adapter, each file atomically: ``adapter_config.json`` + ``adapter_model.safetensors``.

        A method that is PEFT's own (LoRA, prompt tuning) is written in PEFT's format, so
        ``peft.PeftModel.from_pretrained(backbone, directory)`` loads it as any PEFT adapter: those two
        names hold PEFT's config and PEFT's tensors, under PEFT's names. What PEFT has no place for
        (our config, the head, class statistics, state) lies beside them in ``hf_clroute_config.json``
        + ``hf_clroute_model.safetensors``, whose checksum covers both weight files. ``from_pretrained``
        and ``AutoCLModel`` read either layout.
        """
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        # Tied or shared tensors cannot be saved twice by safetensors; clone them.
        tensors = {k: v.detach().contiguous().clone().cpu() for k, v in self.adapter_state_dict().items()}
        metadata = {
            "format": "pt",
            _STATE_KEY: json.dumps(self.extra_state(), sort_keys=True),
            _CHECKSUM_KEY: tensor_checksum(tensors),
        }
        export = self.method.peft_adapter(self)
        if export is None:
            _write_safetensors(directory / WEIGHTS_NAME, tensors, metadata)
            self.config.save_pretrained(directory)
            # A PEFT-format adapter saved here before would only confuse a reader.
            for stale in (PEFT_LAYOUT_WEIGHTS_NAME, PEFT_LAYOUT_CONFIG_NAME):
                (directory / stale).unlink(missing_ok=True)
            return
        peft_config, peft_keys = export
        peft_tensors = {peft_keys[key]: tensors.pop(key) for key in peft_keys}
        _write_safetensors(directory / WEIGHTS_NAME, peft_tensors, {"format": "pt"})  # what PEFT writes
        metadata[_PEFT_KEYS_KEY] = json.dumps(peft_keys, sort_keys=True)
        _write_safetensors(directory / PEFT_LAYOUT_WEIGHTS_NAME, tensors, metadata)
        self._save_peft_config(peft_config, directory)
        atomic_write_text(directory / PEFT_LAYOUT_CONFIG_NAME, self.config.to_json_string())

    def _save_peft_config(self, peft_config: Any, directory: Path) -> None:
        """PEFT's ``adapter_config.json``, written by PEFT itself (then moved into place), naming the
        recorded backbone and its commit as PEFT's ``PeftModel.save_pretrained`` would."""
        peft_config = copy.deepcopy(peft_config)
        peft_config.base_model_name_or_path = self.config.base_model_name_or_path
        peft_config.revision = self.config.base_model_revision
        peft_config.inference_mode = True
        # Without a task type PEFT records the base model's class, so AutoPeftModel can build it.
        base_class = type(self.backbone)
        auto_mapping = None if peft_config.task_type else {
            "base_model_class": base_class.__name__, "parent_library": base_class.__module__,
        }
        with tempfile.TemporaryDirectory(prefix=".peft_config.", dir=directory) as staging:
            peft_config.save_pretrained(staging, auto_mapping_dict=auto_mapping)
            os.replace(Path(staging) / CONFIG_NAME, directory / CONFIG_NAME)

    @classmethod
    def from_pretrained(
        cls, backbone: nn.Module, path_or_repo_id: str | os.PathLike, **hub_kwargs: Any
    ) -> "CLModel":
        """Rebuild the adapter saved at a local dir or Hub repo id on ``backbone``.

        Like PEFT's ``from_pretrained`` the adapter is attached to ``backbone`` itself, unless
        another CLModel already adapted that backbone object (e.g. the model just trained on
        it): then the adapter is attached to a copy of the backbone as it was before, and the
        other model is left as it is.
        """
        directory = resolve_pretrained_dir(path_or_repo_id, **hub_kwargs)
        refuse_pickles(directory, WEIGHTS_NAME)
        config = CLConfig.from_pretrained(directory)
        check_backbone(config, backbone, source=str(path_or_repo_id))
        model = cls(backbone, config)
        model.load_adapter_weights(directory, source=str(path_or_repo_id))
        return model

    def load_adapter_weights(self, directory: str | os.PathLike, source: str | None = None) -> None:
        """Restore a saved adapter's state into this model: non-tensor state first (so grown
        heads/slots are resized), then the tensors. Used by from_pretrained and by resume."""
        tensors, metadata = read_adapter_dir(Path(directory))
        self.load_extra_state(json.loads(metadata.get(_STATE_KEY, "{}")))
        device = next(self.parameters()).device
        self.load_adapter_state_dict({k: v.to(device) for k, v in tensors.items()}, source=source or str(directory))

    def load_adapter_state_dict(self, tensors: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        expected = self.adapter_state_dict()
        missing = sorted(set(expected) - set(tensors))
        unexpected = sorted(set(tensors) - set(expected))
        mismatched = [
            f"{k}: checkpoint {tuple(tensors[k].shape)} vs model {tuple(v.shape)}"
            for k, v in expected.items()
            if k in tensors and tensors[k].shape != v.shape
        ]
        if missing or unexpected or mismatched:
            raise ValueError(
                f"adapter checkpoint {source} does not match this model/backbone: "
                f"missing={missing[:10]} unexpected={unexpected[:10]} shape_mismatch={mismatched[:10]}"
            )
        self.load_state_dict(tensors, strict=False)

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> str:
        """Save to a temporary dir and upload it in one commit, with a minimal model card (method,
        base model, labels, training history; ``hf-clroute push`` writes the bench's full card);
        see ``hf_clroute.io.push_folder``."""
        from .io import push_adapter
        from .model_card import minimal_card

        card = minimal_card(self.config, repo_id, peft_format=self.method.peft_adapter(self) is not None)
        return push_adapter(self, repo_id, **{"card": card, **kwargs})


#: backbone -> (a copy of its module structure from before a CLModel adapted it, sharing its
#: tensors, and the parameters' requires_grad flags then); None when it could not be copied.
_ADAPTED: "weakref.WeakKeyDictionary[nn.Module, tuple[nn.Module, list[bool]] | None]" = weakref.WeakKeyDictionary()


def _skeleton(backbone: nn.Module) -> tuple[nn.Module, list[bool]] | None:
    """The backbone's modules copied as they are now, sharing (not copying) its tensors: cheap,
    and enough to rebuild it unadapted later, since an adapter never changes frozen tensors and
    saves every tensor it trains."""
    tensors = [*backbone.parameters(), *backbone.buffers()]
    try:
        skeleton = copy.deepcopy(backbone, {id(t): t for t in tensors})
    except Exception:  # a backbone that cannot be deep-copied: a second adapter is refused instead
        return None
    return skeleton, [p.requires_grad for p in skeleton.parameters()]


def _unadapted_copy(backbone: nn.Module) -> nn.Module:
    """``backbone`` itself the first time; after a CLModel adapted it, a full copy of it as it was then."""
    if backbone not in _ADAPTED:
        return backbone
    entry = _ADAPTED[backbone]
    if entry is None:
        raise ValueError(
            "this backbone is already adapted by another CLModel and cannot be copied; load a fresh backbone "
            "for each model (e.g. `backbone, processor = load_backbone(name)`)"
        )
    skeleton, requires_grad = entry
    fresh = copy.deepcopy(skeleton)
    for parameter, flag in zip(fresh.parameters(), requires_grad, strict=True):
        parameter.requires_grad_(flag)
    first = next(iter(fresh.parameters()), None)
    return fresh.to(first.device) if first is not None and first.device.type != "meta" else fresh


def tensor_checksum(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for key in sorted(tensors):
        digest.update(key.encode())
        # reshape(-1): a 0-dim tensor (a counter buffer) cannot be viewed as bytes; same bytes otherwise
        digest.update(tensors[key].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        return load_file(str(path)), metadata
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"corrupted adapter checkpoint {path}: {err}") from err


def read_adapter_dir(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """An adapter's tensors (under our names) + our metadata, from either layout (see
    ``CLModel.save_pretrained``), refusing truncated, corrupted or tampered files."""
    path = directory / WEIGHTS_NAME
    tensors, metadata = _read_safetensors(path)
    if _CHECKSUM_KEY not in metadata and (directory / PEFT_LAYOUT_WEIGHTS_NAME).is_file():
        # PEFT's format: PEFT's tensors back under our names, beside the rest of ours.
        peft_tensors = tensors
        path = directory / PEFT_LAYOUT_WEIGHTS_NAME
        tensors, metadata = _read_safetensors(path)
        ours = {peft: key for key, peft in json.loads(metadata.get(_PEFT_KEYS_KEY, "{}")).items()}
        if set(peft_tensors) != set(ours):
            raise ValueError(f"corrupted adapter checkpoint {directory}: {WEIGHTS_NAME} holds {sorted(peft_tensors)[:5]}, "
                             f"{PEFT_LAYOUT_WEIGHTS_NAME} names {sorted(ours)[:5]}")
        tensors.update({ours[name]: tensor for name, tensor in peft_tensors.items()})
    expected = metadata.get(_CHECKSUM_KEY)
    if expected is None:
        raise ValueError(f"{path} was not written by hf_clroute (no checksum in its metadata)")
    if tensor_checksum(tensors) != expected:
        raise ValueError(f"corrupted adapter checkpoint {path}: tensor checksum does not match")
    return tensors, metadata


# ---- which backbone an adapter belongs to -------------------------------------------------
#: config fields that do not define the backbone's architecture: where it was loaded from, the
#: library version, labels and settings of a task head the base model drops, output and dtype choices
_NOT_ARCHITECTURE = frozenset({
    "_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype", "id2label", "label2id",
    "num_labels", "problem_type", "finetuning_task", "task_specific_params", "output_attentions",
    "output_hidden_states", "return_dict", "use_cache", "tokenizer_class", "prefix", "torchscript",
})


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


def check_backbone(config: CLConfig, backbone: nn.Module, source: str) -> None:
    """Refuse a backbone whose fingerprint differs from the one the adapter recorded, naming both;
    warn when only the names differ (a local copy of a Hub model, say)."""
    recorded_name, given_name = config.base_model_name_or_path or "", getattr(backbone, "name_or_path", "") or ""
    recorded, given = recorded_name or "an unnamed backbone", given_name or "an unnamed backbone"
    fingerprint = backbone_fingerprint(backbone)
    if config.base_model_fingerprint is not None and config.base_model_fingerprint != fingerprint:
        raise ValueError(
            f"adapter {source} was saved on backbone {recorded!r} (fingerprint {config.base_model_fingerprint}); "
            f"the backbone given, {given!r} (fingerprint {fingerprint}), does not match it: another architecture or "
            f"config. Load {recorded!r}, or use hf_clroute.AutoCLModel.from_pretrained({source!r})"
        )
    # A bench alias ('pretrained-vit:mnist') names no loadable model: only the fingerprint says anything.
    if recorded_name and given_name and ":" not in recorded_name and not _same_name(recorded_name, given_name):
        warnings.warn(
            f"adapter {source} was saved on backbone {recorded!r} and is loaded onto {given!r}: the names differ, "
            "the config fingerprints match", stacklevel=3,
        )


def _same_name(a: str, b: str) -> bool:
    if os.path.isdir(a) and os.path.isdir(b):
        return os.path.samefile(a, b)
    return a.rstrip("/") == b.rstrip("/")


def get_cl_model(backbone: nn.Module, config: CLConfig) -> CLModel:
    """Attach the continual method described by ``config`` to ``backbone`` (PEFT's get_peft_model)."""
    return CLModel(backbone, config)


__all__ = ["CLModel", "get_cl_model", "CONFIG_NAME", "WEIGHTS_NAME"]
