"""PEFT's prompt tuning on a BERT backbone, as a continual baseline."""

from hf_clroute.baselines.prompt_tuning.config import PromptTuningBaselineConfig
from hf_clroute.baselines.prompt_tuning.method import PromptTuningBaseline
from hf_clroute.core.registry import register_method

register_method(PromptTuningBaselineConfig, PromptTuningBaseline)

__all__ = ["PromptTuningBaseline", "PromptTuningBaselineConfig"]
