"""Joint training: the upper bound of a continual benchmark."""

from hf_clroute.baselines.joint.config import JointConfig
from hf_clroute.baselines.joint.method import JointTraining
from hf_clroute.core.registry import register_method

register_method(JointConfig, JointTraining)

__all__ = ["JointConfig", "JointTraining"]
