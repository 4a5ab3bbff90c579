"""hf_clroute: routing methods for continual learning as PEFT-style adapters for HF backbones.

The rooms, each importing only the ones listed before it (docs/layout.md names every module):

* ``errors``, ``runtime``; then ``hub``, ``data``, ``metrics``; then ``backbones``, ``heads``;
* ``core``: configs, registry, the method interface, ``CLModel``, labels, cards, ``AutoCLModel``;
* ``methods`` and ``baselines``, one package each;
* ``engine``: the continual loop on Accelerate, evaluation, checkpoints, callbacks;
* ``bench`` (harness, studies, reports, runners), then ``commands`` and ``cli``.

Names below are imported on first use, so ``import hf_clroute`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "AutoCLModel": "hf_clroute.core.auto",
    "CLConfig": "hf_clroute.core.config",
    "CLModel": "hf_clroute.core.model",
    "CLModelOutput": "hf_clroute.core.outputs",
    "get_cl_model": "hf_clroute.core.model",
    "ContinualTrainer": "hf_clroute.engine",
    "StreamResult": "hf_clroute.engine",
    "TrainingConfig": "hf_clroute.engine",
    "available_methods": "hf_clroute.core.registry",
    "get_method": "hf_clroute.core.registry",
    "register_method": "hf_clroute.core.registry",
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
    from hf_clroute.core.auto import AutoCLModel
    from hf_clroute.core.config import CLConfig
    from hf_clroute.core.model import CLModel, get_cl_model
    from hf_clroute.core.outputs import CLModelOutput
    from hf_clroute.core.registry import available_methods, get_method, register_method
    from hf_clroute.engine import ContinualTrainer, StreamResult, TrainingConfig


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hf_clroute' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
