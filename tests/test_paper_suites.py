"""The papers' settings as suites (Split-CIFAR-100, Split-ImageNet-R on ViT-B/16, Banking77 on
BERT-base), and the same suites run offline on stand-ins with the real shapes, through
`accelerate launch`, in full precision and in bf16 mixed precision."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_clroute.backbones.pretraining.standins import (
    STANDIN_BACKBONES,
    STANDIN_DATASETS,
    bert_base_config,
    vit_b16_config,
)
from hf_clroute.bench.harness.settings import resolve_run
from hf_clroute.bench.harness.suites import SuiteConfig, build_stream, load_suite_backbone

REPO = Path(__file__).resolve().parents[1]
PAPER_SUITES = ("split-cifar100", "split-imagenet-r", "split-banking77")
# What each stand-in run trains: fine-tuning, RwF and one statistics head (nothing trained).
RUNS = [(f"{suite}-standin", method) for suite in PAPER_SUITES
        for method in ("finetune", "rwf", "ranpac" if suite == "split-banking77" else "slda")]


def test_paper_suites_name_the_hub_data_the_backbone_and_the_papers_settings():
    cifar, imr, bank = (SuiteConfig.load(name) for name in PAPER_SUITES)
    assert (cifar.dataset, cifar.input_column, cifar.label_column) == ("uoft-cs/cifar100", "img", "fine_label")
    imr_columns = (imr.dataset, imr.input_column, imr.train_split, imr.test_split)
    assert imr_columns == ("axiong/imagenet-r", "image", "test", None)
    assert cifar.backbone == imr.backbone == "google/vit-base-patch16-224-in21k" and cifar.image_size == 224
    assert bank.backbone == "bert-base-uncased" and bank.dataset == "legacy-datasets/banking77"
    # 10 tasks each: 100 classes x 10, 200 x 20, 70 x 7; online (one pass), batch 10.
    assert [s.n_tasks for s in (cifar, imr, bank)] == [10, 10, 10] and bank.max_classes == 70
    baselines = {"simplecil", "slda", "ranpac", "rwf-head-only", "mars-head-only", "knn"}
    for suite in (cifar, imr, bank):
        assert suite.training["epochs"] == 1 and suite.training["batch_size"] == 10
        assert baselines | {"finetune", "rwf", "mars", "qoa", "apn", "lora"} <= set(suite.methods)
        for method in suite.methods:  # every method's settings resolve to valid configs
            resolve_run(suite, method, 0)
        rwf = resolve_run(suite, "rwf", 0).adapter_config
        assert rwf.routed_layers == [0, 1, 2] and rwf.num_prompts == 8
        for mars in ("mars", "mars-head-only"):
            config = resolve_run(suite, mars, 0).adapter_config
            assert (config.num_slots, config.tau_r) == (32, 0.07)
        apn = resolve_run(suite, "apn", 0).adapter_config
        assert (apn.num_patches, apn.top_k, apn.rank, apn.tau) == (256, 4, 32, 0.07)
        qoa = resolve_run(suite, "qoa", 0).adapter_config
        # QOA's paper support of 1000 items, spread over the suite's classes
        assert qoa.support_per_class * qoa.max_classes == pytest.approx(1000, rel=0.05)


def test_standin_suites_are_their_paper_suite_on_standins():
    for name in PAPER_SUITES:
        paper, standin = SuiteConfig.load(name), SuiteConfig.load(f"{name}-standin")
        assert standin.bases == [name] and standin.dataset.startswith("standin:")
        assert standin.backbone.startswith("standin:") and standin.training == paper.training
        assert standin.method_settings["rwf"] == paper.method_settings["rwf"]
        assert (standin.input_column, standin.image_size, standin.train_split) == (
            paper.input_column, paper.image_size, paper.train_split)
        quick = standin.quick_version()
        assert (quick.n_tasks, quick.max_classes) == (2, 4)


def test_suite_split_and_image_size_fields_are_checked(tmp_path):
    base = {"name": "x", "dataset": "mnist", "backbone": "b"}
    with pytest.raises(ValueError, match="test_fraction must be in"):
        SuiteConfig(**base, test_fraction=1.5)
    with pytest.raises(ValueError, match="test_split equals train_split"):
        SuiteConfig(**base, train_split="test", test_split="test")
    with pytest.raises(ValueError, match="image_size must be a positive integer"):
        SuiteConfig(**base, image_size=0)
    wrong = SuiteConfig(**{**base, "backbone": "standin:vit-b16-small"}, image_size=384)
    with pytest.raises(ValueError, match="image_size 384 but backbone 'standin:vit-b16-small' takes 224x224"):
        load_suite_backbone(wrong)


def test_standins_have_the_real_shapes(tmp_path):
    from datasets import load_dataset
    from transformers import AutoTokenizer, ViTModel

    for name in STANDIN_DATASETS:
        STANDIN_DATASETS[name].build(tmp_path / name)
    cifar = load_dataset("parquet", data_dir=str(tmp_path / "cifar100-shape"))
    assert set(cifar) == {"train", "test"} and cifar["train"].column_names == ["img", "fine_label"]
    image = cifar["train"][0]["img"]
    assert image.mode == "RGB" and image.size == (32, 32) and image.format == "PNG"
    assert len(set(cifar["train"]["fine_label"])) == 10
    imr = load_dataset("parquet", data_dir=str(tmp_path / "imagenet-r-shape"))
    assert set(imr) == {"test"} and imr["test"][0]["image"].size == (64, 64)
    bank = load_dataset("parquet", data_dir=str(tmp_path / "banking77-shape"))
    assert bank["train"].column_names == ["text", "label"] and isinstance(bank["train"][0]["text"], str)

    vit = ViTModel(vit_b16_config(small=True))
    out = vit(pixel_values=torch.zeros(1, 3, 224, 224))
    assert out.last_hidden_state.shape[1] == 197  # 14 x 14 patches + [CLS], as ViT-B/16
    real = vit_b16_config(small=False)
    assert (real.hidden_size, real.num_hidden_layers, real.num_attention_heads) == (768, 12, 12)
    STANDIN_BACKBONES["bert-base-small"].build(tmp_path / "bert")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "bert")
    assert len(tokenizer) == bert_base_config().vocab_size == 30522
    assert tokenizer("Hello world")["input_ids"] == [101, 7592, 2088, 102]  # bert-base-uncased's ids


@pytest.mark.slow
@pytest.mark.parametrize("suite", [f"{name}-standin" for name in PAPER_SUITES])
def test_every_method_of_a_paper_suite_runs_on_its_standin(tmp_path, suite):
    """`hf-clroute bench` over all the suite's methods (their paper settings) on the stand-in shapes."""
    from hf_clroute.cli import main

    out = tmp_path / suite
    assert main(["bench", "--suite", suite, "--quick", "--seeds", "0", "--out", str(out), "--no-progress"]) == 0
    methods = json.loads((out / "results.json").read_text())["methods"]
    assert set(methods) == set(SuiteConfig.load(suite).methods)
    assert all(len(row["per_seed"][0]["accuracy_matrix"]) == 2 for row in methods.values())


