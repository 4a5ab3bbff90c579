"""APN in the paper's LM setting: per-domain schedules (warm-up + cosine), variants branching from one
run on domain A, and patch usage reported per domain (issue 32)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hf_clroute.bench.harness.lr_schedule import LRSchedule
from hf_clroute.errors import UserInputError
from hf_clroute.methods.apn import usage_per_domain


def test_schedule_warms_up_linearly_then_decays_by_cosine_to_its_floor():
    s = LRSchedule(steps=11, learning_rate=0.01, warmup_steps=4, min_lr_ratio=0.1)
    rates = [s.lr_at(i) for i in range(11)]
    assert rates[:4] == pytest.approx([0.0025, 0.005, 0.0075, 0.01])  # linear, the peak at the warm-up's last step
    assert rates[4] == pytest.approx(0.01) and rates[-1] == pytest.approx(0.001)  # cosine from the peak to 0.1 x peak
    assert rates[7] == pytest.approx(0.001 + 0.009 * 0.5 * (1 + math.cos(math.pi * 3 / 6)))
    assert all(a >= b - 1e-12 for a, b in zip(rates[3:], rates[4:]))  # never rises after the warm-up
    assert [LRSchedule(steps=5, learning_rate=0.002, schedule="constant").lr_at(i) for i in range(5)] == [0.002] * 5


@pytest.mark.parametrize("kwargs, field", [
    ({"steps": 0, "learning_rate": 0.01}, "steps"),
    ({"steps": 5, "learning_rate": 0.01, "warmup_steps": 5}, "warmup_steps"),
    ({"steps": 5, "learning_rate": -1.0}, "learning_rate"),
    ({"steps": 5, "learning_rate": 0.01, "schedule": "linear"}, "schedule"),
    ({"steps": 5, "learning_rate": 0.01, "min_lr_ratio": 2.0}, "min_lr_ratio"),
])
def test_schedule_validation_names_the_field(kwargs, field):
    with pytest.raises(UserInputError, match=field):
        LRSchedule(**kwargs)


def test_usage_per_domain_counts_spread_and_share_in_the_first_domains_patches():
    usage = torch.zeros(2, 1, 8, dtype=torch.float64)
    usage[0, 0, :2] = 50.0  # domain A: patches 0, 1
    usage[1, 0, 4:] = 10.0  # domain B: patches 4-7, none of A's
    a, b = usage_per_domain(usage)
    assert a["assignments"] == 100.0 and b["assignments"] == 40.0
    assert a["patches_covering"] == 2 and b["patches_covering"] == 4
    assert a["usage_entropy"] == pytest.approx(math.log(2) / math.log(8))
    assert b["usage_entropy"] == pytest.approx(math.log(4) / math.log(8))
    assert a["share_in_first_cover"] == pytest.approx(1.0) and b["share_in_first_cover"] == 0.0
    usage[1, 0, 0] = 40.0  # now half of B's assignments land on A's patch 0
    assert usage_per_domain(usage)[1]["share_in_first_cover"] == pytest.approx(0.5)


def _suite(tmp_path, methods, phases):
    poem = tmp_path / "poems.txt"
    poem.write_text("".join(f"the rose is red and the sky is blue, line {i}\n" for i in range(300)))
    logs = tmp_path / "logs.txt"
    logs.write_text("".join(f"WARN step={i} grad={i / 3:.2f} loss={i / 7:.3f}\n" for i in range(300)))
    suite = {
        "base": "charlm-domains", "name": "tiny-phased", "domains": [str(poem), str(logs)],
        "model": {"n_layer": 1, "n_embd": 16, "n_head": 2}, "block_size": 32, "train_chars": 4000, "test_chars": 400,
        "training": {"batch_size": 4, "learning_rate": 0.003}, "methods": methods, "phases": phases,
    }
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite))
    return path


def test_phased_suite_trains_each_domain_its_steps_at_its_schedule_and_reports_usage_per_domain(tmp_path):
    from hf_clroute.bench.runners.lm import run

    phases = [{"steps": 6, "learning_rate": 0.01, "warmup_steps": 2}, {"steps": 3, "learning_rate": 0.002}]
    path = _suite(tmp_path, ["dense-all", "dense-ffn", "apn-all", "apn-ffn", "apn-frozen-routing-all"], phases)
    results = run(str(path), methods=None, seeds=[0], quick=False, out=tmp_path / "out")
    methods = results["methods"]
    schedules = [LRSchedule(**p) for p in phases]
    for name, m in methods.items():
        row = m["per_seed"][0]
        # each domain trained exactly its steps, starting and ending at the rates its schedule gives
        assert [p["steps"] for p in row["phase_lr"]] == [6, 3], name
        for phase, s in zip(row["phase_lr"], schedules):
            assert phase["first"] == pytest.approx(s.lr_at(0)) and phase["last"] == pytest.approx(s.lr_at(s.steps - 1))
            assert phase["peak"] == pytest.approx(s.learning_rate)
    # variants differing only after domain A branch from one run on it: the same model after A
    for group in (["dense-all", "dense-ffn"], ["apn-all", "apn-ffn", "apn-frozen-routing-all"]):
        after_a = [methods[v]["per_seed"][0]["ppl_matrix"][0] for v in group]
        assert all(row == after_a[0] for row in after_a), group
        assert methods[group[0]]["per_seed"][0]["ppl_matrix"][1] != methods[group[1]]["per_seed"][0]["ppl_matrix"][1]
    assert methods["dense-all"]["per_seed"][0]["ppl_matrix"][0] != methods["apn-all"]["per_seed"][0]["ppl_matrix"][0]
    # patch usage per domain: every token of every step of that domain, top_k = 4 patches, in each of 1 bank
    tokens_per_step = 4 * 32
    for name in ("apn-all", "apn-ffn", "apn-frozen-routing-all"):
        usage = methods[name]["per_seed"][0]["patch_usage_per_domain"]
        expected = [6 * tokens_per_step * 4, 3 * tokens_per_step * 4]
        assert [u["assignments"] for u in usage] == pytest.approx(expected, rel=0.05)
        assert 1 <= usage[1]["patches_covering"] <= 64 and 0 <= usage[1]["share_in_first_cover"] <= 1
        assert len(methods[name]["patch_usage_per_domain"]) == 2
    a_usage = [methods[v]["per_seed"][0]["patch_usage_per_domain"][0] for v in ("apn-all", "apn-ffn")]
    assert a_usage[0] == a_usage[1]  # domain A's usage comes from the one shared run
    text = (tmp_path / "out" / "results.md").read_text()
    assert "patch usage per domain" in text and "6 steps of 4 windows at peak rate 0.01" in text


def test_phases_must_match_the_domains(tmp_path):
    from hf_clroute.bench.runners.lm import CharLMSuite

    with pytest.raises(UserInputError, match="2 domains"):
        CharLMSuite.load(str(_suite(tmp_path, ["dense-all"], [{"steps": 3, "learning_rate": 0.01}])))
    with pytest.raises(UserInputError, match=r"phases\[1\]"):
        CharLMSuite.load(str(_suite(tmp_path, ["dense-all"], [{"steps": 3, "learning_rate": 0.01},
                                                               {"steps": 3, "lr": 0.01}])))


@pytest.mark.parametrize("name", ["charlm-shakespeare-kjv", "charlm-shakespeare-kjv-long"])
def test_the_committed_apn_suites_are_the_issue_setting(name):
    from hf_clroute.bench.runners.lm import CharLMSuite, expand_variants

    suite = CharLMSuite.load(name)
    assert suite.domains == ["shakespeare", "kjv"]
    a, b = suite.schedules()
    assert a.warmup_steps > 0 and a.schedule == "cosine" and b.schedule == "cosine"
    assert b.steps < a.steps and b.learning_rate < a.learning_rate  # B: a stated, smaller adaptation budget
    assert {"dense-all", "dense-ffn", "apn-all", "apn-ffn"} <= set(expand_variants(suite.methods))


def test_the_long_apn_suite_differs_from_its_base_only_in_training_length():
    from hf_clroute.bench.runners.lm import CharLMSuite

    base, long = CharLMSuite.load("charlm-shakespeare-kjv"), CharLMSuite.load("charlm-shakespeare-kjv-long")
    (a, b), (long_a, long_b) = base.schedules(), long.schedules()
    assert long_a.steps == 10 * a.steps and long_b.steps == 10 * b.steps  # B keeps A's ratio
    assert (long_a.learning_rate, long_b.learning_rate) == (a.learning_rate, b.learning_rate)
    assert (long.domains, long.methods, long.training) == (base.domains, base.methods, base.training)
