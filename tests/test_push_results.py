"""`hf-clroute push-results` (a run's evaluation as a Hub dataset repo) and the `.eval_results/*.yaml` files
of an adapter push, against the local Hub server: `datasets.load_dataset` reads the table back, bad input
stops before the Hub is called, and a push that fails at its commit leaves the repo as it was."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from huggingface_hub import (
    DatasetCard,
    HfApi,
    hf_hub_download,
    list_repo_files,
    metadata_load,
    parse_eval_result_entries,
)

from hf_clroute.cli import main
from hf_clroute.commands.push_results import TABLE_FILE, seed_rows, seed_table, stage_run
from hf_clroute.core.model_card import eval_result_entries

REPO_ROOT = Path(__file__).resolve().parents[1]
PICK = {"pick": {"training.learning_rate": 0.001}, "chosen_on": "hf-clroute tune, the validation split of seed 0"}


def seed_row(seed: int, a_t: float) -> dict:
    return {"seed": seed, "A_T": a_t, "F_T": 0.25, "BWT": -0.25, "FWT": None, "A_bar": a_t + 0.1, "A_AUC": a_t,
            "probe": "logistic", "trainable_params": 10 + seed, "accuracy_matrix": [[1.0, 0.0], [0.75, a_t]],
            "selection": PICK, "precision": {"train": {"dtype": "fp32"}}, "anytime": [[10, 0.5]]}


def tiny_results(a_t: float = 0.5) -> dict:
    methods = {}
    for offset, method in enumerate(("ncm", "finetune")):
        rows = [seed_row(seed, a_t + offset / 10 + seed / 100) for seed in (0, 1)]
        stats = {k: {"mean": sum(r[k] for r in rows) / 2, "std": 0.005} for k in ("A_T", "F_T", "BWT", "A_bar")}
        methods[method] = {**stats, "FWT": None, "per_seed": rows, "trainable_params": 10, "trainable_pct": 1.0,
                           "selection": PICK}
    config = {"dataset": "mnist", "n_tasks": 2, "scenario": "class", "backbone": "tiny-vit",
              "description": "MNIST, 2 tasks x 2 classes", "training": {"batch_size": 8}}
    return {"kind": "classification", "suite": "tiny-mnist", "seeds": [0, 1], "config": config, "methods": methods,
            "commands": ["hf-clroute bench --suite tiny-mnist --seeds 0,1 --out run"]}


def write_run(root: Path, results: dict) -> Path:
    """A run folder as `hf-clroute bench --out` leaves it: results, table, selection, plots and an adapter."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "results.json").write_text(json.dumps(results, indent=2))
    (root / "results.md").write_text("# tiny-mnist (seeds 0, 1)\n\n| method | A_T |\n|---|---|\n| ncm | 50.5 |\n")
    (root / "selection.json").write_text(json.dumps({"ncm": PICK}))
    (root / "plots").mkdir(exist_ok=True)
    (root / "plots" / "average_accuracy.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
    (root / "adapters" / "ncm").mkdir(parents=True, exist_ok=True)
    (root / "adapters" / "ncm" / "hf_clroute_model.safetensors").write_bytes(b"not pushed with the results")
    return root


def snapshot(root: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def online_datasets(monkeypatch):
    """`datasets` may reach the local Hub (the suite runs with HF_DATASETS_OFFLINE=1)."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    return datasets


# ---- the round trip ------------------------------------------------------------------------------------
def test_push_results_round_trips_into_load_dataset(hub_server, hub_repo_id, tmp_path, online_datasets, capsys):
    run = write_run(tmp_path / "run", tiny_results())
    before = snapshot(run)
    assert main(["push-results", str(run), "--repo-id", hub_repo_id]) == 0
    assert hub_repo_id in capsys.readouterr().out
    files = set(list_repo_files(hub_repo_id, repo_type="dataset"))
    assert files == {".gitattributes", "README.md", "results.json", "results.md", "selection.json",
                     "plots/average_accuracy.png", TABLE_FILE}  # no adapter: that is `hf-clroute push`'s
    assert snapshot(run) == before

    table = online_datasets.load_dataset(hub_repo_id)["train"]  # the card's `configs:` names the table
    assert table.num_rows == 4 and table.column_names[:3] == ["method", "seed", "A_T"]
    results = tiny_results()
    for row in table:
        want = next(r for r in results["methods"][row["method"]]["per_seed"] if r["seed"] == row["seed"])
        assert row["A_T"] == want["A_T"] and row["accuracy_matrix"] == want["accuracy_matrix"]
        assert row["FWT"] is None and row["probe"] == "logistic" and json.loads(row["selection"]) == PICK
    assert "precision" not in table.column_names  # nested records stay in results.json

    card = DatasetCard.load(hub_repo_id, repo_type="dataset")
    assert card.data.configs[0]["data_files"][0]["path"] == TABLE_FILE
    for expected in ("tiny-mnist", "- **seeds:** 0, 1", "hf-clroute bench --suite tiny-mnist", "training.learning_rate",
                     "hf-clroute tune, the validation split of seed 0", "**Library versions:**", "datasets",
                     "self-reported", "| ncm | 50.5 |"):
        assert expected in card.text, expected


def test_a_second_push_replaces_the_first_in_one_commit(hub_server, hub_repo_id, tmp_path, online_datasets):
    run = write_run(tmp_path / "run", tiny_results(0.5))
    assert main(["push-results", str(run), "--repo-id", hub_repo_id]) == 0
    (run / "plots" / "average_accuracy.png").rename(run / "plots" / "renamed.png")
    (run / "results.json").write_text(json.dumps(tiny_results(0.6)))
    assert main(["push-results", str(run), "--repo-id", hub_repo_id]) == 0
    files = set(list_repo_files(hub_repo_id, repo_type="dataset"))
    assert "plots/renamed.png" in files and "plots/average_accuracy.png" not in files  # no stale plot
    table = online_datasets.load_dataset(hub_repo_id, split="train", download_mode="force_redownload")
    assert sorted(table["A_T"])[0] == pytest.approx(0.6)


# ---- a failed push leaves nothing half-written ----------------------------------------------------------
def test_a_push_failing_at_its_commit_leaves_the_repo_and_the_run_as_they_were(hub_server, hub_repo_id,
                                                                                tmp_path, capsys):
    api = HfApi()
    run = write_run(tmp_path / "run", tiny_results(0.5))
    assert main(["push-results", str(run), "--repo-id", hub_repo_id]) == 0
    first = api.dataset_info(hub_repo_id)
    (run / "results.json").write_text(json.dumps(tiny_results(0.9)))
    (run / "plots" / "new.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 2048)  # an LFS upload before the commit
    before = snapshot(run)
    with hub_server.faulty("error", routes=("commit",)):  # uploads pass, the commit answers 500
        assert main(["push-results", str(run), "--repo-id", hub_repo_id]) == 3
    err = capsys.readouterr().err
    assert f"to dataset '{hub_repo_id}' failed" in err and "500" in err and "local files are intact" in err
    assert api.dataset_info(hub_repo_id).sha == first.sha  # the repo is at the first push's commit
    assert set(list_repo_files(hub_repo_id, repo_type="dataset")) == {s.rfilename for s in first.siblings}
    assert snapshot(run) == before

    fresh = hub_repo_id + "-new"
    with hub_server.faulty("error", routes=("commit",)):
        assert main(["push-results", str(run), "--repo-id", fresh]) == 3
    assert list_repo_files(fresh, repo_type="dataset") == [".gitattributes"]  # created, none of the run's files


def test_a_hub_that_answers_garbage_is_one_line(hub_server, hub_repo_id, tmp_path, capsys):
    run = write_run(tmp_path / "run", tiny_results())
    with hub_server.faulty("garbage"):
        assert main(["push-results", str(run), "--repo-id", hub_repo_id]) == 3
    assert f"the Hub at {hub_server.url}" in capsys.readouterr().err


@pytest.mark.parametrize("case, message", [
    ("missing", "no run directory at"),
    ("file", "is a file; expected an `hf-clroute bench --out` run directory"),
    ("no_results", r"is not a bench run directory \(no results.json\)"),
    ("not_json", "results file .*results.json is not valid JSON"),
    ("no_methods", "has no 'methods' table"),
    ("no_seeds", "records no per-seed rows"),
    ("bad_repo", "--repo-id 'me/a/b' is not a Hub repo id"),
])
def test_bad_input_stops_before_the_hub(case, message, hub_down_endpoint, tmp_path, capsys):
    run, repo_id = write_run(tmp_path / "run", tiny_results()), "me/results"
    if case == "missing":
        run = tmp_path / "nowhere"
    elif case == "file":
        run = run / "results.md"
    elif case == "no_results":
        (run / "results.json").unlink()
    elif case == "not_json":
        (run / "results.json").write_text("{ half")
    elif case == "no_methods":
        (run / "results.json").write_text(json.dumps({"suite": "x"}))
    elif case == "no_seeds":
        results = tiny_results()
        for row in results["methods"].values():
            row.pop("per_seed")
        (run / "results.json").write_text(json.dumps(results))
    else:
        repo_id = "me/a/b"
    assert main(["push-results", str(run), "--repo-id", repo_id]) == 2  # 3 would mean the Hub was called
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.search(message, err), err


# ---- the table from committed runs of every runner --------------------------------------------------------
@pytest.mark.parametrize("name", ["split-mnist", "charlm-domains", "permuted-mnist"])
def test_committed_runs_tabulate_every_seed(name, tmp_path):
    import pyarrow.parquet as pq

    run = REPO_ROOT / "results" / name
    if not (run / "results.json").is_file():
        pytest.skip(f"no committed results/{name}")
    results = json.loads((run / "results.json").read_text())
    staged = stage_run(run, results, "me/x", tmp_path)
    table = pq.read_table(tmp_path / TABLE_FILE)
    assert table.num_rows == sum(len(row.get("per_seed") or []) for row in results["methods"].values())
    assert {"README.md", "results.json", TABLE_FILE} <= set(staged)
    assert table.schema.field("seed").type == "int64"
    matrices = [f for f in table.schema if f.name.endswith("_matrix")]
    assert all(str(f.type.value_type.value_type) == "double" for f in matrices)  # lists of lists of floats
    if name == "split-mnist":
        assert {"A_T", "F_T", "accuracy_matrix"} <= set(table.column_names)


def test_the_table_keeps_one_type_per_column():
    rows = seed_rows({"methods": {"a": {"per_seed": [{"seed": 0, "x": 1, "y": True, "z": "s", "w": None},
                                                     {"seed": 1, "x": 0.5, "y": False, "z": 3, "w": None}]}}})
    table = seed_table(rows)
    types = {f.name: str(f.type) for f in table.schema}
    assert types == {"method": "string", "seed": "int64", "w": "double", "x": "double", "y": "bool", "z": "string"}
    assert table.column("x").to_pylist() == [1.0, 0.5] and table.column("z").to_pylist() == ['"s"', "3"]


# ---- .eval_results/*.yaml ----------------------------------------------------------------------------------
def test_eval_result_entries_name_the_benchmark_and_say_self_reported():
    results = tiny_results()
    entries = eval_result_entries(results, "ncm")
    assert set(entries) == {"tiny-mnist_A_T.yaml", "tiny-mnist_F_T.yaml", "tiny-mnist_BWT.yaml",
                            "tiny-mnist_A_bar.yaml"}  # FWT is undefined (None): no file
    a_t = entries["tiny-mnist_A_T.yaml"]
    assert (a_t.dataset_id, a_t.task_id, a_t.verify_token) == ("ylecun/mnist", "tiny-mnist_A_T", None)
    assert a_t.value == round(results["methods"]["ncm"]["A_T"]["mean"], 4) and "self-reported" in a_t.notes
    fashion = {**results, "config": {**results["config"], "dataset": "fashion_mnist"}}
    assert eval_result_entries(fashion, "ncm")["tiny-mnist_A_T.yaml"].dataset_id == "zalando-datasets/fashion_mnist"
    wordnet = {**results, "config": {**results["config"], "dataset": "wordnet"}}
    assert eval_result_entries(wordnet, "ncm") == {}  # no Hub copy named: the model-index alone carries it
    named = eval_result_entries(wordnet, "ncm", dataset_id="me/wordnet")
    assert named["tiny-mnist_A_T.yaml"].dataset_id == "me/wordnet"
    with pytest.raises(ValueError, match="not a Hub dataset id"):
        eval_result_entries(results, "ncm", dataset_id="./local")


def test_an_adapter_push_carries_eval_results_beside_the_model_index(hub_server, hub_repo_id, tmp_path):
    import torch
    from transformers import ViTModel

    from hf_clroute import get_cl_model
    from hf_clroute.backbones.catalog import tiny_vit_config
    from hf_clroute.baselines import NCMConfig

    torch.manual_seed(0)
    model = get_cl_model(ViTModel(tiny_vit_config()), NCMConfig())
    model.grow_head(4)
    run = write_run(tmp_path / "run", tiny_results())
    model.save_pretrained(run / "adapters" / "ncm")
    assert main(["push", str(run), "--repo-id", hub_repo_id, "--method", "ncm"]) == 0
    files = set(list_repo_files(hub_repo_id))
    assert {".eval_results/tiny-mnist_A_T.yaml", ".eval_results/tiny-mnist_F_T.yaml"} <= files
    a_t = tiny_results()["methods"]["ncm"]["A_T"]["mean"]
    entries = parse_eval_result_entries(yaml.safe_load(open(hf_hub_download(hub_repo_id, ".eval_results/"
                                                                                          "tiny-mnist_A_T.yaml"))))
    assert [(e.dataset_id, e.task_id, e.value) for e in entries] == [("ylecun/mnist", "tiny-mnist_A_T", round(a_t, 4))]
    assert entries[0].verify_token is None and "self-reported" in entries[0].notes
    index = metadata_load(hf_hub_download(hub_repo_id, "README.md"))["model-index"][0]["results"]
    assert any(m["value"] == round(a_t, 4) for r in index for m in r["metrics"])  # the model-index stays


def test_a_fault_names_only_known_routes(hub_server):
    with pytest.raises(ValueError, match="unknown route"):
        with hub_server.faulty("error", routes=("no-such-route",)):
            pass
    assert hub_server.fault is None
