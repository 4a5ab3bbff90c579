"""The base adapter config shared by every method.

Modelled on PEFT's ``PeftConfig``: a dataclass whose fields each carry a ``help``
string, validated in ``__post_init__`` with errors that name the field, written as
JSON with sorted keys to ``adapter_config.json``. ``method`` says which registered
method the config belongs to, so ``CLConfig.from_pretrained`` can rebuild the right
subclass from disk or from the Hub.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .io import atomic_write_text, resolve_pretrained_dir
from .metrics.continual import SCENARIOS

CONFIG_NAME = "adapter_config.json"


@dataclass
class CLConfig:
    """Fields every continual adapter has; methods subclass this and add their own."""

    method: ClassVar[str] = ""

    base_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Backbone this adapter was attached to (local dir or Hub id); recorded, never saved."},
    )
    scenario: str = field(
        default="class",
        metadata={"help": "Continual scenario: 'class' (one head, no task id), 'domain' or 'task' (task id at test time)."},
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

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"{type(self).__name__}.scenario must be one of {SCENARIOS}, got {self.scenario!r}")

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
        from .registry import get_method

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
        config_file = directory / CONFIG_NAME
        if not config_file.is_file():
            raise FileNotFoundError(f"no {CONFIG_NAME} in {path_or_repo_id}")
        try:
            data = json.loads(config_file.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{config_file} is not valid JSON (corrupted checkpoint?): {err}") from err
        return cls.from_dict(data)

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> str:
        """Upload ``adapter_config.json`` alone (``CLModel.push_to_hub`` uploads the weights too)."""
        import tempfile

        from .io import push_folder

        with tempfile.TemporaryDirectory(prefix="hf_clroute_config_") as tmp:
            self.save_pretrained(tmp)
            return push_folder(tmp, repo_id, **kwargs)
