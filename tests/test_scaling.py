"""Past one machine: streamed tasks that never materialise, two nodes equal to one process, FSDP2.

The two-node runs are two ``accelerate launch --num_machines 2 --machine_rank {0,1}`` on this
machine (CPU, gloo: SPEC 8), each starting one process. They run this file as a script
(``--worker``): every method of :data:`METHODS` trains on one small streamed parquet source, so
each launch pays its start-up once.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_clroute.testing.parquet_stream import write_parquet_stream

REPO = Path(__file__).resolve().parents[1]
#: finetune, ER (a replay buffer), a statistics head (NCM) and RwF, as the issue names them
METHODS = ("finetune", "er", "ncm", "rwf")
ENV = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1",
       "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}


def method_config(method: str):
    from hf_clroute.baselines import ERConfig, FinetuneConfig, NCMConfig
    from hf_clroute.methods.rwf import RwfConfig

    return {"finetune": FinetuneConfig, "er": lambda: ERConfig(buffer_size=16), "ncm": NCMConfig,
            "rwf": lambda: RwfConfig(num_prompts=2)}[method]()


def train(method: str, source, streaming: bool = True, cpu: bool = False, resume_from=None, **training):
    """One method over the 2-task stream of ``source`` (a parquet directory) with a tiny ViT."""
    from transformers import ViTModel

    from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
    from hf_clroute.backbones.catalog import tiny_vit_config
    from hf_clroute.data import ImageCollator, class_incremental_streaming, parquet_stream
    from hf_clroute.engine import make_accelerator

    stream = class_incremental_streaming(parquet_stream(source, streaming=streaming), n_tasks=2, seed=0, name="toy")
    config = TrainingConfig(**{"batch_size": 8, "learning_rate": 1e-3, "progress": False, "num_workers": 0, **training})
    torch.manual_seed(0)
    model = get_cl_model(ViTModel(tiny_vit_config()), method_config(method))
    trainer = ContinualTrainer(
        model, stream, config, ImageCollator(16, num_channels=3), make_accelerator(config, cpu=cpu)
    )
    return trainer, trainer.fit(resume_from=resume_from)


def state_summary(trainer) -> dict:
    """What must be the same on 1 and N processes besides the accuracies: a replay buffer's
    labels, a statistics head's counts and a checksum of its sums."""
    method, head = trainer.model.method, trainer.model.head
    out = {}
    if hasattr(method, "buffer"):  # the slots in order: the same reservoir, not only the same classes
        out["buffer_labels"] = method.buffer.storage("labels")[:len(method.buffer)].tolist()
        out["buffer_pixels"] = round(float(method.buffer.storage("pixel_values").double().sum()), 3)
    if hasattr(head, "counts"):
        out["counts"] = head.counts.tolist()
    return out


def worker(source: str, out: str, ckpt_root: str) -> None:
    """Every method on ``source`` (one process or this process's node of several); the finetune run is
    also stopped after 4 steps (a checkpoint under ``ckpt_root/<processes>``) and, on two processes,
    the one-process checkpoint is resumed."""
    report, processes = {}, None
    for method in METHODS:
        trainer, result = train(method, source)
        processes = trainer.accelerator.num_processes
        report[method] = {"matrix": result.accuracy_matrix, **state_summary(trainer)}
    ckpt = Path(ckpt_root)
    train("finetune", source, checkpoint_dir=str(ckpt / str(processes)), stop_after_steps=4)
    if processes > 1:
        _, resumed = train("finetune", source, checkpoint_dir=str(ckpt / "resumed-on-2"), resume_from=ckpt / "1")
        report["resumed_from_1"] = resumed.accuracy_matrix
    if trainer.accelerator.is_main_process:
        Path(out).write_text(json.dumps({"processes": processes, **report}))
    trainer.accelerator.wait_for_everyone()


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("toy-stream")
    write_parquet_stream(directory, per_class=12, shards=3)
    return directory


def test_streamed_tasks_train_like_the_same_data_in_memory(toy):
    from hf_clroute.data import class_incremental_streaming, parquet_stream

    stream = class_incremental_streaming(parquet_stream(toy), n_tasks=2, seed=0, name="toy")
    assert "train=stream" in repr(stream[0])
    first = next(iter(stream[0].train))
    assert first["label"] in stream[0].classes and "original_label" in first
    _, streamed = train("finetune", toy)
    _, in_memory = train("finetune", toy, streaming=False)
    assert streamed.accuracy_matrix == in_memory.accuracy_matrix
    assert streamed.global_step == in_memory.global_step == 6  # 24 rows a task, batch 8
    assert streamed.accuracy_matrix[1][1] > 0.5  # brightness tells the classes apart: it learnt


def test_a_stream_without_class_names_is_refused_before_reading(tmp_path):
    from datasets import Dataset

    from hf_clroute.data import class_incremental_streaming

    for split in ("train", "test"):
        Dataset.from_dict({"x": [1.0, 2.0], "label": [0, 1]}).to_parquet(str(tmp_path / f"{split}-00000.parquet"))
    with pytest.raises(ValueError, match=r"column 'label': a stream's classes come from a ClassLabel.*class_names"):
        class_incremental_streaming(tmp_path, n_tasks=1)
    stream = class_incremental_streaming(tmp_path, n_tasks=2, class_names=["a", "b"], class_order=[0, 1])
    assert [e.info["class_names"] for e in stream] == [["a"], ["b"]]
    with pytest.raises(ValueError, match=r"n_tasks=3 does not divide the 2 classes"):
        class_incremental_streaming(tmp_path, n_tasks=3, class_names=["a", "b"])