# A launched process runs several training runs in turn (one `accelerate launch` start-up,
# the slow part on a CPU, instead of one per run), each exactly as training/train_continual.py does.
GROUP_SCRIPT = """
import argparse, json, sys
import torch
sys.path.insert(0, sys.argv[1])
from accelerate.state import AcceleratorState
from train_continual import load_run_config, training_function

# Whether any backbone layer ran under bf16 autocast: proof that the precision flag reached the model.
autocast = set()
torch.nn.modules.module.register_module_forward_hook(
    lambda module, args, output: autocast.add(torch.is_autocast_enabled("cpu")))
for path in sys.argv[3:]:
    training_function(load_run_config(path), argparse.Namespace(resume=False, stop_after_steps=0))
state = AcceleratorState()
open(sys.argv[2], "w").write(json.dumps({"mixed_precision": str(state.mixed_precision),
                                         "num_processes": state.num_processes, "autocast": sorted(autocast)}))
"""


def _launch(tmp_path: Path, precision: str) -> tuple[Path, dict]:
    runs = tmp_path / precision
    runs.mkdir()
    configs = []
    for suite, method in RUNS:
        path = runs / f"{suite}-{method}.json"
        path.write_text(json.dumps({"suite": suite, "method": method, "seed": 0, "quick": True,
                                    "training": {"progress": False}, "output_dir": str(runs / suite / method)}))
        configs.append(str(path))
    script = tmp_path / "run_group.py"
    script.write_text(GROUP_SCRIPT)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
              "--mixed_precision", precision, "--dynamo_backend", "no", "--main_process_port", port]
    state = runs / "state.json"
    subprocess.run([*launch, str(script), str(REPO / "training"), str(state), *configs], check=True, env=env, cwd=REPO)
    return runs, json.loads(state.read_text())


