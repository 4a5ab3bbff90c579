"""The wrapper that attaches a continual method to an unmodified HF backbone.

``get_cl_model(backbone, config)`` freezes the backbone (unless the method trains
it), adds a classification head that grows with the stream for image/text
backbones (``config.head``: the incremental linear head, or a closed-form
statistics head that the model itself feeds in ``after_step`` and solves in
``before_evaluation``), and lets the method add its own modules.
``save_pretrained`` writes only what the method changed (``hf_clroute_config.json`` +
``hf_clroute_model.safetensors``, PEFT-like in our own names): every trainable tensor,
every buffer the method or head added, and the non-tensor state (head size and
settings, counters, slot statistics) as JSON in the safetensors metadata, guarded by
a checksum of the tensor bytes so a corrupted file is refused, not half-loaded.
A method that is PEFT's own (LoRA, prompt tuning) also writes PEFT's own
``adapter_config.json`` + ``adapter_model.safetensors`` (see ``save_pretrained``); directories
saved before 0.2, with our config under PEFT's names, still load.

The adapter records its backbone: name (a Hub id, or a package backbone name such as
``pretrained-vit:vit-mnist-stream``), the Hub commit or the committed weights' sha256, and a
fingerprint of its config and of a few of its weight tensors (:func:`recorded_fingerprint`);
``from_pretrained`` refuses a backbone with another fingerprint, and ``hf_clroute.AutoCLModel``
loads the recorded backbone itself. Like transformers and PEFT, a loaded adapter is in eval mode
and frozen unless ``is_trainable=True``.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import os
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from hf_clroute.backbones.catalog import (
    FixedInEval,
    get_backbone_spec,
    get_base_model,
    loaded_name,
    loaded_revision,
    pooled_features,
)
from hf_clroute.core.backbone_identity import (
    backbone_fingerprint,
    check_backbone,
    record_backbone,
    recorded_fingerprint,
)
from hf_clroute.core.config import CLConfig
from hf_clroute.core.labels import record_labels
from hf_clroute.core.method import ContinualMethod, StepContext
from hf_clroute.core.outputs import CLModelOutput, backbone_inputs, model_inputs
from hf_clroute.core.registry import get_method
from hf_clroute.errors import UserInputError
from hf_clroute.heads import StatisticsHead, build_head
from hf_clroute.hub.io import (
    CONFIG_NAME,
    PEFT_CONFIG_NAME,
    PEFT_WEIGHTS_NAME,
    WEIGHTS_NAME,
    adapter_config_file,
    atomic_path,
    atomic_write_text,
    read_json,
    refuse_pickles,
    resolve_pretrained_dir,
    sort_safetensors_header,
)

#: our weights in every layout (before 0.2, the name of the PEFT-format layout's own file)
PEFT_LAYOUT_WEIGHTS_NAME = WEIGHTS_NAME
_STATE_KEY = "hf_clroute.state"
_CHECKSUM_KEY = "hf_clroute.sha256"
_PEFT_KEYS_KEY = "hf_clroute.peft_keys"
_PEFT_CHECKSUM_KEY = "hf_clroute.peft_sha256"


class CLModel(nn.Module):
    """A backbone + incremental head + one continual method, saved as an adapter."""

    def __init__(self, backbone: nn.Module, config: CLConfig) -> None:
        super().__init__()
        # A backbone another CLModel already adapted (README's `same = type(model).from_pretrained(backbone,
        # ...)` right after training on `backbone`) is not adapted twice, which would stack a second
        # adapter on the first: this model is built on a copy of the backbone as it was before then.
        revision, name = loaded_revision(backbone), loaded_name(backbone)
        fingerprint = _fingerprint_before_adaptation(backbone)
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
        record_backbone(config, backbone, name, revision, fingerprint)
        if config.freeze_backbone:
            self.backbone.requires_grad_(False)
        # The backbone's own tensors stay on its own checkpoint and are never saved
        # here unless trained. Tracked by identity, not name, so a method may wrap or
        # rename modules (PEFT's LoRA moves weights under `base_layer`). Strong
        # references keep the ids from being reused if a method drops a module.
        self._original_tensors = [*self.backbone.parameters(), *self.backbone.buffers()]
        # A base model's pooler is never read (features are pooled from the hidden states), and is initialised
        # afresh, unseeded, when the checkpoint has none: never saved, so two identical runs save the same bytes.
        pooler = getattr(self.backbone, "pooler", None) if self.spec.modality != "lm" else None
        self._unread = {id(t) for t in [*pooler.parameters(), *pooler.buffers()]} if pooler is not None else set()
        self.head: nn.Module | None = None
        if self.spec.modality != "lm" and method.uses_head:
            self.head = build_head(config.head, self.spec.hidden_size(self.backbone), **config.head_build_options())
        elif config.head != "linear":
            owner = "a causal LM keeps its own LM head" if self.spec.modality == "lm" else "it has its own classifier"
            raise ValueError(f"method {config.method!r} cannot use head {config.head!r}: {owner}; leave head='linear'")
        self.method = method
        method.attach(self)
        _ADAPTED[backbone] = skeleton, fingerprint

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
        return self._fixed_features(wrappers=("hf_clroute", "peft"))

    def reads_fixed_features(self) -> bool:
        """True when the features the classifier reads can no longer change: :meth:`reads_frozen_features`,
        or a frozen PEFT adapter (LoRA after first-session adaptation), whose eval-mode forward is a fixed
        function of the input. The trainer then scores a test split from features computed once; the
        bench's cache of the *bare* backbone's features still needs :meth:`reads_frozen_features`.
        A module of ours counts only when it declares itself a fixed function in eval mode
        (:class:`~hf_clroute.backbones.catalog.FixedInEval`: RwF's routed attention once its routers froze, APN's
        patch FFNs once frozen); others (prompt attention) may carry state the stream changes."""
        return self._fixed_features(wrappers=("hf_clroute",), fixed_ours=True)

    def _fixed_features(self, wrappers: tuple[str, ...], fixed_ours: bool = False) -> bool:
        if self.spec.modality == "lm" or any(p.requires_grad for p in self.backbone.parameters()):
            return False
        for module in self.backbone.modules():
            declared = fixed_ours and isinstance(module, FixedInEval) and module.fixed_state() is not None
            if type(module).__module__.startswith(wrappers) and not declared:
                return False
            if module._forward_hooks or module._forward_pre_hooks:
                return False
        return type(self.method).features is ContinualMethod.features

    def features_fingerprint(self) -> torch.Tensor:
        """Per tensor the features are computed from (the backbone's parameters and buffers, and what its
        fixed modules of ours read from outside it: RwF's routers), its sum and sum of squares: features
        kept while :meth:`reads_fixed_features` stand only while this is unchanged (a method could
        unfreeze a tensor within a task and freeze it again by its end)."""
        tensors = [*self.backbone.parameters(), *self.backbone.buffers()]
        for module in self.backbone.modules():
            if isinstance(module, FixedInEval):
                tensors += module.fixed_state() or []
        with torch.no_grad():
            return torch.stack([torch.stack([t.double().sum(), t.double().square().sum()]) for t in tensors])

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
            raise ValueError(
                "predict() names classes; a causal-LM adapter predicts tokens (use the logits or generate)")
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

    def backbone_parameters(self) -> list[nn.Parameter]:
        """The backbone's own parameters as loaded, recorded by identity before the method attached: a method
        may add modules inside the backbone's blocks, which ``backbone.parameters()`` would then include."""
        return [t for t in self._original_tensors if isinstance(t, nn.Parameter)]

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor the adapter owns: all but the frozen, untouched backbone tensors."""
        # A method that trains the backbone may freeze parts of it for a while (APN's
        # FFN-only adaptation): its weights still belong to the adapter.
        original = set() if not self.config.freeze_backbone else {id(t) for t in self._original_tensors}
        keep = {n for n, p in self.named_parameters(remove_duplicate=False)
                if (p.requires_grad or id(p) not in original) and id(p) not in self._unread}
        keep |= {n for n, b in self.named_buffers(remove_duplicate=False) if id(b) not in original | self._unread}
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
    def save_pretrained(self, save_directory: str | os.PathLike, is_main_process: bool = True,
                        safe_serialization: bool = True, **kwargs: Any) -> None:
        """Write the adapter, each file atomically: ``hf_clroute_config.json`` + ``hf_clroute_model.safetensors``
        and a README.md saying how to load it (:func:`write_readme`).

        A method that is PEFT's own (LoRA, prompt tuning) also writes PEFT's format, so
        ``peft.PeftModel.from_pretrained(backbone, directory)`` loads it as any PEFT adapter:
        ``adapter_config.json`` + ``adapter_model.safetensors`` hold PEFT's config and PEFT's tensors,
        under PEFT's names; our config, the head, class statistics and state lie beside them in our
        two files, whose checksum covers both weight files. Every other method writes our two files
        only, so transformers and PEFT never take it for a PEFT adapter.

        The signature is transformers': ``is_main_process=False`` writes nothing (the other processes
        of a distributed run), ``safe_serialization=False`` is refused (we write safetensors only),
        ``push_to_hub=True`` pushes the adapter too (``repo_id``, default the directory's name, and
        ``push_to_hub``'s keywords), and other keywords transformers takes (``max_shard_size``...) are
        accepted and have no effect: an adapter is one small file.
        """
        if not safe_serialization:
            raise UserInputError("save_pretrained(safe_serialization=False): hf_clroute writes safetensors only "
                                 "(pickle files can run code when loaded); leave safe_serialization=True")
        push = kwargs.pop("push_to_hub", False)
        if not is_main_process:
            return
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
            # PEFT's files from an earlier save here, or our own from before 0.2, would only confuse a reader.
            for stale in (PEFT_WEIGHTS_NAME, PEFT_CONFIG_NAME):
                (directory / stale).unlink(missing_ok=True)
        else:
            peft_config, peft_keys = export
            peft_tensors = {peft_keys[key]: tensors.pop(key) for key in peft_keys}
            _write_safetensors(directory / PEFT_WEIGHTS_NAME, peft_tensors, {"format": "pt"})  # what PEFT writes
            metadata[_PEFT_KEYS_KEY] = json.dumps(peft_keys, sort_keys=True)
            metadata[_PEFT_CHECKSUM_KEY] = tensor_checksum(peft_tensors)  # a damaged file is named: this one
            self._save_peft_config(peft_config, directory)
        _write_safetensors(directory / WEIGHTS_NAME, tensors, metadata)
        atomic_write_text(directory / CONFIG_NAME, self.config.to_json_string())
        write_readme(directory, self.config, peft=export is not None)
        if push:
            hub_keys = ("token", "private", "commit_message", "revision", "create_pr", "timeout")
            self.push_to_hub(kwargs.pop("repo_id", directory.resolve().name),
                             **{k: kwargs[k] for k in hub_keys if k in kwargs})

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
            os.replace(Path(staging) / PEFT_CONFIG_NAME, directory / PEFT_CONFIG_NAME)

    @classmethod
    def from_pretrained(
        cls, backbone: nn.Module, path_or_repo_id: str | os.PathLike, *, is_trainable: bool = False,
        allow_backbone_mismatch: bool = False, **hub_kwargs: Any,
    ) -> "CLModel":
        """Rebuild the adapter saved at a local dir or Hub repo id on ``backbone``.

        As in transformers and PEFT the model comes back in eval mode with every parameter frozen;
        ``is_trainable=True`` returns it in train mode with the adapter's parameters trainable, to
        continue training. A backbone of another architecture is refused; one of the same
        architecture with other weights too (:func:`check_backbone`), unless
        ``allow_backbone_mismatch=True``, which loads it with a warning.

        Like PEFT's ``from_pretrained`` the adapter is attached to ``backbone`` itself, unless
        another CLModel already adapted that backbone object (e.g. the model just trained on
        it): then the adapter is attached to a copy of the backbone as it was before, and the
        other model is left as it is. ``hub_kwargs`` (``revision``, ``token``, ``force_download``,
        ``timeout``...) go to the adapter's download.
        """
        directory = resolve_pretrained_dir(path_or_repo_id, **hub_kwargs)
        return cls._load(backbone, directory, str(path_or_repo_id), is_trainable, allow_backbone_mismatch)

    @classmethod
    def _load(cls, backbone: nn.Module, directory: Path, source: str, is_trainable: bool,
              allow_backbone_mismatch: bool, suggest_auto: bool = True) -> "CLModel":
        config = load_config(directory, source)
        check_backbone(config, backbone, source, _fingerprint_before_adaptation(backbone),
                       allow_mismatch=allow_backbone_mismatch, suggest_auto=suggest_auto)
        model = cls(backbone, config)
        model.load_adapter_weights(directory, source=source)
        if is_trainable:
            return model.train()
        model.requires_grad_(False)
        return model.eval()

    def load_adapter_weights(self, directory: str | os.PathLike, source: str | None = None) -> None:
        """Restore a saved adapter's state into this model: non-tensor state first (so grown
        heads/slots are resized), then the tensors. Used by from_pretrained and by resume."""
        tensors, metadata = read_adapter_dir(Path(directory))
        self.load_extra_state(json.loads(metadata.get(_STATE_KEY, "{}")))
        device = next(self.parameters()).device
        self.load_adapter_state_dict({k: v.to(device) for k, v in tensors.items()}, source=source or str(directory))

    def load_adapter_state_dict(self, tensors: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        expected = self.adapter_state_dict()
        unread = {n for n, t in [*self.named_parameters(), *self.named_buffers()] if id(t) in self._unread}
        missing = sorted(set(expected) - set(tensors))
        unexpected = sorted(set(tensors) - set(expected) - unread)  # an adapter saved with its pooler loads
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

    def push_to_hub(self, repo_id: str, *, revision: str | None = None, create_pr: bool = False, **kwargs: Any) -> str:
        """Save to a temporary dir and upload it in one commit, with a minimal model card (method,
        base model, labels, training history; ``hf-clroute push`` writes the bench's full card).
        ``revision``: the branch to push to (created when missing); ``create_pr``: open a pull request
        instead of committing; ``token``, ``private``, ``commit_message``, ``timeout`` (seconds, default
        ``$HF_CLROUTE_HUB_TIMEOUT`` or 60) as in ``hf_clroute.hub.io.push_folder``. Returns the commit
        (or pull request) URL."""
        from hf_clroute.core.model_card import minimal_card, peft_auto_class
        from hf_clroute.hub.io import push_adapter

        export = self.method.peft_adapter(self)
        peft_format = peft_auto_class(export[0].task_type) if export is not None else False
        card = minimal_card(self.config, repo_id, peft_format=peft_format)
        return push_adapter(self, repo_id, **{"card": card, **kwargs}, revision=revision, create_pr=create_pr)


#: backbone -> ((a copy of its module structure from before a CLModel adapted it, sharing its
#: tensors, and the parameters' requires_grad flags then; None when it could not be copied),
#: its fingerprint then)
_ADAPTED: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple[nn.Module, list[bool]] | None, str]]" = (
    weakref.WeakKeyDictionary())


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
    entry = _ADAPTED[backbone][0]
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


def _fingerprint_before_adaptation(backbone: nn.Module) -> str:
    """:func:`recorded_fingerprint` of ``backbone`` as it was before any CLModel adapted it (a method
    that trains the backbone changes its weights in place; the copy it was adapted from has not)."""
    if backbone in _ADAPTED:
        return _ADAPTED[backbone][1]
    return recorded_fingerprint(backbone)


def tensor_checksum(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for key in sorted(tensors):
        digest.update(key.encode())
        # reshape(-1): a 0-dim tensor (a counter buffer) cannot be viewed as bytes; same bytes otherwise
        digest.update(tensors[key].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Write atomically; a failed write (a full disk) is an ``OSError`` naming ``path``, not safetensors' own error."""
    with atomic_path(path) as tmp:
        try:
            save_file(tensors, str(tmp), metadata=metadata)
            sort_safetensors_header(tmp)  # the same bytes for the same tensors, in any process
        except SafetensorError as err:
            text = " ".join(str(err).split())
            full = "No space left" in text or "os error 28" in text
            raise OSError(errno.ENOSPC if full else errno.EIO, f"could not write {path}: {text}") from err


def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        return load_file(str(path)), metadata
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"corrupted adapter checkpoint {path}: {err}") from err


