"""L2P (Learning to Prompt): a key-matched prompt pool at the input."""

from hf_clroute.baselines.l2p.config import L2PConfig
from hf_clroute.baselines.l2p.method import L2P
from hf_clroute.core.registry import register_method

register_method(L2PConfig, L2P)

__all__ = ["L2P", "L2PConfig"]
