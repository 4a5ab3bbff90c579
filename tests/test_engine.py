"""The continual loop on a tiny real stream: rows of R, anytime accuracy, resume, 2 processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import ViTImageProcessor, ViTModel

from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones.catalog import tiny_vit_config
from hf_clroute.baselines import FinetuneConfig, NCMConfig
from hf_clroute.data import ImageCollator, class_incremental, load_source
from hf_clroute.engine import make_accelerator

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stream():
    return class_incremental(
        load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3], train_per_class=20, test_per_class=10,
        name="mnist"
    )


def tiny_backbone() -> ViTModel:
    torch.manual_seed(0)
    return ViTModel(tiny_vit_config())


def collator() -> ImageCollator:
    cfg = tiny_vit_config()
    return ImageCollator(cfg.image_size, num_channels=cfg.num_channels)


def fit(method_config, stream, **training):
    config = TrainingConfig(**{"batch_size": 8, "learning_rate": 1e-3, "progress": False, **training})
    model = get_cl_model(tiny_backbone(), method_config)
    trainer = ContinualTrainer(model, stream, config, collator(), make_accelerator(config, cpu=True))
    return trainer, trainer.fit()


def test_accuracy_matrix_and_anytime(stream):
    _, result = fit(FinetuneConfig(), stream, eval_every=2)
    R = result.accuracy_matrix
    assert len(R) == 2 and all(len(row) == 2 for row in R)
    assert all(0.0 <= x <= 1.0 for row in R for x in row)
    # After task 0 the head knows only task 0's classes: task 1 cannot be right.
    assert R[0][1] == 0.0
    # 40 training examples per task, batch 8: 5 steps per task, one pass (online).
    assert result.global_step == 10
    assert [step for step, _ in result.anytime] == [2, 4, 6, 8, 10]
    assert len(result.untrained_accuracy) == 2 and result.finished
    assert result.train_samples_per_s > 0 and result.infer_samples_per_s > 0


def test_offline_epochs_repeat_the_task(stream):
    _, result = fit(FinetuneConfig(), stream, epochs=3)
    assert result.global_step == 30


def test_ncm_learns_without_training_parameters(stream):
    trainer, result = fit(NCMConfig(), stream)
    assert result.params["trainable_params"] == 0
    # Class means of frozen random features still beat chance on 4 MNIST digits.
    assert result.accuracy_matrix[-1][0] > 0.25 or result.accuracy_matrix[-1][1] > 0.25
    assert trainer.model.head.counts.tolist() == [20.0] * 4


def test_resume_equals_uninterrupted(stream, tmp_path):
    _, full = fit(FinetuneConfig(), stream, eval_every=3)
    ckpt = tmp_path / "ckpt"
    # Stop mid-task 1 (step 7 of 10) with checkpoints every 3 steps, as a killed job would.
    _, partial = fit(FinetuneConfig(), stream, eval_every=3, checkpoint_dir=str(ckpt), checkpoint_every=3,
                     stop_after_steps=7)
    assert not partial.finished and (ckpt / "latest").read_text().strip() == "ckpt-00000006"
    config = TrainingConfig(batch_size=8, learning_rate=1e-3, progress=False, eval_every=3, checkpoint_dir=str(ckpt),
                            checkpoint_every=3)
    model = get_cl_model(tiny_backbone(), FinetuneConfig())
    trainer = ContinualTrainer(model, stream, config, collator(), make_accelerator(config, cpu=True))
    resumed = trainer.fit(resume_from=ckpt)
    assert resumed.finished
    assert resumed.accuracy_matrix == full.accuracy_matrix
    assert resumed.anytime == full.anytime


def test_resume_refuses_a_checkpoint_from_another_run(stream, tmp_path):
    """A checkpoint stores the run's seed, method, adapter config and suite; resuming with any of them
    changed is refused with an error naming the field and both values, before any step is taken."""
    ckpt = tmp_path / "ckpt"

    def trainer(method_config, seed=0, suite="split-mnist", **training):
        config = TrainingConfig(batch_size=8, learning_rate=1e-3, progress=False, seed=seed, checkpoint_every=3,
                                **training)
        model = get_cl_model(tiny_backbone(), method_config)
        return ContinualTrainer(model, stream, config, collator(), make_accelerator(config, cpu=True),
                                run_info={"suite": suite})

    trainer(FinetuneConfig(), checkpoint_dir=str(ckpt), stop_after_steps=4).fit()
    other = str(tmp_path / "other")
    with pytest.raises(ValueError, match=r"seed is 0 there but 1 in this run"):
        trainer(FinetuneConfig(), seed=1, checkpoint_dir=other).fit(resume_from=ckpt)
    with pytest.raises(ValueError, match=r"method is 'finetune' there but 'ncm' in this run"):
        trainer(NCMConfig(), checkpoint_dir=other).fit(resume_from=ckpt)
    with pytest.raises(ValueError, match=r"adapter config field 'freeze_backbone' is False there but True in this run"):
        trainer(FinetuneConfig(freeze_backbone=True), checkpoint_dir=other).fit(resume_from=ckpt)
    with pytest.raises(ValueError, match=r"suite is 'split-mnist' there but 'split-fashion' in this run"):
        trainer(FinetuneConfig(), suite="split-fashion", checkpoint_dir=other).fit(resume_from=ckpt)
    assert not Path(other).exists()  # refused before training wrote anything
    assert trainer(FinetuneConfig(), checkpoint_dir=other).fit(resume_from=ckpt).finished  # the same run resumes


def test_scenario_task_masks_to_task_classes(stream):
    _, task_il = fit(FinetuneConfig(scenario="task"), stream)
    _, class_il = fit(FinetuneConfig(), stream)
    # With the task id given, each binary task is scored among its own 2 classes only: an old
    # task is at worst a coin flip, while class-IL fine-tuning predicts the newest classes for it.
    old_task_il, old_class_il = task_il.accuracy_matrix[-1][:-1], class_il.accuracy_matrix[-1][:-1]
    assert sum(old_task_il) / len(old_task_il) > sum(old_class_il) / len(old_class_il) + 0.2


def _write_run_config(tmp_path: Path, backbone_dir: Path, method: str, out: Path, num_workers: int = 0) -> Path:
    suite = {
        "name": "tiny-split-mnist",
        "dataset": "mnist",
        "backbone": str(backbone_dir),
        "n_tasks": 2,
        "train_per_class": 20,
        "test_per_class": 10,
        "max_classes": 4,
        "training": {"batch_size": 8, "learning_rate": 0.001, "eval_every": 2, "progress": False,
                     "num_workers": num_workers},
        # A 2048-wide RanPAC Gram matrix is re-solved at every evaluation: keep the test fast.
        "method_settings": {"ranpac": {"config": {"head_options": {"projection_dim": 256}}}},
    }
    path = tmp_path / f"{method}-{out.name}.json"
    path.write_text(json.dumps({"suite": suite, "method": method, "seed": 0, "output_dir": str(out)}))
    return path


# qoa: the replay buffer is gathered across processes; slda, ranpac: head statistics summed over processes
# finetune with a DataLoader worker: the batches, hence the numbers, do not depend on workers;
# osf: PEFT's orthogonal subspace layers, re-split at the task boundary on every process alike
TWO_PROCESS_RUNS = [("finetune", 0), ("ncm", 0), ("qoa", 0), ("slda", 0), ("ranpac", 0), ("finetune", 1), ("osf", 0)]


@pytest.fixture(scope="module")
def one_and_two_processes(tmp_path_factory, train_group) -> Path:
    """Every run of TWO_PROCESS_RUNS by training/train_continual.py on one process and under
    `accelerate launch` on two (one launch for all of them: its start-up is the slow part)."""
    root = tmp_path_factory.mktemp("one-vs-two")
    backbone_dir = root / "tiny-vit"
    tiny_backbone().save_pretrained(backbone_dir)
    processor = ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    processor.save_pretrained(backbone_dir)
    for processes in (1, 2):
        train_group([_write_run_config(root, backbone_dir, method, root / f"{processes}-{method}-{workers}", workers)
                     for method, workers in TWO_PROCESS_RUNS], processes)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("method, num_workers", TWO_PROCESS_RUNS)
def test_two_process_accelerate_run_matches_one_process(one_and_two_processes, method, num_workers):
    r1, r2 = (json.loads((one_and_two_processes / f"{n}-{method}-{num_workers}" / "result.json").read_text())
              for n in (1, 2))
    assert r1["num_processes"] == 1 and r2["num_processes"] == 2
    flat1, flat2 = (sum(r["accuracy_matrix"], []) for r in (r1, r2))
    # Same global batches, gradients averaged by DDP: equal up to float noise (one test
    # example of 40 may flip when two logits are within rounding of each other).
    assert flat1 == pytest.approx(flat2, abs=0.051)
