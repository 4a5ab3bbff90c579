"""The base adapter config shared by every method.

Modelled on PEFT's ``PeftConfig``: a dataclass whose fields each carry a ``help``
string, validated in ``__post_init__`` with errors that name the field, written as
JSON with sorted keys to ``hf_clroute_config.json`` (our own name: transformers and PEFT
read ``adapter_config.json`` as theirs). ``method`` says which registered method the config
belongs to, so ``CLConfig.from_pretrained`` can rebuild the right subclass from disk or from
the Hub, in either layout (:func:`hf_clroute.hub.io.adapter_config_file`).
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hf_clroute.hub.io import (
    CONFIG_NAME,
    adapter_config_file,
    atomic_write_text,
    read_json,
    resolve_pretrained_dir,
)
from hf_clroute.metrics.continual import SCENARIOS

#: hf_clroute's config in a directory saved in PEFT's own format (LoRA, prompt tuning): since 0.2
#: every layout's name (kept for code that imported it)
PEFT_LAYOUT_CONFIG_NAME = CONFIG_NAME


class LabelMap(dict):
    """``id2label`` as JSON stores it (string keys) that also answers an integer id:
    ``config.id2label[3] == config.id2label["3"]`` (an int, numpy or 0-d tensor id)."""

    @staticmethod
    def _as_key(key: Any) -> Any:
        if not isinstance(key, str) and hasattr(key, "__index__"):
            return str(operator.index(key))
        return key

    def __missing__(self, key: Any) -> str:
        alias = self._as_key(key)
        if alias is not key and dict.__contains__(self, alias):
            return dict.__getitem__(self, alias)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or dict.__contains__(self, self._as_key(key))

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default


@dataclass
class CLConfig:
    """Fields every continual adapter has; methods subclass this and add their own."""

    method: ClassVar[str] = ""

    base_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Backbone this adapter was attached to (local dir or Hub id); recorded, never saved."},
    )
    base_model_revision: str | None = field(
        default=None,
        metadata={
            "help": "The Hub commit the backbone was loaded at (recorded when `load_backbone` loaded it from the "
            "Hub), or 'sha256:<hex>' of a committed `pretrained-vit` backbone's weights; "
            "`AutoCLModel.from_pretrained` loads the backbone at this commit. None: a local backbone."
        },
    )
    base_model_fingerprint: str | None = field(
        default=None,
        metadata={
            "help": "'<model_type>:<config hash>:w<weights hash>': a hash of the backbone config's "
            "architecture-defining fields and of a few deterministically sampled weight tensors (recorded when the "
            "adapter is created); loading onto a backbone with another fingerprint is refused unless "
            "allow_backbone_mismatch=True. None: not recorded."
        },
    )
    scenario: str = field(
        default="class",
        metadata={"help": "Continual scenario: 'class' (one head, no task id), 'domain' or 'task' "
                          "(task id at test time)."},
    )
    head_init_seed: int = field(
        default=0,
        metadata={"help": "Seed for new head rows, so head growth is reproducible independent of the global RNG."},
    )
    freeze_backbone: bool = field(
        default=True,
        metadata={"help": "Freeze every original backbone parameter (methods that train the backbone set False)."},
    )
    current_task_loss: bool = field(
        default=False,
        metadata={
            "help": "Class-IL: cross-entropy over the current task's classes (plus any class in the batch, e.g. "
            "replayed ones) instead of every class seen so far, so new samples do not push old classes' head rows "
            "down (the L2P/CODA-Prompt convention). Honoured by every method that keeps the default loss; "
            "prediction always uses every seen class."
        },
    )
    head: str = field(
        default="linear",
        metadata={
            "help": "The classifier on the features: 'linear' (the incremental linear head, trained by the method's "
            "loss), 'cosine' (the same, normalised: logits = s * cos(row, features), a learned or fixed scale s; "
            "no row wins by its norm) or a closed-form statistics head fitted from class statistics of the "
            "features the classifier reads, with no gradient: 'prototype' (class means, NCM), 'lda' (streaming "
            "LDA: class means and a shared shrunk covariance) or 'ranpac' (random projection + ridge regression). "
            "Ignored by methods with their own classifier (they accept only 'linear')."
        },
    )
    head_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "Keyword options of the head, e.g. {'scale': 16.0, 'learn_scale': True} (cosine), "
            "{'metric': 'cosine'} (prototype), {'shrinkage': 1e-4} (lda), "
            "{'projection_dim': 2048, 'ridge_lambda': 1.0, 'nonlinearity': 'relu'} (ranpac). The head's size "
            "grows with the stream and the RanPAC projection seed follows head_init_seed, so neither is an option."
        },
    )

    #: head constructor keywords the model sets itself, with the reason given when one is passed.
    _MODEL_SET_HEAD_OPTIONS: ClassVar[dict[str, str]] = {
        "num_classes": "the head grows with the stream's classes",
        "generator": "new rows are seeded from head_init_seed",
        "seed": "the projection seed follows head_init_seed",
    }

    id2label: dict[str, str] | None = field(
        default=None,
        metadata={
            "help": "Head output id -> class name, as in transformers' configs (JSON keys are strings; "
            "`config.id2label[3]` also answers an integer id). Filled in by `CLModel.begin_task` from the "
            "experiences trained on: the dataset's ClassLabel names, else str(label). None: nothing recorded."
        },
    )
    label2id: dict[str, int] | None = field(
        default=None,
        metadata={"help": "Class name -> head output id; the inverse of `id2label` (derived from it when omitted)."},
    )
    class_order: list[int] | None = field(
        default=None,
        metadata={
            "help": "The dataset's own label id of head outputs 0..K-1, in order (the stream's class order; "
            "-1 where not recorded). Streams of another seed are matched to it by name, see hf_clroute.core.labels."
        },
    )
    training_history: list[dict[str, Any]] | None = field(
        default=None,
        metadata={
            "help": "One entry per task trained on, in order: {'stream', 'task', 'ids', 'classes'} "
            "(the stream's name, the task's name, its head ids and class names)."
        },
    )

    adaptation: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "First-session adaptation (APER/RanPAC's step), e.g. {'on': 'first_task', 'epochs': 5}: before "
            "the stream the engine trains the method's adapter with a temporary linear head on the first task "
            "(or on a split carved from its training data), freezes it, and the statistics head (head='prototype', "
            "'lda' or 'ranpac', required) then accumulates the whole stream on the adapted features in eval mode. "
            "Fields: hf_clroute.core.first_session_config.AdaptationConfig. None: no adaptation."
        },
    )
    adaptation_record: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "Filled in by the engine after the adaptation ran: {'on', 'task', 'classes', 'examples', "
            "'epochs'} (what data it saw). Set means done: a reloaded or resumed adapter is not adapted again."
        },
    )

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"{type(self).__name__}.scenario must be one of {SCENARIOS}, got {self.scenario!r}")
        self._check_head()
        self._check_adaptation()
        self._normalise_labels()

    def _check_adaptation(self) -> None:
        from hf_clroute.core.first_session_config import AdaptationConfig
        from hf_clroute.heads import STATISTICS_HEAD_KINDS

        name = type(self).__name__
        statistics = STATISTICS_HEAD_KINDS
        if self.adaptation_record is not None and not isinstance(self.adaptation_record, dict):
            raise ValueError(f"{name}.adaptation_record must be a dict or None, got {self.adaptation_record!r}")
        if self.adaptation is None:
            return
        # Stored as the validated dict with every field, so adapter_config.json shows what ran.
        self.adaptation = AdaptationConfig.from_value(self.adaptation, name).to_dict()
        if self.head not in statistics:
            raise ValueError(f"{name}.adaptation needs a statistics head (head one of {statistics}), got "
                             f"head={self.head!r}: the adapted features are read by a closed-form head")

    def adaptation_config(self) -> Any:
        """``adaptation`` as an :class:`~hf_clroute.core.first_session_config.AdaptationConfig` (None when off)."""
        from hf_clroute.core.first_session_config import AdaptationConfig

        return None if self.adaptation is None else AdaptationConfig(**self.adaptation)

    def _normalise_labels(self) -> None:
        """String keys for ``id2label`` (as JSON has them), ``label2id`` derived or checked against it."""
        name = type(self).__name__
        if self.id2label is not None:
            try:
                self.id2label = LabelMap((str(int(k)), str(v)) for k, v in self.id2label.items())
            except (TypeError, ValueError, AttributeError) as err:
                raise ValueError(f"{name}.id2label must map integer ids to names, got {self.id2label!r}") from err
            inverse = {v: int(k) for k, v in self.id2label.items()}
            if len(inverse) != len(self.id2label):
                raise ValueError(f"{name}.id2label gives one name to several ids: {dict(self.id2label)}")
            if self.label2id is None:
                self.label2id = dict(sorted(inverse.items(), key=lambda kv: kv[1]))
            else:
                self.label2id = {str(k): int(v) for k, v in self.label2id.items()}
                if self.label2id != inverse:
                    raise ValueError(
                        f"{name}.label2id {self.label2id} is not the inverse of id2label {dict(self.id2label)}")
        elif self.label2id is not None:
            raise ValueError(f"{name}.label2id is set but id2label is not; give id2label (label2id is derived)")
        if self.class_order is not None:
            self.class_order = [int(c) for c in self.class_order]

    def head_build_options(self) -> dict[str, Any]:
        """Keywords for ``build_head(self.head, in_features, **options)``: ``head_options`` plus the seed
        of a head that draws random weights (RanPAC's projection), taken from ``head_init_seed``."""
        from hf_clroute.heads import head_parameters

        options = dict(self.head_options)
        if "seed" in head_parameters(self.head):
            options["seed"] = self.head_init_seed
        return options

    def _check_head(self) -> None:
        from hf_clroute.heads import HEAD_KINDS, check_head_options

        name = type(self).__name__
        if not isinstance(self.head, str) or self.head not in HEAD_KINDS:
            raise ValueError(f"{name}.head must be one of {HEAD_KINDS}, got {self.head!r}")
        if not isinstance(self.head_options, dict) or not all(isinstance(k, str) for k in self.head_options):
            raise ValueError(f"{name}.head_options must be a dict of option names to values, got {self.head_options!r}")
        for key, reason in self._MODEL_SET_HEAD_OPTIONS.items():
            if key in self.head_options:
                raise ValueError(f"{name}.head_options cannot set {key!r}: {reason}")
        try:
            check_head_options(self.head, self.head_build_options())
        except ValueError as err:
            raise ValueError(f"{name}.head_options (head {self.head!r}): {err}") from None

    # ---- validation helpers shared by subclasses --------------------------------
    def _check_positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{type(self).__name__}.{name} must be a positive number, got {value!r}")

    def _check_fraction(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{type(self).__name__}.{name} must be in [0, 1], got {value!r}")

    # ---- (de)serialisation -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, **dataclasses.asdict(self)}

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CLConfig":
        """Build the registered config class named by ``data['method']``."""
        from hf_clroute.core.registry import get_method

        data = dict(data)
        method = data.pop("method", cls.method)
        config_cls = get_method(method).config_class if method else cls
        if cls is not CLConfig and not issubclass(config_cls, cls):
            raise ValueError(f"adapter config is for method {method!r}, not {cls.method!r}")
        known = {f.name for f in dataclasses.fields(config_cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown field(s) {unknown} for {config_cls.__name__}; known fields: {sorted(known)}"
            )
        return config_cls(**data)

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        Path(save_directory).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(save_directory) / CONFIG_NAME, self.to_json_string())

    @classmethod
    def from_pretrained(cls, path_or_repo_id: str | os.PathLike, **hub_kwargs: Any) -> "CLConfig":
        directory = resolve_pretrained_dir(path_or_repo_id, **hub_kwargs)
        return cls.from_dict(read_json(adapter_config_file(directory, path_or_repo_id)))

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> str:
        """Upload the config file alone (``CLModel.push_to_hub`` uploads the weights too)."""
        import tempfile

        from hf_clroute.hub.io import push_folder

        with tempfile.TemporaryDirectory(prefix="hf_clroute_config_") as tmp:
            self.save_pretrained(tmp)
            return push_folder(tmp, repo_id, **{"what": f"this {self.method} adapter config", **kwargs})