def _reloaded_accuracy(suite: SuiteConfig, adapter: Path, bf16: bool) -> list[float]:
    """The final row of R, recomputed from the saved adapter on a freshly loaded backbone."""
    from hf_clroute.core.model import CLModel

    backbone, collator = load_suite_backbone(suite)
    model = CLModel.from_pretrained(backbone, adapter).eval()
    row = []
    for experience in build_stream(suite, 0):
        test = experience.test
        batch = collator([test[i] for i in range(len(test))])
        labels = batch.pop("labels")
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(**batch).logits
        row.append((logits.argmax(-1) == labels).float().mean().item())
    return row


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_standin_suites_train_two_tasks_under_accelerate_and_the_adapters_reload(tmp_path, precision):
    runs, state = _launch(tmp_path, precision)
    assert state["mixed_precision"] == precision and state["num_processes"] == 1
    assert (True in state["autocast"]) == (precision == "bf16")
    for suite_name, method in RUNS:
        out = runs / suite_name / method
        result = json.loads((out / "result.json").read_text())
        assert result["finished"] and len(result["accuracy_matrix"]) == 2, (suite_name, method)
        assert (out / "adapter" / "hf_clroute_config.json").is_file()
        assert (out / "adapter" / "hf_clroute_model.safetensors").is_file()
        final = result["accuracy_matrix"][-1]
        # Accelerate wraps the forward in bf16 autocast when it prepares the model for training; a
        # statistics head has nothing to train, is never prepared, and so runs in float32 throughout.
        autocast = precision == "bf16" and result["params"]["trainable_params"] > 0
        reloaded = _reloaded_accuracy(SuiteConfig.load(suite_name, quick=True), out / "adapter", autocast)
        # The reloaded adapter, in the run's precision, scores exactly what the run scored.
        assert reloaded == pytest.approx(final, abs=1e-6), (suite_name, method, final, reloaded)


def test_gpu_check_runs_on_cpu_with_the_small_config(tmp_path, monkeypatch):
    """The prepared GPU check, at a CPU size: every method trains and is timed, the table and JSON are written."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # the script sets it; restored after the test
    sys.path.insert(0, str(REPO / "training"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(REPO / "training"))
    report = gpu_check.main(["--small", "--cpu", "--steps", "5", "--batch-size", "2", "--eval-examples", "4",
                             "--eval-batch-size", "4", "--precision", "no", "--out", str(tmp_path)])
    assert report["backbone"]["image_size"] == 224 and report["backbone"]["patch_size"] == 16
    assert list(report["methods"]) == gpu_check.DEFAULT_METHODS.split(",")
    for method, row in report["methods"].items():
        assert "error" not in row, (method, row)
        assert row["train_samples_per_s"] > 0 and row["infer_samples_per_s"] > 0 and row["peak_memory_mb"] > 0
        assert row["steps"] == 5 and row["split_cifar100_hours"] > 0
    assert report["methods"]["rwf"]["settings"]["routed_layers"] == [0, 1, 2]
    assert json.loads((tmp_path / "gpu_check.json").read_text())["methods"].keys() == report["methods"].keys()
    assert "| rwf |" in (tmp_path / "gpu_check.md").read_text()
