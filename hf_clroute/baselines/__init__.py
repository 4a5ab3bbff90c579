"""Baselines that run on the same engine hooks as the methods."""

from ..registry import register_method
from .coda_prompt import CodaPrompt, CodaPromptConfig
from .dualprompt import DualPrompt, DualPromptConfig
from .ewc import EWCConfig, OnlineEWC
from .finetune import FfnFinetune, FfnFinetuneConfig, Finetune, FinetuneConfig
from .joint import JointConfig, JointTraining
from .knn import KNearestNeighbours, KNNConfig
from .l2p import L2P, L2PConfig
from .lora import LoraBaseline, LoraBaselineConfig
from .lwf import LwF, LwFConfig
from .online_lora import OnlineLora, OnlineLoraConfig
from .prompt_tuning import PromptTuningBaseline, PromptTuningBaselineConfig
from .replay import ERConfig, ExperienceReplay
from .statistics import (
    NCMConfig,
    NearestClassMean,
    RanPAC,
    RanPACConfig,
    SimpleCIL,
    SimpleCILConfig,
    SLDAConfig,
    StreamingLDA,
)
from .visual_prompt import VisualPromptTuning, VPTConfig

register_method(FinetuneConfig, Finetune)
register_method(FfnFinetuneConfig, FfnFinetune)
register_method(NCMConfig, NearestClassMean)
register_method(SimpleCILConfig, SimpleCIL)
register_method(SLDAConfig, StreamingLDA)
register_method(RanPACConfig, RanPAC)
register_method(KNNConfig, KNearestNeighbours)
register_method(LoraBaselineConfig, LoraBaseline)
register_method(PromptTuningBaselineConfig, PromptTuningBaseline)
register_method(VPTConfig, VisualPromptTuning)
register_method(ERConfig, ExperienceReplay)
register_method(LwFConfig, LwF)
register_method(EWCConfig, OnlineEWC)
register_method(JointConfig, JointTraining)
# The papers' own baselines for RwF (prompt pools and Online-LoRA).
register_method(L2PConfig, L2P)
register_method(DualPromptConfig, DualPrompt)
register_method(CodaPromptConfig, CodaPrompt)
register_method(OnlineLoraConfig, OnlineLora)

__all__ = [
    "CodaPrompt",
    "CodaPromptConfig",
    "DualPrompt",
    "DualPromptConfig",
    "L2P",
    "L2PConfig",
    "OnlineLora",
    "OnlineLoraConfig",
    "EWCConfig",
    "ERConfig",
    "ExperienceReplay",
    "FfnFinetune",
    "FfnFinetuneConfig",
    "Finetune",
    "FinetuneConfig",
    "JointConfig",
    "JointTraining",
    "KNNConfig",
    "KNearestNeighbours",
    "LoraBaseline",
    "LoraBaselineConfig",
    "LwF",
    "LwFConfig",
    "NCMConfig",
    "NearestClassMean",
    "OnlineEWC",
    "PromptTuningBaseline",
    "PromptTuningBaselineConfig",
    "RanPAC",
    "RanPACConfig",
    "SLDAConfig",
    "SimpleCIL",
    "SimpleCILConfig",
    "StreamingLDA",
    "VPTConfig",
    "VisualPromptTuning",
]
