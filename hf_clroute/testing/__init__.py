"""Test helpers shipped with hf_clroute: a local Hub-compatible server (see ``hub_server``).

Re-exports are resolved lazily so ``python -m hf_clroute.testing.hub_server`` does not
import the module twice (runpy warns when the package already imported it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["DEFAULT_USER", "HubError", "HubServer", "start_hub_server"]

if TYPE_CHECKING:
    from hf_clroute.testing.hub_server import (
        DEFAULT_USER,
        HubError,
        HubServer,
        start_hub_server,
    )


def __getattr__(name: str) -> Any:
    if name in __all__:
        from hf_clroute.testing import hub_server

        return getattr(hub_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
