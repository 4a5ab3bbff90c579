"""APN: Attractor Patch Networks (routed low-rank patch FFN), and its dense FFN-only counterpart."""

from ...registry import register_method
from .config import ApnConfig, FfnFinetuneConfig
from .method import Apn, FfnFinetune, patch_overlap
from .patch_ffn import PatchFFN

register_method(ApnConfig, Apn)
register_method(FfnFinetuneConfig, FfnFinetune)

__all__ = ["Apn", "ApnConfig", "FfnFinetune", "FfnFinetuneConfig", "PatchFFN", "patch_overlap"]
