"""MaRS: slot-routed memory with statistical expansion (SGSE) and two-stage retention (DCDA)."""

from ...registry import register_method
from .class_statistics import ClassStatistics
from .config import MarsConfig
from .method import Mars
from .sgse import ExpansionTest, ExpansionTiming, expansion_timing, wilson_lower_bound
from .slot_memory import SlotCapacityError, SlotMemory
from .slot_statistics import AnchorBank, SlotStatistics

register_method(MarsConfig, Mars)

__all__ = [
    "AnchorBank", "ClassStatistics", "ExpansionTest", "ExpansionTiming", "Mars", "MarsConfig", "SlotCapacityError", "SlotMemory",
    "SlotStatistics", "expansion_timing", "wilson_lower_bound",
]
