"""RwF (Routing without Forgetting): Hopfield routing prompts, SPEC section 5."""

from ...registry import register_method
from .config import RwfConfig
from .hopfield import HopfieldRouter
from .layer import RoutedAttention
from .method import Rwf

register_method(RwfConfig, Rwf)

__all__ = ["HopfieldRouter", "RoutedAttention", "Rwf", "RwfConfig"]
