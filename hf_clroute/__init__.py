"""hf_clroute: routing methods for continual learning as PEFT-style adapters for HF backbones.

The package has three layers, each importing only the ones below it:

* the core: ``config``, ``registry``, ``model``, ``heads``, ``backbones``, ``io``, ``outputs``,
  ``methods``, ``baselines``, ``data``, ``metrics``;
* ``engine``: the continual loop on Accelerate, evaluation, checkpoints, callbacks;
* ``bench``: suites, runners, results, reports, plots, probes, cards, publishing.

Names below are imported on first use, so ``import hf_clroute`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "AutoCLModel": "hf_clroute.auto",
    "CLConfig": "hf_clroute.config",
    "CLModel": "hf_clroute.model",
    "CLModelOutput": "hf_clroute.outputs",
    "get_cl_model": "hf_clroute.model",
    "ContinualTrainer": "hf_clroute.engine",
    "StreamResult": "hf_clroute.engine",
    "TrainingConfig": "hf_clroute.engine",
    "available_methods": "hf_clroute.registry",
    "get_method": "hf_clroute.registry",
    "register_method": "hf_clroute.registry",
}

__all__ = [
    "AutoCLModel",
    "CLConfig",
    "CLModel",
    "CLModelOutput",
    "ContinualTrainer",
    "StreamResult",
    "TrainingConfig",
    "available_methods",
    "get_cl_model",
    "get_method",
    "register_method",
]

if TYPE_CHECKING:  # pragma: no cover
    from .auto import AutoCLModel
    from .config import CLConfig
    from .engine import ContinualTrainer, StreamResult, TrainingConfig
    from .model import CLModel, get_cl_model
    from .outputs import CLModelOutput
    from .registry import available_methods, get_method, register_method


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hf_clroute' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
