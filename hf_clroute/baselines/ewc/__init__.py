"""Online EWC (Schwarz et al. 2018, "Progress & Compress"; Kirkpatrick et al. 2017)."""

from hf_clroute.baselines.ewc.config import EWCConfig
from hf_clroute.baselines.ewc.method import OnlineEWC, ParamStore, trainable_named_parameters
from hf_clroute.core.registry import register_method

register_method(EWCConfig, OnlineEWC)

__all__ = ["EWCConfig", "OnlineEWC", "ParamStore", "trainable_named_parameters"]
