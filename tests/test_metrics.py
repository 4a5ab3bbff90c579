"""Tests for hf_clroute.metrics (SPEC 4): properties, hand-worked examples, evaluate module."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from hf_clroute.metrics import (
    METRIC_PATH,
    SCENARIOS,
    SUMMARY_KEYS,
    aggregate_runs,
    anytime_accuracy,
    average_incremental_accuracy,
    backward_transfer,
    final_average_accuracy,
    forgetting,
    format_mean_std,
    forward_transfer,
    load_metric,
    mean_std,
    perplexity_retention,
    retention,
    summarize,
)
from hf_clroute.metrics.aggregate import one_seed_only, paired_difference, seeds_caption

settings.register_profile("metrics", max_examples=60, deadline=None, database=None)
settings.load_profile("metrics")

FRACTION = st.floats(0.0, 1.0)


@st.composite
def accuracy_matrices(draw, min_tasks: int = 1) -> np.ndarray:
    t = draw(st.integers(min_tasks, 6))
    return draw(arrays(np.float64, (t, t), elements=FRACTION))


@st.composite
def no_forgetting_matrices(draw) -> np.ndarray:
    """R[t][j] = c_j for every t >= j; the upper triangle (unseen tasks) is arbitrary."""
    r = draw(accuracy_matrices())
    for j in range(r.shape[0]):
        r[j:, j] = r[j, j]
    return r


@st.composite
def monotone_drop_matrices(draw) -> np.ndarray:
    """T >= 2 and each column strictly decreases once its task is learned."""
    t = draw(st.integers(2, 6))
    r = draw(arrays(np.float64, (t, t), elements=st.floats(0.0, 0.5)))
    diag = draw(arrays(np.float64, t, elements=st.floats(0.6, 1.0)))
    drops = draw(arrays(np.float64, (t, t), elements=st.floats(0.01, 0.1)))
    for j in range(t):
        r[j:, j] = diag[j] - np.concatenate([[0.0], np.cumsum(drops[j + 1 :, j])])
    return r


# ------------------------------------------------------------------ hand-worked examples
R3 = [[0.8, 0.1, 0.0], [0.6, 0.9, 0.2], [0.5, 0.7, 0.6]]
B3 = [0.1, 0.05, 0.1]
ANY3 = [0.8, 0.7, 0.6, 0.65]


def test_hand_worked_3x3() -> None:
    # A_T = (0.5 + 0.7 + 0.6) / 3
    assert final_average_accuracy(R3) == pytest.approx(0.6)
    # A_bar = (0.8 + (0.6 + 0.9) / 2 + (0.5 + 0.7 + 0.6) / 3) / 3 = 2.15 / 3
    assert average_incremental_accuracy(R3) == pytest.approx(2.15 / 3)
    # F = ((max(0.8, 0.6) - 0.5) + (0.9 - 0.7)) / 2
    assert forgetting(R3) == pytest.approx(0.25)
    # BWT = ((0.5 - 0.8) + (0.7 - 0.9)) / 2
    assert backward_transfer(R3) == pytest.approx(-0.25)
    # FWT = ((0.1 - 0.05) + (0.2 - 0.1)) / 2
    assert forward_transfer(R3, B3) == pytest.approx(0.075)
    assert anytime_accuracy(ANY3) == pytest.approx(2.75 / 4)
    expected = {"A_T": 0.6, "A_bar": 2.15 / 3, "F_T": 0.25, "BWT": -0.25, "FWT": 0.075, "A_AUC": 0.6875}
    assert summarize(R3, B3, ANY3, scenario="domain") == pytest.approx(expected)
    assert summarize(R3, B3, ANY3, scenario="task") == pytest.approx(expected)


def test_forgetting_conventions_differ_only_before_learned() -> None:
    # Domain-incremental: task 1 scores 0.85 before it is trained (row 0), 0.7 after.
    r = [[0.9, 0.85, 0.3], [0.8, 0.7, 0.4], [0.6, 0.5, 0.9]]
    # default, l in {j..T-2}: ((0.9 - 0.6) + (0.7 - 0.5)) / 2
    assert forgetting(r) == pytest.approx(0.25)
    # literal SPEC / Chaudhry, l in {0..T-2}: ((0.9 - 0.6) + (0.85 - 0.5)) / 2
    assert forgetting(r, include_before_learned=True) == pytest.approx(0.325)
    assert forgetting(R3, include_before_learned=True) == pytest.approx(forgetting(R3))


def test_single_task_edge_case() -> None:
    assert summarize([[0.7]], b=[0.2], anytime=[0.5], scenario="domain") == pytest.approx(
        {"A_T": 0.7, "A_bar": 0.7, "F_T": 0.0, "BWT": 0.0, "FWT": 0.0, "A_AUC": 0.5}
    )


def test_summary_keys_and_optional_inputs() -> None:
    out = summarize(R3)
    assert tuple(out) == SUMMARY_KEYS
    assert out["FWT"] is None and out["A_AUC"] is None
    assert summarize(R3, scenario="domain")["FWT"] is None  # no b: nothing to compare against


def test_fwt_undefined_in_class_incremental() -> None:
    assert SCENARIOS == ("class", "domain", "task")
    # Class-IL: R[j-1][j] is 0 by construction (task j's classes are not learnable yet).
    class_il = summarize(R3, B3)
    assert class_il["FWT"] is None and summarize(R3, B3, scenario="class")["FWT"] is None
    assert class_il["A_T"] == pytest.approx(0.6) and class_il["BWT"] == pytest.approx(-0.25)
    domain_il = summarize(R3, B3, scenario="domain")["FWT"]
    assert isinstance(domain_il, float) and domain_il == pytest.approx(forward_transfer(R3, B3))
    assert summarize(R3, B3, scenario="task")["FWT"] == pytest.approx(0.075)
    with pytest.raises(ValueError, match=r"scenario must be one of .*'class'.*got 'online'"):
        summarize(R3, B3, scenario="online")
    with pytest.raises(ValueError, match="square"):  # R is validated even when FWT is not computed
        summarize([[0.5, 0.5]], B3)


def test_perplexity_retention_hand_worked() -> None:
    p = [[10.0, 40.0, 40.0], [15.0, 8.0, 30.0], [20.0, 12.0, 5.0]]
    assert retention(p, domain=0, after=1) == pytest.approx(1.5)  # P[1][0] / P[0][0]
    assert retention(p, domain=1, after=1) == pytest.approx(1.0)
    out = perplexity_retention(p)
    assert out["retention"] == pytest.approx([2.0, 1.5])
    assert out["mean_retention"] == pytest.approx(1.75)
    assert out["final_perplexity"] == pytest.approx([20.0, 12.0, 5.0])
    assert perplexity_retention([[3.0]]) == {"retention": [], "mean_retention": 1.0, "final_perplexity": [3.0]}


# ---------------------------------------------------------------------------- properties
@given(no_forgetting_matrices())
def test_no_forgetting_gives_zero(r: np.ndarray) -> None:
    assert forgetting(r) == pytest.approx(0.0, abs=1e-12)
    assert backward_transfer(r) == pytest.approx(0.0, abs=1e-12)


@given(monotone_drop_matrices())
def test_monotone_drops_give_positive_forgetting(r: np.ndarray) -> None:
    assert forgetting(r) > 0.0
    assert backward_transfer(r) < 0.0
    # With monotone drops the best score is the diagonal, so F == -BWT exactly.
    assert forgetting(r) == pytest.approx(-backward_transfer(r))


@given(accuracy_matrices(), st.booleans())
def test_forgetting_bounds_minus_bwt(r: np.ndarray, literal: bool) -> None:
    # Both conventions include the diagonal R[j][j] in the max, so F_T >= -BWT.
    assert forgetting(r, include_before_learned=literal) >= -backward_transfer(r) - 1e-12


@given(accuracy_matrices())
def test_ranges(r: np.ndarray) -> None:
    out = summarize(r, b=np.zeros(r.shape[0]), anytime=r[-1], scenario="domain")
    assert 0.0 <= out["A_T"] <= 1.0 and 0.0 <= out["A_bar"] <= 1.0
    assert out["A_AUC"] == pytest.approx(out["A_T"])
    for key in ("F_T", "BWT", "FWT"):
        assert -1.0 <= out[key] <= 1.0
    assert forgetting(r, include_before_learned=True) >= forgetting(r) - 1e-12


@given(accuracy_matrices(min_tasks=2), st.randoms(use_true_random=False))
def test_relabelling_earlier_tasks_is_invariant(r: np.ndarray, rnd) -> None:
    # Relabel tasks 0..T-2 (rows and columns together): the final row, the
    # diagonal and the column-wise max over rows 0..T-2 are only permuted.
    t = r.shape[0]
    perm = list(range(t - 1))
    rnd.shuffle(perm)
    perm.append(t - 1)
    inverse = np.argsort(perm)
    p = r[np.ix_(inverse, inverse)]
    assert final_average_accuracy(p) == pytest.approx(final_average_accuracy(r))
    assert backward_transfer(p) == pytest.approx(backward_transfer(r))
    literal = forgetting(p, include_before_learned=True)
    assert literal == pytest.approx(forgetting(r, include_before_learned=True))


@given(accuracy_matrices(min_tasks=2), st.floats(0.0, 1.0))
def test_forward_transfer_is_shift_by_baseline(r: np.ndarray, shift: float) -> None:
    b = np.full(r.shape[0], shift)
    assert forward_transfer(r, b) == pytest.approx(forward_transfer(r, np.zeros_like(b)) - shift)


# ---------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([[0.5, 0.5]], "square"),
        ([0.5, 0.5], "2-D"),
        (np.zeros((0, 0)), "empty"),
        ([[0.5, float("nan")], [0.5, 0.5]], "non-finite"),
        ([[0.5, float("inf")], [0.5, 0.5]], "non-finite"),
        ([[50.0, 0.0], [40.0, 60.0]], r"\[0, 1\]"),
        ([[-0.1, 0.0], [0.4, 0.6]], r"\[0, 1\]"),
        ([[0.5], [0.5, 0.5]], "ragged"),
        ([["a", "b"], ["c", "d"]], "numeric"),
    ],
)
def test_invalid_accuracy_matrix(bad, message: str) -> None:
    for fn in (final_average_accuracy, average_incremental_accuracy, forgetting, backward_transfer, summarize):
        with pytest.raises(ValueError, match=message):
            fn(bad)


def test_invalid_other_inputs() -> None:
    with pytest.raises(ValueError, match="length 3"):
        forward_transfer(R3, [0.1, 0.1])
    with pytest.raises(ValueError, match=r"b values .*\[0, 1\]"):
        forward_transfer(R3, [0.1, 2.0, 0.1])
    with pytest.raises(ValueError, match="anytime must not be empty"):
        anytime_accuracy([])
    with pytest.raises(ValueError, match="> 0"):
        perplexity_retention([[1.0, 2.0], [0.0, 3.0]])
    with pytest.raises(ValueError, match="domain <= after"):
        retention([[1.0, 2.0], [2.0, 3.0]], domain=1, after=0)


# ----------------------------------------------------------------------------- aggregate
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=8))
def test_mean_std_matches_statistics(values: list[float]) -> None:
    out = mean_std(values)
    assert out["mean"] == pytest.approx(statistics.fmean(values), abs=1e-9)
    expected_std = statistics.stdev(values) if len(values) > 1 else 0.0
    assert out["std"] == pytest.approx(expected_std, rel=1e-6, abs=1e-6)


def test_aggregate_runs_skips_none() -> None:
    runs = [summarize(R3), summarize(R3, B3, scenario="domain"),
            summarize([[1.0, 0.0], [0.8, 0.9]], [0.0, 0.0], scenario="domain")]
    out = aggregate_runs(runs)
    assert out["A_AUC"] is None  # None in every run: undefined, not dropped
    assert out["FWT"] == pytest.approx({"mean": 0.0375, "std": statistics.stdev([0.075, 0.0])})
    assert out["A_T"]["mean"] == pytest.approx((0.6 + 0.6 + 0.85) / 3)
    assert mean_std([0.3]) == {"mean": 0.3, "std": 0.0}
    with pytest.raises(ValueError, match="at least one"):
        mean_std([])


def test_paired_wins_do_not_count_float_rounding_as_a_win() -> None:
    a = {0: 0.4565, 1: 0.50, 2: 0.40}
    b = {0: 0.45649999999999996, 1: 0.45, 2: 0.41}  # seed 0: the same score, rounded differently
    assert paired_difference(a, b, min_seeds=3)["wins"] == 1
    scaled = paired_difference({k: v * 100 for k, v in a.items()}, {k: v * 100 for k, v in b.items()}, min_seeds=3)
    assert scaled["wins"] == 1


def test_format_mean_std_says_one_seed_instead_of_a_zero_spread() -> None:
    stat = mean_std([0.5, 0.52])
    assert format_mean_std(stat) == "51.0 ± 1.4" and format_mean_std(stat, n=2) == "51.0 ± 1.4"
    assert format_mean_std(mean_std([0.442]), n=1) == "44.2 (one seed)"
    assert format_mean_std({"mean": 0.3, "std": 0.0}) == "30.0 ± 0.0"  # n unknown: the stat as stored
    assert format_mean_std({"mean": 412.4, "std": 3.0}, scale=1, digits=0) == "412 ± 3"
    assert format_mean_std(None) == "—" and format_mean_std(None, missing="n/a") == "n/a"


def test_a_table_of_one_seed_says_so_once_in_its_caption_not_in_every_cell() -> None:
    assert format_mean_std(mean_std([0.442]), n=1, mark_one_seed=False) == "44.2"
    assert format_mean_std(mean_std([0.5, 0.52]), n=2, mark_one_seed=False) == "51.0 ± 1.4"  # a spread stays
    assert one_seed_only([1, 1]) and not one_seed_only([1, 3]) and not one_seed_only([1, None])
    assert not one_seed_only([])
    assert "one seed" in seeds_caption(True) and seeds_caption(False) == "mean ± std over seeds"


def test_aggregate_of_class_il_fwt_is_none() -> None:
    runs = [summarize(R3, B3, ANY3) for _ in range(3)]
    out = aggregate_runs(runs)
    assert out["FWT"] is None and out["A_AUC"] == {"mean": pytest.approx(0.6875), "std": 0.0}
    assert mean_std([None, None]) is None
    assert mean_std([0.2, None, 0.4]) == pytest.approx({"mean": 0.3, "std": statistics.stdev([0.2, 0.4])})
    assert mean_std(np.array([0.1, 0.3])) == pytest.approx({"mean": 0.2, "std": statistics.stdev([0.1, 0.3])})
    with pytest.raises(ValueError, match="finite"):
        mean_std([0.1, float("nan")])


# ------------------------------------------------------------------------------ evaluate
@pytest.fixture(scope="module")
def cl_metric():
    return load_metric(keep_in_memory=True)


def test_evaluate_module_matches_summarize(cl_metric) -> None:
    import evaluate

    direct = evaluate.load(str(METRIC_PATH), keep_in_memory=True)
    rng = np.random.default_rng(0)
    r = rng.uniform(size=(4, 4))
    for metric in (cl_metric, direct):
        assert metric.compute(accuracy_matrix=R3, untrained_accuracy=B3, anytime=ANY3) == pytest.approx(
            summarize(R3, B3, ANY3)
        )
        for scenario in SCENARIOS:
            got = metric.compute(accuracy_matrix=R3, untrained_accuracy=B3, anytime=ANY3, scenario=scenario)
            assert got == pytest.approx(summarize(R3, B3, ANY3, scenario=scenario))
        assert metric.compute(accuracy_matrix=R3, untrained_accuracy=B3)["FWT"] is None  # class-IL default
        assert metric.compute(accuracy_matrix=r.tolist()) == pytest.approx(summarize(r))


def test_evaluate_module_row_by_row(cl_metric) -> None:
    for row in R3:  # one add per task boundary
        cl_metric.add(accuracy_matrix=row)
    assert cl_metric.compute(untrained_accuracy=B3) == pytest.approx(summarize(R3, B3))
    for row in R3:
        cl_metric.add(accuracy_matrix=row)
    assert cl_metric.compute(untrained_accuracy=B3, scenario="domain")["FWT"] == pytest.approx(0.075)


def test_evaluate_module_validates(cl_metric) -> None:
    with pytest.raises(ValueError, match="square"):
        cl_metric.compute(accuracy_matrix=[[0.5, 0.5]])
    with pytest.raises(ValueError, match="scenario"):
        cl_metric.compute(accuracy_matrix=R3, scenario="online")
