"""MaRS: slot-routed memory with statistical expansion (SGSE) and two-stage retention (DCDA)."""

from hf_clroute.core.registry import register_method
from hf_clroute.methods.mars.class_statistics import ClassStatistics
from hf_clroute.methods.mars.config import MarsConfig
from hf_clroute.methods.mars.method import Mars
from hf_clroute.methods.mars.prototypes import ClassPrototypes
from hf_clroute.methods.mars.sgse import (
    ExpansionTest,
    ExpansionTiming,
    expansion_timing,
    wilson_lower_bound,
)
from hf_clroute.methods.mars.slot_memory import SlotCapacityError, SlotMemory
from hf_clroute.methods.mars.slot_statistics import AnchorBank, SlotStatistics

register_method(MarsConfig, Mars)

__all__ = [
    "AnchorBank", "ClassPrototypes", "ClassStatistics", "ExpansionTest", "ExpansionTiming", "Mars", "MarsConfig",
    "SlotCapacityError", "SlotMemory", "SlotStatistics", "expansion_timing", "wilson_lower_bound",
]
