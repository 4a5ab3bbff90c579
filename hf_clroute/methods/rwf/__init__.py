"""RwF (Routing without Forgetting): Hopfield routing prompts."""

from hf_clroute.core.registry import register_method
from hf_clroute.methods.rwf.config import RwfConfig
from hf_clroute.methods.rwf.hopfield import HopfieldRouter
from hf_clroute.methods.rwf.layer import RoutedAttention
from hf_clroute.methods.rwf.method import Rwf

register_method(RwfConfig, Rwf)

__all__ = ["HopfieldRouter", "RoutedAttention", "Rwf", "RwfConfig"]
