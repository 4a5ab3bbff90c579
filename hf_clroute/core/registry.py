"""The method registry.

PEFT's ``register_peft_method`` only accepts names already in its closed
``PeftType`` enum, so an outside package cannot register tuners there; we keep a
small registry of our own. Methods and baselines register themselves when their
package is imported; lookups import those packages first.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

_PACKAGES_WITH_METHODS = ("hf_clroute.baselines", "hf_clroute.methods")


@dataclass(frozen=True)
class MethodEntry:
    name: str
    config_class: type
    method_class: type


_REGISTRY: dict[str, MethodEntry] = {}


def register_method(config_class: type, method_class: type) -> None:
    name = config_class.method
    if not name:
        raise ValueError(f"{config_class.__name__}.method must name the method")
    existing = _REGISTRY.get(name)
    if existing and existing.method_class is not method_class:
        raise ValueError(f"method {name!r} is already registered by {existing.method_class.__name__}")
    _REGISTRY[name] = MethodEntry(name, config_class, method_class)


def _import_builtin_methods() -> None:
    for package in _PACKAGES_WITH_METHODS:
        importlib.import_module(package)


def get_method(name: str) -> MethodEntry:
    _import_builtin_methods()
    if name not in _REGISTRY:
        raise ValueError(f"unknown method {name!r}; registered methods: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def available_methods() -> list[str]:
    _import_builtin_methods()
    return sorted(_REGISTRY)
