"""MaRS's memory-free controls: ``mars-memory-free`` (memory='none') and ``mars-prototypes``
(memory='none' with anchors='class_prototype').

The control must keep what MaRS's head gets (the same head, stage-2 loss and head steps) and drop
everything of the memory; the prototype row must bank one class mean per class at each task start
and distil on them. Synthetic feature streams from test_mars.py; every stream is seeded.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_mars import D, eval_logits, feature_stream, fit, small_config, tiny_vit

from hf_clroute import CLModel, get_cl_model
from hf_clroute.bench.harness.feature_cache import FeatureCollator
from hf_clroute.methods.mars import MarsConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one torch thread (conftest)


def memory_free(**overrides) -> MarsConfig:
    return small_config(**{"memory": "none", "use_sgse": False, "use_anchors": False, **overrides})


def prototypes(**overrides) -> MarsConfig:
    return small_config(**{"memory": "none", "use_sgse": False, "anchors": "class_prototype",
                           "full_output_consistency": "anchors", **overrides})


def head_moves(config: MarsConfig, stream) -> list[int]:
    """The global steps (0-based) whose optimizer step changed the head's existing rows."""
    model = get_cl_model(tiny_vit(), config)
    method, moved, seen = model.method, [], {"step": 0}
    on_task_start, after_step = method.on_task_start, method.after_step

    def head(model_) -> torch.Tensor:
        return torch.cat([model_.head.weight, model_.head.bias.unsqueeze(1)], dim=1).detach().clone()

    def spy_start(model_, experience, ctx):  # after the head grew: the rows a step can move
        seen["head"] = head(model_)
        return on_task_start(model_, experience, ctx)

    def spy_step(model_, batch, out, ctx):
        now = head(model_)
        if not torch.equal(seen["head"], now[: len(seen["head"])]):
            moved.append(seen["step"])
        seen.update(head=now, step=seen["step"] + 1)
        return after_step(model_, batch, out, ctx)

    method.on_task_start, method.after_step = spy_start, spy_step
    fit(config, stream, model=model)
    return moved


# ---- mars-memory-free -------------------------------------------------------------------------------


def test_memory_free_has_no_router_slot_or_anchor_state():
    model = get_cl_model(tiny_vit(), memory_free())
    method = model.method
    for part in ("memory", "sgse", "slot_stats", "anchor_bank", "class_stats", "prototypes"):
        assert getattr(method, part) is None, part
    assert not list(method.parameters())  # nothing of its own trains: only the head
    assert {name for name, _ in method.named_buffers()} == {"teacher_weight", "teacher_bias"}
    slot_keys = {"num_slots", "sgse", "sgse_timing", "banked_anchors", "slot_history", "keys_seeded"}
    assert not slot_keys & set(method.extra_state())


