"""Continual-learning metrics as a local ``evaluate`` module.

Load offline with ``evaluate.load("<path to this folder>")`` or
``hf_clroute.metrics.load_metric()``. Each *example* is one row of the accuracy
matrix, so either pass the whole matrix at once::

    metric.compute(accuracy_matrix=R, untrained_accuracy=b, anytime=evals, scenario="domain")

or add one row per task boundary with ``metric.add(accuracy_matrix=R[t])`` and
call ``metric.compute()`` at the end. Rows are kept in the order added.
"""

import datasets
import evaluate

from hf_clroute.metrics.continual import summarize

_CITATION = """\
@inproceedings{chaudhry2018riemannian,
  title={Riemannian Walk for Incremental Learning: Understanding Forgetting and Intransigence},
  author={Chaudhry, Arslan and Dokania, Puneet K. and Ajanthan, Thalaiyasingam and Torr, Philip H. S.},
  booktitle={ECCV}, year={2018}}
@inproceedings{lopezpaz2017gem,
  title={Gradient Episodic Memory for Continual Learning},
  author={Lopez-Paz, David and Ranzato, Marc'Aurelio},
  booktitle={NeurIPS}, year={2017}}
@inproceedings{koh2022online,
  title={Online Continual Learning on Class Incremental Blurry Task Configuration with Anytime Inference},
  author={Koh, Hyunseo and Kim, Dahyun and Ha, Jung-Woo and Choi, Jonghyun},
  booktitle={ICLR}, year={2022}}
"""

_DESCRIPTION = """\
Summary metrics of an accuracy matrix R (R[t][j] = accuracy on task j after
training on task t, fractions in [0, 1]): final average accuracy A_T, average
incremental accuracy A_bar, forgetting F_T, backward transfer BWT, forward
transfer FWT and anytime accuracy A_AUC.
"""

_KWARGS_DESCRIPTION = """
Args:
    accuracy_matrix: the T x T accuracy matrix, one row (list of T floats) per example.
    untrained_accuracy: optional, length-T accuracies of the untrained model (enables FWT).
    anytime: optional list of periodic average accuracies during the stream (enables A_AUC).
    scenario: 'class' (default), 'domain' or 'task'. FWT is None for 'class': a task's
        classes cannot be predicted before that task is trained, so forward transfer is undefined.
Returns:
    dict with keys A_T, A_bar, F_T, BWT, FWT, A_AUC (A_AUC is None without anytime; FWT is None
    without untrained_accuracy or for scenario='class').
Examples:
    >>> metric = evaluate.load("path/to/continual_learning")
    >>> round(metric.compute(accuracy_matrix=[[0.9, 0.0], [0.7, 0.8]])["BWT"], 6)
    -0.2
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ContinualLearning(evaluate.Metric):
    """The accuracy-matrix metrics; see ``hf_clroute.metrics.continual``."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"accuracy_matrix": datasets.Sequence(datasets.Value("float64"))}),
        )

    def _compute(self, accuracy_matrix, untrained_accuracy=None, anytime=None, scenario="class"):
        return summarize(accuracy_matrix, b=untrained_accuracy, anytime=anytime, scenario=scenario)
