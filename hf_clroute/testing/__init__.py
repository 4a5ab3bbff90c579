"""Test helpers shipped with hf_clroute: a local Hub-compatible server (see ``hub_server``)."""

from .hub_server import DEFAULT_USER, HubError, HubServer, start_hub_server

__all__ = ["DEFAULT_USER", "HubError", "HubServer", "start_hub_server"]
