"""Baselines that run on the same engine hooks as the methods, one package each.

Every sub-package registers its config and method with ``register_method`` when
imported, as ``hf_clroute.methods`` does; importing this package imports them all,
so a new baseline needs no edit here. ``class_statistics`` and ``prompt_pool`` hold
code that several baselines share.
"""

import importlib
import pkgutil
from typing import Any

_PACKAGES = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__) if m.ispkg]


def __getattr__(name: str) -> Any:
    # `from hf_clroute.baselines import NCMConfig`, as before each baseline had its own package
    for package in _PACKAGES:
        if name in getattr(package, "__all__", ()):
            return getattr(package, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
