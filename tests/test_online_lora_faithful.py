"""Online-LoRA as its authors run it: plateau on the summed batch + hard-buffer loss, the hard buffer
replayed, importance on the LoRA matrices from predicted labels as a running mean, consolidations recorded."""

from __future__ import annotations

import torch
from transformers import ViTModel

from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones.catalog import tiny_vit_config
from hf_clroute.baselines import OnlineLoraConfig
from hf_clroute.core.method import StepContext
from hf_clroute.data import ImageCollator, class_incremental, load_source
from hf_clroute.engine import make_accelerator


def vit(layers: int = 2) -> ViTModel:
    torch.manual_seed(0)
    return ViTModel(tiny_vit_config(num_hidden_layers=layers)).eval()


def images(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def plateau_steps(config: OnlineLoraConfig, losses: list[float]) -> list[int]:
    method = get_cl_model(vit(1), config).method
    return [i for i, loss in enumerate(losses) if method.at_plateau(loss)]


def test_the_authors_thresholds_are_the_defaults():
    config = OnlineLoraConfig()
    assert (config.window, config.plateau_mean, config.plateau_variance) == (5, 6.0, 0.1)
    assert (config.hard_buffer_size, config.penalty_weight) == (4, 2000.0)


def test_plateau_fires_when_the_summed_loss_flattens_and_not_while_it_falls():
    config = OnlineLoraConfig()
    falling = [12.0 - 0.8 * i for i in range(10)]  # 12 -> 4.8: below the mean bound late, but still falling
    assert plateau_steps(config, falling) == []
    flattening = [12.0, 10.0, 8.0, 6.5, 5.6, 5.5, 5.45, 5.4, 5.4, 5.4, 5.4]
    fired = plateau_steps(config, flattening)
    assert fired and fired[0] >= 5  # the first window flat enough (variance < 0.1) and under 6.0
    # no second plateau without a peak; a peak (a new task's loss jump) re-arms it
    assert len(fired) == 1
    again = plateau_steps(config, flattening + [9.0, 9.0, 7.0, 5.0, 5.0, 5.0, 5.0, 5.0])
    assert len(again) == 2


def test_the_hard_buffer_is_replayed_in_the_training_loss():
    model = get_cl_model(vit(), OnlineLoraConfig(hard_buffer_size=2, plateau_mean=1e-6))
    model.grow_head(2)
    method = model.method
    model.train()
    first = {"pixel_values": images(4, 1), "labels": torch.tensor([0, 1, 0, 1])}
    out = model(**first)
    assert "hard" not in out.losses  # nothing buffered yet
    model.after_step(first, out, StepContext(0))
    assert len(method.hard) == 2
    buffered = torch.cat([sample["pixel_values"] for _, sample in method.hard]).requires_grad_(True)
    for i, (_, sample) in enumerate(method.hard):
        sample["pixel_values"] = buffered[i:i + 1]  # the buffer's own samples, watched by autograd
    second = {"pixel_values": images(4, 2), "labels": torch.tensor([1, 0, 1, 0])}
    out = model(**second)
    assert out.losses["hard"] > 0
    torch.testing.assert_close(out.loss, sum(out.losses.values()))
    out.loss.backward()
    assert buffered.grad is not None and buffered.grad.abs().sum() > 0  # the gradient reaches the buffer samples
    # the buffer's fresh losses (from this forward) are what the update ranks it by
    fresh = [loss for loss, _ in method._replayed]
    torch.testing.assert_close(torch.tensor(fresh).sum(), out.losses["hard"].detach())


def importance_after(labels: torch.Tensor, seed: int = 3) -> list[torch.Tensor]:
    model = get_cl_model(vit(), OnlineLoraConfig(hard_buffer_size=3))
    model.grow_head(3)
    method = model.method
    with torch.no_grad():
        for layer in method.adapted:
            layer.lora_B.normal_(generator=torch.Generator().manual_seed(seed))
    x = images(3, 5)
    method.hard = [(1.0, {"pixel_values": x[i:i + 1], "labels": labels[i:i + 1]}) for i in range(3)]
    method.consolidate(model)
    return [torch.cat([layer.importance_A.flatten(), layer.importance_B.flatten()]) for layer in method.adapted]


def test_importance_is_on_the_lora_matrices_from_predicted_labels():
    a = importance_after(torch.tensor([0, 1, 2]))
    b = importance_after(torch.tensor([2, 2, 0]))  # other true labels: the same importance
    assert all(x.sum() > 0 for x in a)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)
    layer = get_cl_model(vit(1), OnlineLoraConfig()).method.adapted[0]
    assert layer.importance_A.shape == layer.lora_A.shape and layer.importance_B.shape == layer.lora_B.shape


def test_importance_is_a_running_mean_over_consolidations():
    """B = 0 and the same A at every plateau: merging changes nothing, so each plateau estimates the same
    importance of B, and their running mean is that one estimate (a sum would triple it)."""
    model = get_cl_model(vit(), OnlineLoraConfig(hard_buffer_size=2))
    model.grow_head(2)
    method = model.method
    fixed_A = [layer.lora_A.detach().clone() for layer in method.adapted]
    x = images(2, 20)
    per_plateau = []
    for _ in range(3):
        with torch.no_grad():
            for layer, a in zip(method.adapted, fixed_A):
                layer.lora_A.copy_(a)
                layer.lora_B.zero_()
        method.hard = [(1.0, {"pixel_values": x[i:i + 1], "labels": torch.tensor([i])}) for i in range(2)]
        method.consolidate(model)
        per_plateau.append(torch.cat([layer.importance_B.flatten() for layer in method.adapted]))
    assert method.consolidations == 3 and per_plateau[0].sum() > 0
    torch.testing.assert_close(per_plateau[2], per_plateau[0])


def test_a_short_run_consolidates_and_records_it():
    model = get_cl_model(vit(), OnlineLoraConfig())
    stream = class_incremental(load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3],
                               train_per_class=8, test_per_class=2, name="mnist")
    config = TrainingConfig(batch_size=4, learning_rate=0.01, progress=False)
    ContinualTrainer(model, stream, config, ImageCollator(16, num_channels=3),
                     make_accelerator(config, cpu=True)).fit()
    records = model.method.run_records()
    assert records["consolidations"] > 0
    assert model.method.extra_state()["consolidations"] == records["consolidations"]