def test_memory_free_forward_is_the_head_on_layernorm_h_and_equals_an_untrained_memory():
    stream = feature_stream(2, train_per_class=10)
    model, _ = fit(memory_free(dcda_window=1), stream)
    features = FeatureCollator()([e for exp in stream for e in exp.test])["features"]
    logits = eval_logits(model, stream).logits
    torch.testing.assert_close(logits, model.head(F.layer_norm(features, (D,))).detach(), rtol=0, atol=0)
    # MaRS's memory before it trains outputs LN(h): with the same head, the same logits.
    mars = get_cl_model(tiny_vit(), small_config())
    mars.grow_head(4)
    mars.head.load_state_dict(model.head.state_dict())
    torch.testing.assert_close(eval_logits(mars, stream).logits, logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("window,ratio", [(1, 3), (2, 1)])
def test_head_trains_on_exactly_the_steps_mars_trains_it_on(window, ratio):
    """Two tasks of 8 steps: the head moves after the same optimizer steps with and without the
    memory (the stage-2 steps: 3 of 4 with stage2_ratio 3), where the old head-only control moves it
    after every step."""
    stream = feature_stream(2, train_per_class=40)
    options = {"dcda_window": window, "stage2_ratio": ratio}
    with_memory = head_moves(small_config(**options), stream)
    without = head_moves(memory_free(**options), stream)
    assert without == with_memory == [s for s in range(16) if (s % 8 // window) % (1 + ratio) != 0]
    assert len(without) == 16 * ratio // (1 + ratio)
    assert head_moves(small_config(use_stage1=False, use_sgse=False), stream) == list(range(16))


def test_memory_free_config_refuses_what_needs_a_memory():
    for field, value in (("use_sgse", True), ("keys_per_task", 2)):
        with pytest.raises(ValueError, match=f"MarsConfig.{field}"):
            memory_free(**{field: value})
    with pytest.raises(ValueError, match="MarsConfig.anchors"):
        memory_free(use_anchors=True)  # slot anchors need slots
    with pytest.raises(ValueError, match="MarsConfig.anchors='class_prototype' needs memory='none'"):
        small_config(anchors="class_prototype")
    with pytest.raises(ValueError, match="MarsConfig.memory"):
        small_config(memory="slot")


# ---- mars-prototypes -------------------------------------------------------------------------------


def test_prototypes_bank_one_class_mean_per_class_at_each_task_start():
    stream = feature_stream(3, train_per_class=10)
    model = get_cl_model(tiny_vit(), prototypes(dcda_window=1))
    method, banked = model.method, []
    on_task_start = method.on_task_start

    def spy(model_, experience, ctx):
        on_task_start(model_, experience, ctx)
        banked.append((method.prototypes.labels.tolist(), method.prototypes.anchors().clone()))

    method.on_task_start = spy
    fit(method.config, stream, model=model)
    assert [labels for labels, _ in banked] == [[], [0, 1], [0, 1, 2, 3]]
    for labels, means in banked:
        for label, mean in zip(labels, means):
            rows = torch.tensor([e["features"] for exp in stream for e in exp.train if e["label"] == label])
            torch.testing.assert_close(mean, F.layer_norm(rows, (D,)).mean(0), rtol=0, atol=1e-5)
    assert not any(p.requires_grad for p in method.parameters())  # no router, keys or adapters
    assert method.memory is None and method.slot_stats is None and method.anchor_bank is None


def test_prototype_distillation_is_nonzero_after_the_first_task_and_zero_without_prototypes():
    stream = feature_stream(2, train_per_class=10)
    model, _ = fit(prototypes(dcda_window=1), stream)  # the head has moved since task 1 began
    method = model.method
    model.train()
    normed = F.layer_norm(FeatureCollator()([stream[1].train[i] for i in range(6)])["features"], (D,))
    terms = method.stage2_losses(model, normed, model.head(normed))
    assert len(method.prototypes) == 2 and terms["anchor"].item() > 1e-6
    terms["anchor"].backward()
    assert model.head.weight.grad.abs().sum() > 0
    method.prototypes.resize(method.prototypes.num_classes, 0)  # no banked prototype
    assert "anchor" not in method.stage2_losses(model, normed, model.head(normed))
    # Task 0 has no old class and no prototype: no anchor term on any of its steps.
    first, _ = fit(prototypes(dcda_window=1), stream[:1])
    assert len(first.method.prototypes) == 0 and first.method.old_classes == 0


def test_prototypes_save_load_and_resume(tmp_path):
    stream = feature_stream(3, train_per_class=10)
    full_model, full = fit(prototypes(dcda_window=1), stream)
    ckpt = tmp_path / "ckpt"
    _, partial = fit(prototypes(dcda_window=1), stream, checkpoint_dir=str(ckpt), checkpoint_every=2,
                     stop_after_steps=5)
    assert not partial.finished
    resumed_model, resumed = fit(prototypes(dcda_window=1), stream, checkpoint_dir=str(ckpt), checkpoint_every=2,
                                 resume_from=ckpt)
    assert resumed.accuracy_matrix == full.accuracy_matrix
    assert resumed_model.method.extra_state() == full_model.method.extra_state()
    full_model.save_pretrained(tmp_path / "adapter")
    loaded = CLModel.from_pretrained(tiny_vit(), tmp_path / "adapter")
    assert loaded.method.extra_state() == full_model.method.extra_state()
    torch.testing.assert_close(loaded.method.prototypes.entries, full_model.method.prototypes.entries, rtol=0, atol=0)
    torch.testing.assert_close(eval_logits(loaded, stream).logits, eval_logits(full_model, stream).logits,
                               rtol=0, atol=0)


# ---- the settings files ------------------------------------------------------------------------------


def test_settings_files_drop_the_memory_and_keep_the_rest(checked_search_grid):
    from hf_clroute.bench.harness.settings import method_file, resolve_run
    from hf_clroute.bench.harness.suites import SuiteConfig

    suite = SuiteConfig.load("split-mnist")
    mars = resolve_run(suite, "mars", 0).adapter_config
    for row, differs in (("mars-memory-free", {"memory", "use_sgse", "use_anchors"}),
                         ("mars-prototypes", {"memory", "use_sgse", "anchors"})):
        config = resolve_run(suite, row, 0).adapter_config
        assert {f for f in vars(mars) if getattr(mars, f) != getattr(config, f)} == differs, row
        checked_search_grid(row)
    assert method_file("mars-prototypes")["control"] == "mars-memory-free"


@pytest.mark.parametrize("options", [
    {"use_anchors": True, "anchors": "class_gaussian"},
    {"use_anchors": True, "anchors": "class_gaussian", "class_stats_space": "backbone"},
    {"use_stage2": False},
    {"dcda_schedule": "sequential"},
])
def test_memory_free_runs_with_the_other_options(options):
    """Gaussian anchors (in LN(h) or h space), no stage 2 (plain CE on every step), the sequential schedule."""
    stream = feature_stream(2, train_per_class=10)
    model, result = fit(memory_free(**options), stream)
    assert result.finished and model.method.memory is None
    assert model.head.weight.abs().sum() > 0
