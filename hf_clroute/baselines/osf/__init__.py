"""OSF (orthogonal subspace fine-tuning) from PEFT itself, as a continual baseline."""

from hf_clroute.baselines.osf.config import OsfConfig
from hf_clroute.baselines.osf.method import OsfBaseline
from hf_clroute.core.registry import register_method

register_method(OsfConfig, OsfBaseline)

__all__ = ["OsfBaseline", "OsfConfig"]
