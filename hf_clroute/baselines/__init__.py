"""Baselines that run on the same engine hooks as the methods."""

from hf_clroute.baselines.coda_prompt import CodaPrompt, CodaPromptConfig
from hf_clroute.baselines.dualprompt import DualPrompt, DualPromptConfig
from hf_clroute.baselines.ewc import EWCConfig, OnlineEWC
from hf_clroute.baselines.finetune import (
    FfnFinetune,
    FfnFinetuneConfig,
    Finetune,
    FinetuneConfig,
)
from hf_clroute.baselines.joint import JointConfig, JointTraining
from hf_clroute.baselines.knn import KNearestNeighbours, KNNConfig
from hf_clroute.baselines.l2p import L2P, L2PConfig
from hf_clroute.baselines.lora import LoraBaseline, LoraBaselineConfig
from hf_clroute.baselines.lwf import LwF, LwFConfig
from hf_clroute.baselines.online_lora import OnlineLora, OnlineLoraConfig
from hf_clroute.baselines.prompt_tuning import (
    PromptTuningBaseline,
    PromptTuningBaselineConfig,
)
from hf_clroute.baselines.replay import ERConfig, ExperienceReplay
from hf_clroute.baselines.statistics import (
    NCMConfig,
    NearestClassMean,
    RanPAC,
    RanPACConfig,
    SimpleCIL,
    SimpleCILConfig,
    SLDAConfig,
    StreamingLDA,
)
from hf_clroute.baselines.visual_prompt import VisualPromptTuning, VPTConfig
from hf_clroute.core.registry import register_method

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