def test_process_share_deals_each_global_batch_in_consecutive_parts():
    from datasets import Dataset

    from hf_clroute.engine.batches import process_share

    data = Dataset.from_dict({"i": list(range(10))}).to_iterable_dataset(num_shards=2)
    parts = [[row["i"] for row in process_share(data, 4, rank, 2)] for rank in (0, 1)]
    # batches [0..3], [4..7], [8, 9]: the short last one splits evenly, each row used once (as one process would)
    assert parts == [[[0, 1], [4, 5], [8]], [[2, 3], [6, 7], [9]]]
    # a short last batch the processes cannot divide ([8, 9, 10] over 2) is completed by its own rows
    data = Dataset.from_dict({"i": list(range(11))}).to_iterable_dataset(num_shards=1)
    parts = [[row["i"] for row in process_share(data, 4, rank, 2)] for rank in (0, 1)]
    assert parts == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [10, 8]]]
    with pytest.raises(ValueError, match="batch_size=5 is the global batch and must divide evenly among the 2"):
        process_share(data, 5, 0, 2)


def test_peak_memory_stays_flat_as_the_stream_grows(tmp_path):
    """A stream 3x longer (more parquet shards) trains to the end with the peak memory of the short one,
    give or take the allocator's noise (about 25 MB here): the stream is never held. (An in-memory dataset
    would add at least the added stream's bytes; ``training/stream_memory.py`` prints the table for larger
    streams.) 64-pixel rows make the added stream (about 94 MB) large against that noise."""
    script = REPO / "training" / "stream_memory.py"
    command = [sys.executable, str(script), "--rows", "4000", "12000", "--side", "64", "--dir", str(tmp_path), "--json"]
    out = subprocess.run(command, check=True, env=ENV, cwd=REPO, capture_output=True, text=True).stdout
    small, large = json.loads(out.strip().splitlines()[-1])
    assert large["stream_mb"] > 2.5 * small["stream_mb"] > 40
    assert large["finished"] and large["steps"] == 3 * small["steps"]
    grown = large["peak_rss_mb"] - small["peak_rss_mb"]
    assert grown < 0.5 * (large["stream_mb"] - small["stream_mb"]), (small, large)


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def test_two_nodes_match_one_process_and_checkpoints_cross_over(toy, tmp_path):
    """finetune, ER, NCM and RwF: the accuracy matrix, the replay buffer and the class statistics of
    two nodes (one process each) are those of one process; a one-process checkpoint resumes on two
    nodes and a two-node checkpoint on one process, both ending where the uninterrupted run ends."""
    ckpt = tmp_path / "ckpt"
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    subprocess.run([sys.executable, __file__, "--worker", str(toy), str(one), str(ckpt)], check=True, env=ENV, cwd=REPO)
    port = _free_port()
    launches = [subprocess.Popen(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "2",
         "--machine_rank", str(rank), "--num_processes", "2", "--main_process_ip", "127.0.0.1",
         "--main_process_port", port, "--mixed_precision", "no", "--dynamo_backend", "no",
         __file__, "--worker", str(toy), str(two), str(ckpt)], env=ENV, cwd=REPO) for rank in (0, 1)]
    assert [p.wait(timeout=300) for p in launches] == [0, 0]
    r1, r2 = (json.loads(p.read_text()) for p in (one, two))
    assert (r1["processes"], r2["processes"]) == (1, 2)
    for method in METHODS:
        assert r2[method] == r1[method], method
    assert r2["resumed_from_1"] == r1["finetune"]["matrix"]
    _, resumed = train("finetune", toy, cpu=True, checkpoint_dir=str(tmp_path / "resumed-on-1"), resume_from=ckpt / "2")
    assert resumed.accuracy_matrix == r1["finetune"]["matrix"]


def test_fsdp2_config_is_refused_on_cpu_with_the_reason(tmp_path):
    """configs/accelerate/fsdp2.yaml (fsdp_version 2) on this CPU machine. torch 2.13's ``fully_shard``
    itself runs on CPU (gloo), but Accelerate enables FSDP only on accelerators and otherwise falls back
    to DDP silently; the launch script refuses that fallback before any data is read, naming the reason.
    On a GPU machine the same command shards the model (not run here: no GPU in this environment)."""
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"suite": "split-mnist", "method": "finetune", "output_dir": str(tmp_path / "out")}))
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
              str(REPO / "configs" / "accelerate" / "fsdp2.yaml"), "--main_process_port", _free_port(),
              str(REPO / "training" / "train_continual.py"), "--config", str(run)]
    done = subprocess.run(launch, env=ENV, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "FSDP (fsdp_version 2) was asked for, but Accelerate started a MULTI_CPU run on cpu" in done.stderr
    assert not (tmp_path / "out").exists()


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker(*sys.argv[2:5])


def test_batch_parts_deal_each_row_once_when_the_processes_divide_the_batch():
    from hf_clroute.data.streaming import batch_parts

    assert batch_parts(8, 8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # a whole batch: consecutive halves
    # A short last batch the processes divide: equal parts, each row once (the mean of the parts' means is
    # the batch mean, as one process computes it; statistics and buffers count each row once).
    assert batch_parts(2, 8, 2) == [[0], [1]] and batch_parts(6, 8, 2) == [[0, 1, 2], [3, 4, 5]]
    # One they do not: completed by its own rows so every process steps; rows 0 and 1 count twice there.
    assert batch_parts(3, 4, 2) == [[0, 1], [2, 0]]
    with pytest.raises(ValueError, match="batch_size=5 is the global batch and must divide evenly"):
        batch_parts(5, 5, 2)
    with pytest.raises(ValueError, match="1 to batch_size=8 rows, got 9"):
        batch_parts(9, 8, 2)
