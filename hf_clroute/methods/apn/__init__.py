"""APN: Attractor Patch Networks (routed low-rank patch FFN). Its dense FFN-only counterpart is the
``finetune-ffn`` baseline (``hf_clroute.baselines.finetune``)."""

from ...registry import register_method
from .config import ApnConfig
from .method import Apn, patch_overlap, usage_per_domain
from .patch_ffn import PatchFFN

register_method(ApnConfig, Apn)

__all__ = ["Apn", "ApnConfig", "PatchFFN", "patch_overlap", "usage_per_domain"]
