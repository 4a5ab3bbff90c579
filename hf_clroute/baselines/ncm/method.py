"""Nearest class mean on a frozen backbone: ``simplecil`` under its older name, with the metric
(cosine or euclidean) as its own field."""

from __future__ import annotations

from hf_clroute.baselines.ncm.config import NCMConfig
from hf_clroute.baselines.simplecil.method import SimpleCIL


class NearestClassMean(SimpleCIL):
    """Nearest class mean on frozen features (``simplecil`` under its older name)."""

    config_class = NCMConfig
