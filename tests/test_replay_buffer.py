"""ReservoirBuffer: capacity, uniformity, determinism, save/load through a CLModel-like module."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_clroute.core.replay_buffer import ReservoirBuffer


def fill(buffer: ReservoirBuffer, n: int, batch: int = 7) -> None:
    for start in range(0, n, batch):
        ids = torch.arange(start, min(start + batch, n))
        buffer.add({"x": ids.float().unsqueeze(1).repeat(1, 3), "y": ids})


def test_keeps_everything_until_full_then_capacity():
    buffer = ReservoirBuffer(50)
    fill(buffer, 30)
    assert len(buffer) == 30 and buffer.contents()["y"].tolist() == list(range(30))
    fill(buffer, 500)
    assert len(buffer) == 50 and buffer.num_seen == 530


def test_reservoir_is_roughly_uniform_over_the_stream():
    # Over many seeds, each of 1000 items is kept with probability 100/1000.
    kept = torch.zeros(1000)
    for seed in range(40):
        buffer = ReservoirBuffer(100, seed=seed)
        fill(buffer, 1000, batch=50)
        kept[buffer.contents()["y"]] += 1
    first, last = kept[:500].mean().item(), kept[500:].mean().item()
    assert abs(first - 4.0) < 0.6 and abs(last - 4.0) < 0.6


def test_same_seed_same_contents_and_save_load_identity(tmp_path):
    a, b = ReservoirBuffer(20, seed=3), ReservoirBuffer(20, seed=3)
    fill(a, 300)
    fill(b, 300)
    assert torch.equal(a.contents()["y"], b.contents()["y"])
    save_file(dict(a.state_dict()), str(tmp_path / "buf.safetensors"))
    restored = ReservoirBuffer(20, seed=3)
    restored.load_extra_state(a.extra_state())
    restored.load_state_dict(load_file(str(tmp_path / "buf.safetensors")))
    assert torch.equal(restored.contents()["x"], a.contents()["x"])
    fill(a, 100)
    fill(restored, 100)  # continuing after a load makes the same decisions
    assert torch.equal(restored.contents()["y"], a.contents()["y"])


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="capacity"):
        ReservoirBuffer(0)
    buffer = ReservoirBuffer(5)
    with pytest.raises(ValueError, match="empty"):
        buffer.sample(2)
    with pytest.raises(ValueError, match="different batch sizes"):
        buffer.add({"x": torch.zeros(2, 1), "y": torch.zeros(3)})
