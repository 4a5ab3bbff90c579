"""MaRS: slot-routed memory with statistical expansion (SGSE) and two-stage retention (DCDA)."""

from ...registry import register_method
from .config import MarsConfig
from .method import Mars
from .sgse import ExpansionTest, wilson_lower_bound
from .slot_memory import SlotCapacityError, SlotMemory

register_method(MarsConfig, Mars)

__all__ = ["ExpansionTest", "Mars", "MarsConfig", "SlotCapacityError", "SlotMemory", "wilson_lower_bound"]
