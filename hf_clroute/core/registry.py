"""The method registry.

PEFT's ``register_peft_method`` only accepts names already in its closed
``PeftType`` enum, so an outside package cannot register tuners there; we keep a
small registry of our own. Methods and baselines register themselves when their
package is imported; lookups import those packages first.

A method's name is its config class's ``method`` and nothing else. Names use one
separator, the hyphen; an underscore reads as a hyphen, so a name written before the
names were made uniform (``prompt_tuning``, in a saved adapter's config or a command
line) still finds its method (``prompt-tuning``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_PACKAGES_WITH_METHODS = ("hf_clroute.baselines", "hf_clroute.methods")


@dataclass(frozen=True)
class MethodEntry:
    name: str
    config_class: type
    method_class: type


_REGISTRY: dict[str, MethodEntry] = {}


def canonical_name(name: str) -> str:
    """``name`` with the one separator: ``prompt_tuning`` -> ``prompt-tuning`` (also a variant's name)."""
    return name.replace("_", "-")


def method_key(mapping: Mapping[str, Any], name: str) -> str | None:
    """The key of ``mapping`` (rows of a results.json, picks of a selection.json) that is ``name`` in either
    spelling: files written before the rename keep ``prompt_tuning``. None when there is none."""
    if name in mapping:
        return name
    return next((key for key in mapping if canonical_name(key) == canonical_name(name)), None)


def register_method(config_class: type, method_class: type) -> None:
    name = config_class.method
    if not name:
        raise ValueError(f"{config_class.__name__}.method must name the method")
    if name != canonical_name(name):
        raise ValueError(f"{config_class.__name__}.method {name!r}: method names separate words with '-', not '_'")
    if getattr(method_class, "config_class", config_class) is not config_class:
        raise ValueError(f"{method_class.__name__}.config_class is {method_class.config_class.__name__}, "
                         f"not {config_class.__name__}")
    existing = _REGISTRY.get(name)
    if existing and existing.method_class is not method_class:
        raise ValueError(f"method {name!r} is already registered by {existing.method_class.__name__}")
    _REGISTRY[name] = MethodEntry(name, config_class, method_class)


def _import_builtin_methods() -> None:
    for package in _PACKAGES_WITH_METHODS:
        importlib.import_module(package)


def get_method(name: str) -> MethodEntry:
    """The registered method called ``name`` (or its older spelling with ``_``)."""
    _import_builtin_methods()
    entry = _REGISTRY.get(canonical_name(name))
    if entry is None:
        raise ValueError(f"unknown method {name!r}; registered methods: {sorted(_REGISTRY)}")
    return entry


def available_methods() -> list[str]:
    _import_builtin_methods()
    return sorted(_REGISTRY)
