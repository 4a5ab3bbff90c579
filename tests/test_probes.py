"""The deep-forgetting probe works in the head's label space, on the method's own features."""

from __future__ import annotations

import torch
from datasets import Dataset
from torch import nn

from hf_clroute.bench.harness import probes as harness_probes
from hf_clroute.bench.harness.feature_cache import FeatureCollator
from hf_clroute.bench.harness.probes import probe_seen_tasks
from hf_clroute.bench.harness.verdicts import above_floor, deep_forgetting_floor
from hf_clroute.core.outputs import CLModelOutput
from hf_clroute.data.experiences import Experience
from hf_clroute.metrics import probes
from hf_clroute.metrics.probes import fit_probe, forgetting_split


class Passthrough(nn.Module):
    """A 'model' whose classifier reads the batch's features as given (doubled, to tell them apart)."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, features: torch.Tensor, **_) -> CLModelOutput:
        return CLModelOutput(features=2 * features)


def cluster(center: list[float], n: int, seed: int) -> list[list[float]]:
    g = torch.Generator().manual_seed(seed)
    return (torch.tensor(center) + 0.05 * torch.randn(n, len(center), generator=g)).tolist()


def experience(task_id: int, classes: list[int], train_centers: dict, test_centers: dict) -> Experience:
    def split(centers, seed):
        rows = [(x, c) for c, center in centers.items() for x in cluster(center, 20, seed + c)]
        return Dataset.from_dict({"features": [x for x, _ in rows], "label": [c for _, c in rows]})
    return Experience(task_id, f"t{task_id}", classes, split(train_centers, 0), split(test_centers, 100))


def test_probe_covers_every_seen_class_not_only_the_task_pair():
    centers = {0: [1.0, 0.0], 1: [0.0, 1.0], 2: [-1.0, 0.0], 3: [0.0, -1.0]}
    first = experience(0, [0, 1], {0: centers[0], 1: centers[1]}, {0: centers[0], 1: centers[1]})
    # Task 1's test images look exactly like task 0's classes: a binary probe over {2, 3} would still
    # separate them perfectly, a probe over all four seen classes calls them 0 and 1.
    second = experience(1, [2, 3], {2: centers[2], 3: centers[3]}, {2: centers[0], 3: centers[1]})
    scores = probe_seen_tasks(Passthrough(), [first, second], FeatureCollator())
    assert scores[0]["probe_accuracy"] == 1.0
    assert scores[1]["probe_accuracy"] == 0.0


def test_forgetting_split_is_the_drop_of_head_and_probe():
    split = forgetting_split([[0.9, 0.0], [0.4, 0.8]], probe_diag=[0.95, 0.9], probe_final=[0.85, 0.9])
    assert split["head"] == 0.9 - 0.4 and abs(split["deep"] - 0.1) < 1e-12


def gaussian_classes(n_per_class: int, seed: int, classes: int = 6, dim: int = 12):
    """Classes with a shared, strongly anisotropic covariance: the setting LDA is built for."""
    g = torch.Generator().manual_seed(seed)
    means = 1.5 * torch.randn(classes, dim, generator=torch.Generator().manual_seed(123))
    mix = torch.randn(dim, dim, generator=torch.Generator().manual_seed(7)) * torch.linspace(0.2, 3.0, dim)
    y = torch.arange(classes).repeat_interleave(n_per_class)
    x = means[y] + torch.randn(len(y), dim, generator=g) @ mix.T
    return x, y


def test_probe_reads_features_at_least_as_well_as_streaming_lda():
    from hf_clroute.heads import StreamingLDAHead

    x, y = gaussian_classes(500, seed=0)
    x_test, y_test = gaussian_classes(300, seed=1)
    lda = StreamingLDAHead(x.shape[1], shrinkage=1e-4, num_classes=6)
    lda.accumulate(x, y)
    lda.sync()
    lda_accuracy = (lda(x_test.double()).argmax(1) == y_test).double().mean().item()
    probe_accuracy = (fit_probe(x, y)(x_test) == y_test).double().mean().item()
    assert probe_accuracy >= lda_accuracy - 0.01, (probe_accuracy, lda_accuracy)


def test_probe_chooses_its_penalty_on_held_out_training_examples():
    x, y = gaussian_classes(100, seed=2)
    chosen = []
    real_fit = probes.fit_logistic

    def spy(x_fit, y_fit, weight_decay, **kwargs):
        chosen.append((len(x_fit), weight_decay))
        return real_fit(x_fit, y_fit, weight_decay, **kwargs)

    probes.fit_logistic = spy
    try:
        probes._FITTED.clear()  # a probe fitted earlier on these data would be reused (tested below)
        fit_probe(x, y, weight_decays=(1e-4, 10.0))
    finally:
        probes.fit_logistic = real_fit
    held = int(len(x) * probes.PROBE_HOLDOUT)
    assert [n for n, _ in chosen[:2]] == [len(x) - held] * 2  # each penalty fitted on the kept share
    assert chosen[-1] == (len(x), 1e-4)  # the refit on everything uses the penalty that won (10.0 underfits)


def test_a_probe_on_the_same_data_is_fitted_once(monkeypatch):
    x, y = gaussian_classes(60, seed=5)
    calls = []
    real_fit = probes.fit_logistic
    monkeypatch.setattr(probes, "fit_logistic", lambda *a, **k: calls.append(1) or real_fit(*a, **k))
    probes._FITTED.clear()
    first = fit_probe(x, y, weight_decays=(1e-4,))
    assert fit_probe(x.clone(), y.clone(), weight_decays=(1e-4,)) is first and len(calls) == 1  # same content
    moved = x.clone()
    moved[0, 0] += 1e-3  # any change in the data, the labels or the penalties fits again
    for args, kwargs in (((moved, y), {}), ((x, y.flip(0)), {}), ((x, y), {"weight_decays": (1e-5,)})):
        fit_probe(*args, **{"weight_decays": (1e-4,), **kwargs})
    assert len(calls) == 4


def test_deep_forgetting_floor_is_the_frozen_row_and_methods_are_paired_against_it():
    def row(values):
        return {"per_seed": [{"seed": s, "deep_forgetting": v} for s, v in enumerate(values)]}

    rows = {"mars": row([0.30, 0.32, 0.28, 0.31, 0.29]), "slda": row([0.50] * 5),
            "simplecil": row([0.10, 0.12, 0.08, 0.11, 0.09])}
    floor = deep_forgetting_floor(rows)
    assert floor["method"] == "simplecil" and abs(floor["mean"] - 0.10) < 1e-12
    paired = above_floor(rows["mars"], floor)
    assert abs(paired["mean"] - 0.20) < 1e-12 and paired["wins"] == 5 and paired["verdict"] == "better"
    assert deep_forgetting_floor({"mars": rows["mars"]}) is None


def test_deep_forgetting_measured_by_another_probe_than_the_floors_is_not_set_against_it():
    from hf_clroute.bench.runners.classification import floor_markdown, with_verdicts
    from hf_clroute.metrics.probes import PROBE_NAME

    def row(values, probe=None):
        seeds = [{"seed": s, "deep_forgetting": v} | ({"probe": probe} if probe else {}) for s, v in enumerate(values)]
        return {"per_seed": seeds, "deep_forgetting": {"mean": sum(values) / len(values), "std": 0.0}}

    floor_row = row([0.10] * 5)  # written before the probe was recorded
    floor = deep_forgetting_floor({"simplecil": floor_row})
    assert floor["probe"] is None
    assert above_floor(row([0.3] * 5), floor)["mean"] > 0.19  # same (unrecorded) probe: compared
    assert above_floor(row([0.3] * 5, PROBE_NAME), floor) is None
    mixed = row([0.3] * 5, PROBE_NAME)
    mixed["per_seed"][0].pop("probe")
    assert above_floor(mixed, deep_forgetting_floor({"simplecil": row([0.1] * 5, PROBE_NAME)})) is None
    results = with_verdicts({"methods": {"simplecil": floor_row, "mars-fsa-slda": row([0.3] * 5, PROBE_NAME),
                                         "ranpac-lora": row([0.2] * 5), "mixed-row": mixed}})
    assert results["methods"]["mars-fsa-slda"]["deep_forgetting_above_floor"] is None
    table = floor_markdown(results)
    assert "| ranpac-lora |" in table
    assert ("Not set against the floor, their deep F measured by another probe than the floor's (an earlier probe, "
            f"not recorded): mars-fsa-slda (probe {PROBE_NAME}); mixed-row (probes differing by seed).") in table


def test_the_linear_probe_lives_with_the_probes_and_records_its_l2():
    from hf_clroute.backbones.pretraining import recipes as pretrained

    # the pure-tensor probe sits in metrics, below backbones and bench; still importable where it was
    assert pretrained.linear_probe_accuracy is probes.linear_probe_accuracy
    for name in ("linear_probe_accuracy", "fit_logistic", "fit_probe", "feature_snr", "forgetting_split", "PROBE_NAME"):
        assert getattr(harness_probes, name) is getattr(probes, name)
    x, y = gaussian_classes(60, seed=3)
    x_test, y_test = gaussian_classes(20, seed=4)
    accuracy = probes.linear_probe_accuracy(x, y, x_test, y_test)
    assert accuracy == (fit_probe(x, y, weight_decays=(1e-4,))(x_test) == y_test).float().mean().item() > 0.5
    assert fit_probe(x, y, weight_decays=(1e-4, 10.0)).weight_decay == 1e-4  # 10.0 underfits
