"""Cosine k-nearest neighbours over a reservoir buffer of frozen features."""

from hf_clroute.baselines.knn.config import KNNConfig
from hf_clroute.baselines.knn.method import KNearestNeighbours, knn_logits
from hf_clroute.core.registry import register_method

register_method(KNNConfig, KNearestNeighbours)

__all__ = ["KNNConfig", "KNearestNeighbours", "knn_logits"]
