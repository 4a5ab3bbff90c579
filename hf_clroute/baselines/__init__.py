"""Baselines that run on the same engine hooks as the methods."""

from ..registry import register_method
from .ewc import EWCConfig, OnlineEWC
from .finetune import FfnFinetune, FfnFinetuneConfig, Finetune, FinetuneConfig
from .joint import JointConfig, JointTraining
from .lora import LoraBaseline, LoraBaselineConfig
from .lwf import LwF, LwFConfig
from .ncm import NCMConfig, NearestClassMean
from .prompt_tuning import PromptTuningBaseline, PromptTuningBaselineConfig
from .replay import ERConfig, ExperienceReplay
from .visual_prompt import VisualPromptTuning, VPTConfig

register_method(FinetuneConfig, Finetune)
register_method(FfnFinetuneConfig, FfnFinetune)
register_method(NCMConfig, NearestClassMean)
register_method(LoraBaselineConfig, LoraBaseline)
register_method(PromptTuningBaselineConfig, PromptTuningBaseline)
register_method(VPTConfig, VisualPromptTuning)
register_method(ERConfig, ExperienceReplay)
register_method(LwFConfig, LwF)
register_method(EWCConfig, OnlineEWC)
register_method(JointConfig, JointTraining)

__all__ = [
    "EWCConfig",
    "ERConfig",
    "ExperienceReplay",
    "FfnFinetune",
    "FfnFinetuneConfig",
    "Finetune",
    "FinetuneConfig",
    "JointConfig",
    "JointTraining",
    "LoraBaseline",
    "LoraBaselineConfig",
    "LwF",
    "LwFConfig",
    "NCMConfig",
    "NearestClassMean",
    "OnlineEWC",
    "PromptTuningBaseline",
    "PromptTuningBaselineConfig",
    "VPTConfig",
    "VisualPromptTuning",
]
