"""Frozen backbone + a closed-form statistics head: nothing is trained.

Each baseline is the base method with the backbone frozen and ``head`` set to a
statistics head (``hf_clroute.heads``): the model adds every training batch's
features to the head's class statistics and re-solves the head before every
evaluation. No parameter has a gradient, so the engine only runs the forward
passes. Sums commute, so the result does not depend on the order of the stream,
on the batch size or on the number of processes (up to float rounding); how good
each one is says how good the frozen features are for that classifier.

The baselines, one package each: ``simplecil`` (class means, cosine), ``slda``
(streaming LDA), ``ranpac`` (random projection + ridge regression) and ``ncm``
(``simplecil`` under its older name).
"""

from __future__ import annotations

from hf_clroute.baselines.class_statistics.config import FrozenStatisticsConfig
from hf_clroute.core.method import ContinualMethod


class FrozenStatisticsBaseline(ContinualMethod):
    """The base method on a frozen backbone: the model feeds and solves the statistics head."""

    config_class = FrozenStatisticsConfig
