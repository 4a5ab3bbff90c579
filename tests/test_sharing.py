"""Sharing: plots, model card with model-index, `hf-clroute push`, evaluate by repo id, BENCHMARKS.md."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from huggingface_hub import hf_hub_download, list_repo_files, metadata_load

from hf_clroute import AutoCLModel
from hf_clroute.bench.harness.suites import SuiteConfig, load_suite_backbone
from hf_clroute.bench.reports.report import write_benchmarks
from hf_clroute.cli import main
from hf_clroute.core.model import CLModel


@pytest.fixture(scope="module")
def bench_run(tiny_suite, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "tiny"
    assert main(["bench", "--suite", str(tiny_suite), "--seeds", "0", "--out", str(out), "--no-progress"]) == 0
    return out


def test_bench_writes_plots_and_one_adapter_per_method(bench_run):
    plots = {p.name for p in (bench_run / "plots").glob("*.png")}
    assert {"average_accuracy.png", "forgetting_per_task.png", "anytime_accuracy.png", "shallow_vs_deep.png",
            "accuracy_matrix_finetune.png", "accuracy_matrix_ncm.png"} <= plots
    assert all((bench_run / "plots" / p).stat().st_size > 1000 for p in plots)
    assert {p.name for p in (bench_run / "adapters").iterdir()} == {"finetune", "ncm"}
    row = json.loads((bench_run / "results.json").read_text())["methods"]["finetune"]
    assert {"deep_forgetting", "probe_A_T", "snr_final"} <= set(row)
    assert {r["probe"] for r in row["per_seed"]} == {"logistic"}  # which probe measured it travels with the row


def _predictions(model, suite):
    from hf_clroute.bench.harness.suites import build_stream

    _, collator = load_suite_backbone(suite)
    batch = collator([build_stream(suite, 0)[0].test[i] for i in range(6)])
    with torch.no_grad():
        return model.eval()(**{k: v for k, v in batch.items() if k != "labels"}).logits


def test_push_card_and_load_by_repo_id(bench_run, tiny_suite, hub_server, hub_repo_id, capsys):
    assert main(["push", str(bench_run), "--repo-id", hub_repo_id, "--method", "finetune"]) == 0
    files = set(list_repo_files(hub_repo_id))
    assert {"hf_clroute_config.json", "hf_clroute_model.safetensors", "README.md", "results.json",
            "plots/average_accuracy.png", "plots/accuracy_matrix_finetune.png"} <= files
    assert "plots/accuracy_matrix_ncm.png" not in files and "adapter_config.json" not in files  # not a PEFT adapter
    # The model-index parses and carries the run's A_T.
    meta = metadata_load(hf_hub_download(hub_repo_id, "README.md"))
    results = meta["model-index"][0]["results"]
    a_t = json.loads((bench_run / "results.json").read_text())["methods"]["finetune"]["A_T"]["mean"]
    assert any(m["value"] == round(a_t, 4) for r in results for m in r["metrics"])
    # Identical predictions from the repo id and from the local run directory.
    suite = SuiteConfig.load(str(tiny_suite))
    local = CLModel.from_pretrained(load_suite_backbone(suite)[0], bench_run / "adapters" / "finetune")
    remote = CLModel.from_pretrained(load_suite_backbone(suite)[0], hub_repo_id)
    assert torch.equal(_predictions(local, suite), _predictions(remote, suite))
    auto = AutoCLModel.from_pretrained(hub_repo_id)  # the repo id alone: the recorded backbone loads too
    assert torch.equal(_predictions(auto, suite), _predictions(local, suite))
    # `hf-clroute evaluate` re-runs the evaluation from the repo id.
    assert main(["evaluate", "--adapter", hub_repo_id, "--suite", str(tiny_suite)]) == 0
    assert "average over 2 tasks" in capsys.readouterr().out
    # The token never lands in a pushed file.
    token = os.environ["HF_TOKEN"]
    for name in files:
        assert token.encode() not in open(hf_hub_download(hub_repo_id, name), "rb").read()


def test_push_again_updates_in_place(bench_run, hub_server, hub_repo_id):
    assert main(["push", str(bench_run), "--repo-id", hub_repo_id, "--method", "ncm"]) == 0
    assert main(["push", str(bench_run), "--repo-id", hub_repo_id, "--method", "finetune"]) == 0
    config = json.loads(open(hf_hub_download(hub_repo_id, "hf_clroute_config.json", force_download=True)).read())
    assert config["method"] == "finetune"


def test_failed_push_is_clear_and_leaves_the_run_intact(bench_run, hub_down_endpoint, hub_repo_id, capsys):
    before = {p: p.read_bytes() for p in bench_run.rglob("*") if p.is_file()}
    assert main(["push", str(bench_run), "--repo-id", hub_repo_id, "--method", "finetune"]) == 3
    assert "local files are intact" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in bench_run.rglob("*") if p.is_file()} == before


def test_push_needs_a_method_when_the_run_has_several(bench_run, hub_server, hub_repo_id, capsys):
    assert main(["push", str(bench_run), "--repo-id", hub_repo_id]) == 2
    assert "--method" in capsys.readouterr().err


def test_benchmarks_page_is_generated_from_results(bench_run, tmp_path):
    root = tmp_path / "results"
    shutil.copytree(bench_run, root / "tiny", ignore=shutil.ignore_patterns("adapters"))
    page = write_benchmarks(root, tmp_path / "BENCHMARKS.md").read_text()
    commands = (root / "commands.md").read_text()
    assert "](results/tiny/results.md)" in page and "| tiny (suite tiny-mnist) |" in page
    assert "## tiny (suite tiny-mnist)" in commands and "hf-clroute bench --suite" in commands
    assert "| finetune |" in (root / "summary.md").read_text()
