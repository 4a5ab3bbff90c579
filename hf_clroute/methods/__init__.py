"""Continual routing methods, one package each.

Every sub-package registers its config and method with ``register_method`` when
imported; importing this package imports them all, so a new method needs no
edit here. The interface they implement, ``ContinualMethod``, is in
:mod:`hf_clroute.core.method`.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    if _module.ispkg:
        importlib.import_module(f"{__name__}.{_module.name}")

