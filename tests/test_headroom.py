"""The headroom study runner: adapters trained on all tasks joined, readouts on adapted vs frozen features."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from hf_clroute.backbones.catalog import get_blocks
from hf_clroute.bench.harness.suites import SuiteConfig, build_stream, load_suite_backbone
from hf_clroute.bench.studies.headroom import (
    READOUTS,
    HeadroomSuite,
    _choose,
    adapt,
    build_adapter,
    feature_splits,
    joint_experience,
    probe_readout,
    ranpac_readout,
    slda_readout,
    tune_grid,
)
from hf_clroute.cli import main


@pytest.fixture(scope="module")
def headroom_file(tiny_suite, tmp_path_factory):
    """A headroom study over the tiny MNIST suite (with a validation split): two adapters, tiny grids."""
    root = tmp_path_factory.mktemp("headroom")
    suite = root / "tiny-val.json"
    suite.write_text(json.dumps({"base": str(tiny_suite), "name": "tiny-mnist-val", "validation_per_class": 4}))
    study = {
        "name": "headroom-tiny", "runner": "headroom", "suite": str(suite),
        "adapters": ["rwf-identity-cosine", "lastblock"],
        "adapter_settings": {"rwf-identity-cosine": {"method": "rwf", "config": {"value_init": "identity"}}},
        "epochs": [1, 2], "learning_rates": [0.001], "ranpac_projection_dim": 64, "max_extensions": 0,
    }
    path = root / "headroom-tiny.json"
    path.write_text(json.dumps(study))
    return path


@pytest.fixture(scope="module")
def bench_part(headroom_file, tmp_path_factory):
    """`hf-clroute bench` of the study on some seeds ("0" or "0,1") for one adapter, each run once per module;
    the tests only read these folders (copy one before changing it)."""
    done = {}

    def run(seeds: str, method: str) -> Path:
        if (seeds, method) not in done:
            out = tmp_path_factory.mktemp("part") / f"s{seeds}-{method}"
            assert main(["bench", "--suite", str(headroom_file), "--seeds", seeds, "--methods", method,
                         "--out", str(out)]) == 0
            done[seeds, method] = out
        return done[seeds, method]

    return run


def test_runner_writes_every_adapter_and_readout_against_the_same_frozen_features(headroom_file, tmp_path):
    out = tmp_path / "run"
    assert main(["bench", "--suite", str(headroom_file), "--seeds", "0", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["kind"] == "headroom" and results["commands"][0].startswith("hf-clroute bench --suite")
    assert set(results["methods"]) == {"rwf-identity-cosine", "lastblock"}
    rows = [m["per_seed"][0] for m in results["methods"].values()]
    for readout in READOUTS:
        # One frozen feature set per seed: every adapter is compared with the same frozen readout.
        assert rows[0]["readouts"][readout]["frozen"] == rows[1]["readouts"][readout]["frozen"]
        assert rows[0]["readouts"][readout]["frozen"] == results["frozen"][0][readout]["test"]
        for row in rows:
            r = row["readouts"][readout]
            assert r["gain"] == pytest.approx(r["adapted"] - r["frozen"])
    for row in rows:
        assert len(row["grid"]) == 2 and row["pick"]["epochs"] in (1, 2)
        # either epoch count is an edge, and no extension was allowed, unless both score the same (inert)
        assert row["edge"] or len({p["validation"] for p in row["grid"]}) == 1
        assert row["selection"]["chosen_on"] == "the validation split of the row's seed"
        for readout in READOUTS:  # every readout's knob was chosen on validation, and says where it ended
            r = row["readouts"][readout]
            assert r["pick"] and 0 <= r["validation"] <= 1 and isinstance(r["edge"], bool)
    # RanPAC's lambda searches tune's relative grid (units of trace(G)/M), the probe its L2
    assert [t["ridge_lambda"] for t in results["frozen"][0]["ranpac"]["tried"]][:12] == tune_grid("ranpac")
    assert results["config"]["ranpac_lambdas"] == tune_grid("ranpac")
    table = (out / "results.md").read_text()
    lines = [line for line in table.splitlines() if line.startswith("| ") and "adapter" not in line]
    assert len(lines) == 2 * len(READOUTS)
    assert {line.split("|")[2].strip().removesuffix(" *") for line in lines} == set(READOUTS)
    assert sum(line.split("|")[2].strip().endswith(" *") for line in lines) == 2  # the strongest, per adapter
    if all(row["edge"] for row in rows):  # the edge picks are marked (an inert epoch axis is no edge)
        assert all(line.split("|")[-2].strip().endswith("†") for line in lines)
    assert "(one seed, no test)" in table and "± 0.0" not in table  # one seed: no paired std to show


def test_runs_split_by_adapter_merge_into_one_study_with_one_frozen_row_per_seed(bench_part, tmp_path):
    parts = [bench_part("0", name) for name in ("rwf-identity-cosine", "lastblock")]  # one seed, two jobs
    out = tmp_path / "merged"
    assert main(["merge", *map(str, parts), "--out", str(out)]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert set(merged["methods"]) == {"rwf-identity-cosine", "lastblock"} and merged["seeds"] == [0]
    first = json.loads((parts[0] / "results.json").read_text())
    assert len(merged["frozen"]) == 1  # the seed's frozen readouts, once: both runs read the same features
    assert {r: merged["frozen"][0][r] for r in READOUTS} == {r: first["frozen"][0][r] for r in READOUTS}
    assert [c.split()[1] for c in merged["commands"]] == ["bench", "bench", "merge"]


def test_a_later_seed_merges_into_the_committed_study_in_place(bench_part, tmp_path):
    """The per-seed parts are not committed: a new seed joins the merged study itself, which keeps its seeds."""
    out = tmp_path / "study"
    assert main(["merge", str(bench_part("0", "lastblock")), "--out", str(out)]) == 0
    assert main(["merge", str(out), str(bench_part("1", "lastblock")), "--out", str(out)]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert merged["seeds"] == [0, 1] and [r["seed"] for r in merged["frozen"]] == [0, 1]
    assert [r["seed"] for r in merged["methods"]["lastblock"]["per_seed"]] == [0, 1]


@pytest.mark.parametrize("committed", [True, False])
def test_wordnet_headroom_script_joins_new_seeds_to_the_committed_study(tmp_path, committed):
    """`SEEDS=2 scripts/fsa_tables.sh headroom-wordnet` on a fresh clone (no parts) must not drop seeds 0-1."""
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "scripts").mkdir()
    shutil.copy(root / "scripts" / "fsa_tables.sh", tmp_path / "scripts")
    fake = tmp_path / "bin" / "hf-clroute"  # records each call; a bench makes its --out directory
    fake.parent.mkdir()
    fake.write_text('#!/usr/bin/env bash\necho "$*" >> "$LOG"\n'
                    'if [ "$1" = bench ]; then while [ "$1" != --out ]; do shift; done; mkdir -p "$2"; fi\n')
    fake.chmod(0o755)
    if committed:
        (tmp_path / "results" / "headroom-wordnet-cpu").mkdir(parents=True)
        (tmp_path / "results" / "headroom-wordnet-cpu" / "results.json").write_text("{}")
    log = tmp_path / "calls.log"
    env = {**os.environ, "BIN": str(fake.parent), "LOG": str(log), "SEEDS": "2", "ADAPTERS": "lora"}
    subprocess.run(["bash", str(tmp_path / "scripts" / "fsa_tables.sh"), "headroom-wordnet"], env=env, check=True)
    calls = log.read_text().splitlines()
    assert calls[0].startswith("bench --suite headroom-wordnet-cpu --seeds 2 --methods lora")
    earlier = "results/headroom-wordnet-cpu " if committed else ""
    assert calls[1] == f"merge --out results/headroom-wordnet-cpu {earlier}results/headroom-wordnet-cpu.parts/s2-lora"
    assert calls[2] == "report"


def test_a_merge_refuses_seeds_run_with_different_picks(bench_part, tmp_path):
    from hf_clroute.errors import UserInputError

    parts = [bench_part("0", "lastblock"), tmp_path / "s1"]
    shutil.copytree(bench_part("1", "lastblock"), parts[1])
    results = json.loads((parts[1] / "results.json").read_text())
    row = results["methods"]["lastblock"]["per_seed"][0]
    row["selection"]["learning_rates"] = [0.01]  # as if seed 1 had chosen its pick from another grid
    (parts[1] / "results.json").write_text(json.dumps(results))
    from hf_clroute.bench.studies.headroom import merge

    with pytest.raises(UserInputError, match=r"'lastblock'.*different picks.*seeds \[0\].*seeds \[1\]"):
        merge(parts, tmp_path / "merged")
    assert not (tmp_path / "merged" / "results.json").exists()


def _blobs(seed: int, n: int, classes: int = 4, dim: int = 8, spread: float = 1.0):
    generator = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, dim, generator=torch.Generator().manual_seed(123)) * 2
    y = torch.arange(classes).repeat_interleave(n)
    return means[y] + spread * torch.randn(len(y), dim, generator=generator), y


def test_readouts_choose_their_knob_on_validation_and_flag_edges():
    splits = {"train": _blobs(0, 40), "validation": _blobs(1, 10), "test": _blobs(2, 10)}
    for record in (slda_readout(splits, [1e-4, 1e-2]), ranpac_readout(splits, [1e-2, 1.0], 64, 0),
                   probe_readout(splits, [1e-4, 1e-3])):
        assert record["test"] > 0.9 and record["validation"] > 0.9
        assert record["validation"] == max(t["validation"] for t in record["tried"])
    # The rule of hf-clroute tune: an edge pick extends its axis (geometric step), up to max_extensions
    # runs; a pick still on the edge then is flagged; an axis's valid range ends the extension.
    rising = _choose("ranpac", [1.0, 10.0], lambda v: v, max_extensions=2)
    assert [t["ridge_lambda"] for t in rising["tried"]] == [1.0, 10.0, 100.0, 1000.0]
    assert rising["pick"] == {"ridge_lambda": 1000.0} and rising["edge"]
    peaked = _choose("ranpac", [1.0, 10.0], lambda v: -abs(math.log10(v) - 2), max_extensions=3)
    assert peaked["pick"] == {"ridge_lambda": 100.0} and not peaked["edge"]
    capped = _choose("slda", [0.1, 0.3], lambda v: v, max_extensions=3, valid=lambda v: 0 < v <= 1)
    assert capped["pick"] == {"shrinkage": 0.9} and capped["edge"]
    assert capped["edge_axes"][0]["reason"] == "end of the axis's valid range"
    # RanPAC's lambda is relative: the readout's solve uses pick * trace(G)/M, the grid is tune's
    default = HeadroomSuite(name="x", runner="headroom", suite="split-mnist", adapters=["lora"])
    assert default.ranpac_lambdas == tune_grid("ranpac") and default.slda_shrinkage == tune_grid("slda")


def test_adapted_module_is_frozen_and_lastblock_trains_the_last_block(headroom_file):
    headroom = HeadroomSuite.load(str(headroom_file))
    suite = SuiteConfig.load(headroom.suite)
    model, _ = build_adapter(headroom, suite, "lastblock", 0, 1e-3, 1)
    last = {id(p) for p in get_blocks(model.backbone)[-1].parameters()}
    trained = {id(p) for p in model.backbone.parameters() if p.requires_grad}
    assert trained == last
    _, collator = load_suite_backbone(suite)
    joint = joint_experience(build_stream(suite, 0), 0)
    trained, record = adapt(headroom, suite, "rwf-identity-cosine", 0, joint, collator)
    assert record["pick"] == {"learning_rate": 1e-3, "epochs": record["pick"]["epochs"]}
    assert not any(p.requires_grad for p in trained.parameters()) and not trained.training
    assert len(joint.train) == sum(len(e.train) for e in build_stream(suite, 0))


def test_feature_passes_run_the_backbone_in_eval_mode(headroom_file, tmp_path):
    from transformers import ViTModel

    from hf_clroute.backbones.catalog import tiny_vit_config
    from hf_clroute.baselines import FinetuneConfig
    from hf_clroute.core.model import get_cl_model

    headroom = HeadroomSuite.load(str(headroom_file))
    suite = SuiteConfig.load(headroom.suite)
    _, collator = load_suite_backbone(suite)
    torch.manual_seed(0)
    backbone = ViTModel(tiny_vit_config(hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5))
    model = get_cl_model(backbone, FinetuneConfig(freeze_backbone=True)).train()
    joint = joint_experience(build_stream(suite, 0), 0)
    batch = collator([joint.test[i] for i in range(4)])
    noisy = [model(pixel_values=batch["pixel_values"]).features for _ in range(2)]
    assert not torch.equal(*noisy)  # dropout is live in train mode ...
    first, second = feature_splits(model, joint, collator), feature_splits(model, joint, collator)
    for split in ("train", "validation", "test"):
        assert torch.equal(first[split][0], second[split][0])  # ... and off in every feature pass


def test_bad_headroom_suite_is_refused_before_training(tmp_path):
    with pytest.raises(ValueError, match="adapter_settings names"):
        HeadroomSuite(name="x", runner="headroom", suite="split-mnist", adapters=["lora"],
                      adapter_settings={"lroa": {"method": "lora"}})
    with pytest.raises(ValueError, match="learning_rates"):
        HeadroomSuite(name="x", runner="headroom", suite="split-mnist", adapters=["lora"], learning_rates=[])


class _ScriptedTrainer:
    """Stands in for the engine in ``adapt``: validation after each epoch from ``score(lr, epoch)``."""

    score = None
    calls: list = []

    def __init__(self, model, stream, training, *args, **kwargs):
        self.model, self.training = model, training

    def fit(self):
        lr, epochs = self.training.learning_rate, self.training.epochs
        type(self).calls.append((lr, epochs))
        self.model.trained = (lr, epochs)
        return type("Result", (), {"anytime": [(e, type(self).score(lr, e)) for e in range(1, epochs + 1)]})()


@pytest.mark.parametrize("peak_epochs, calls, pick, edge", [
    # Better with every epoch: lr extends low (1e-4, no better), then epochs high (4, better); the pick is
    # still on the epochs edge when the 2 extensions are used up, and is the run at 4 epochs itself.
    (None, [(1e-3, 2), (1e-2, 2), (1e-4, 2), (1e-3, 4)], {"learning_rate": 1e-3, "epochs": 4}, True),
    # Best at 2 epochs: the extension to 4 is worse, so the pick (2 epochs) is trained again for exactly that.
    (2, [(1e-3, 2), (1e-2, 2), (1e-4, 2), (1e-3, 4), (1e-3, 2)], {"learning_rate": 1e-3, "epochs": 2}, False),
])
def test_an_edge_pick_extends_its_axis_by_tunes_rule(headroom_file, monkeypatch, peak_epochs, calls, pick, edge):
    import dataclasses
    import math

    import hf_clroute.bench.studies.headroom as headroom_module

    def score(lr, epochs):
        quality = epochs if peak_epochs is None else -abs(epochs - peak_epochs)
        return 0.1 * quality - 0.01 * abs(math.log10(lr) + 3)  # learning rate best at 1e-3, in the grid

    class Model(torch.nn.Linear):
        def parameter_counts(self):
            return {"trainable_params": 3}

    @dataclasses.dataclass
    class Training:  # what ``adapt`` reads of a TrainingConfig (a dataclass, so ``dataclasses.replace`` works)
        learning_rate: float
        epochs: int
        progress: bool = False

    def build(headroom, suite, name, seed, learning_rate, epochs):
        return Model(1, 1), Training(learning_rate, epochs)

    _ScriptedTrainer.score, _ScriptedTrainer.calls = staticmethod(score), []
    monkeypatch.setattr(headroom_module, "ContinualTrainer", _ScriptedTrainer)
    monkeypatch.setattr(headroom_module, "build_adapter", build)
    monkeypatch.setattr(headroom_module, "make_accelerator", lambda training: None)
    headroom = HeadroomSuite(name="x", runner="headroom", suite="split-mnist", adapters=["lora"], epochs=[1, 2],
                             learning_rates=[1e-3, 1e-2], max_extensions=2)
    suite = SuiteConfig.load(HeadroomSuite.load(str(headroom_file)).suite)
    joint = joint_experience(build_stream(suite, 0), 0)
    model, record = adapt(headroom, suite, "lora", 0, joint, collator=None)
    assert _ScriptedTrainer.calls == calls
    assert record["pick"] == pick and model.trained == (pick["learning_rate"], pick["epochs"])
    assert [e["axis"] for e in record["extensions"]] == ["learning_rate", "epochs"]
    assert record["edge"] is edge and len(record["grid"]) == 4 + 2
    assert headroom_module.adapter_edge({**record, "edge": None}) is edge  # the table reads the same from the points
    assert not model.weight.requires_grad and not model.training
    with pytest.raises(ValueError, match="max_extensions"):
        HeadroomSuite(name="x", runner="headroom", suite="split-mnist", adapters=["lora"], max_extensions=-1)


def test_an_adapter_with_one_seed_reads_one_seed_beside_one_with_two(bench_part, tmp_path):
    parts = [bench_part("0,1", "lastblock"), bench_part("0", "rwf-identity-cosine")]
    out = tmp_path / "merged"
    assert main(["merge", *map(str, parts), "--out", str(out)]) == 0
    lines = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| ")]
    one = [line for line in lines if line.startswith("| rwf-identity-cosine |")]
    two = [line for line in lines if line.startswith("| lastblock |")]
    assert len(one) == len(two) == len(READOUTS)
    assert all("(one seed)" in line and "± 0.0" not in line for line in one)  # not a std of one value
    assert all("(one seed)" not in line.split("|")[3] and "±" in line.split("|")[3] for line in two)
