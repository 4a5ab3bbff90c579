"""APN: Attractor Patch Networks (routed low-rank patch FFN). Its dense FFN-only counterpart is the
``finetune-ffn`` baseline (``hf_clroute.baselines.finetune_ffn``)."""

from hf_clroute.core.registry import register_method
from hf_clroute.methods.apn.config import ApnConfig
from hf_clroute.methods.apn.method import Apn, patch_overlap, usage_per_domain
from hf_clroute.methods.apn.patch_ffn import PatchFFN

register_method(ApnConfig, Apn)

__all__ = ["Apn", "ApnConfig", "PatchFFN", "patch_overlap", "usage_per_domain"]