def load_config(directory: str | os.PathLike, source: str | os.PathLike | None = None) -> CLConfig:
    """The adapter's config from a local directory, in any layout
    (see :func:`hf_clroute.hub.io.adapter_config_file`)."""
    return CLConfig.from_dict(read_json(adapter_config_file(directory, source)))


def read_adapter_dir(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """An adapter's tensors (under our names) + our metadata, from any layout (see
    ``CLModel.save_pretrained``; before 0.2 a non-PEFT adapter's tensors were in PEFT's file name),
    refusing truncated, corrupted or tampered files and pickles."""
    path = directory / WEIGHTS_NAME
    if not path.is_file() and (directory / PEFT_WEIGHTS_NAME).is_file() and not (directory / CONFIG_NAME).is_file():
        path = directory / PEFT_WEIGHTS_NAME  # saved before 0.2: our tensors under PEFT's name
    refuse_pickles(directory, path.name)
    tensors, metadata = _read_safetensors(path)
    if _PEFT_KEYS_KEY in metadata:  # PEFT's format: PEFT's tensors back under our names, beside the rest of ours
        peft_tensors, _ = _read_safetensors(directory / PEFT_WEIGHTS_NAME)
        if metadata.get(_PEFT_CHECKSUM_KEY, tensor_checksum(peft_tensors)) != tensor_checksum(peft_tensors):
            raise ValueError(f"corrupted adapter checkpoint {directory / PEFT_WEIGHTS_NAME}: tensor checksum does not "
                             "match")
        ours = {peft: key for key, peft in json.loads(metadata[_PEFT_KEYS_KEY]).items()}
        if set(peft_tensors) != set(ours):
            raise ValueError(f"corrupted adapter checkpoint {directory}: {PEFT_WEIGHTS_NAME} holds "
                             f"{sorted(peft_tensors)[:5]}, {WEIGHTS_NAME} names {sorted(ours)[:5]}")
        tensors.update({ours[name]: tensor for name, tensor in peft_tensors.items()})
    expected = metadata.get(_CHECKSUM_KEY)
    if expected is None:
        raise ValueError(f"{path} was not written by hf_clroute (no checksum in its metadata)")
    if tensor_checksum(tensors) != expected:
        both = _PEFT_KEYS_KEY in metadata and _PEFT_CHECKSUM_KEY not in metadata  # one checksum over both files
        raise ValueError(f"corrupted adapter checkpoint {path}{f' (with {PEFT_WEIGHTS_NAME})' if both else ''}: "
                         "tensor checksum does not match")
    return tensors, metadata


def write_readme(directory: Path, config: CLConfig, peft: bool = False) -> None:
    """A short README.md saying the folder is an hf_clroute adapter and the line that loads it; a README already
    there (a model card) gets that line added when it lacks it."""
    line = 'model = AutoCLModel.from_pretrained("path/to/this/folder")  # or its Hub repo id, with its backbone'
    how = f"Load it with its backbone:\n\n```python\nfrom hf_clroute import AutoCLModel\n\n{line}\n```\n"
    readme = directory / "README.md"
    text = readme.read_text() if readme.is_file() else ""
    if text and "\n# hf_clroute adapter: " not in text:  # a model card: kept, with the line added when missing
        if "AutoCLModel" not in text:
            atomic_write_text(readme, text.rstrip("\n") + f"\n\n## Loading with hf_clroute\n\n{how}")
        return
    kind = ("It is also a PEFT adapter: `transformers.AutoModel.from_pretrained(folder)` and `peft.PeftModel` load "
            "the adapted backbone only, and `AutoModelFor*` adds the backbone checkpoint's own classifier (or a new, "
            "untrained one), not this adapter's head and labels" if peft else
            "It is not a transformers model: `transformers.AutoModel.from_pretrained` finds no `config.json` in it")
    atomic_write_text(readme, f"""---
library_name: hf_clroute
tags:
- hf_clroute
- continual-learning
---

# hf_clroute adapter: {config.method}

This folder is an hf_clroute continual-learning adapter (method `{config.method}`) for the backbone
`{config.base_model_name_or_path}`. {kind}. {how}""")


def get_cl_model(backbone: nn.Module, config: CLConfig) -> CLModel:
    """Attach the continual method described by ``config`` to ``backbone`` (PEFT's get_peft_model)."""
    return CLModel(backbone, config)


__all__ = [
    "CLModel", "get_cl_model", "load_config", "backbone_fingerprint", "CONFIG_NAME", "WEIGHTS_NAME", "PEFT_CONFIG_NAME",
    "PEFT_WEIGHTS_NAME",
]
