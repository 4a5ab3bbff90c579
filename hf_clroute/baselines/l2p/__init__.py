"""L2P (Learning to Prompt): a key-matched prompt pool at the input."""

from .config import L2PConfig
from .method import L2P

__all__ = ["L2P", "L2PConfig"]
