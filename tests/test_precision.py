"""Mixed precision (the setting, its resolution, autocast in the loop), the non-finite guard, threads."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import ViTModel

from hf_clroute import ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones import precision
from hf_clroute.backbones.catalog import tiny_vit_config
from hf_clroute.baselines import FinetuneConfig, SLDAConfig
from hf_clroute.data import ImageCollator, class_incremental, load_source
from hf_clroute.engine import evaluate_experience, make_accelerator
from hf_clroute.engine.evaluation import feature_batches
from hf_clroute.engine.evaluation import test_loader as make_test_loader
from hf_clroute.errors import NonFiniteTrainingError, UserInputError
from hf_clroute.runtime import threads

BF16 = torch.bfloat16
TINY = {"model_type": "vit", "hidden_size": 32}  # tiny_vit_config()


@pytest.fixture(scope="module")
def stream():
    return class_incremental(load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3], train_per_class=8,
                             test_per_class=4, name="mnist")


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(precision.ENV_VAR, raising=False)


def _model(config=None):
    torch.manual_seed(0)
    return get_cl_model(ViTModel(tiny_vit_config()), config or FinetuneConfig())


def _trainer(stream, model=None, **training):
    config = TrainingConfig(**{"batch_size": 8, "eval_batch_size": 8, "progress": False, **training})
    model = model or _model()
    return ContinualTrainer(
        model, stream, config, ImageCollator(16, num_channels=3), make_accelerator(config, cpu=True)
    )


def _fake_table(monkeypatch, hardware=True, **row):
    """The measured table with one row for the tiny ViT, and bf16 hardware present (or not)."""
    base = {**TINY, "phase": "train", "min_batch": 4, "speedup": {4: 1.5}, "checked": ("split-mnist",)}
    monkeypatch.setattr(precision, "MEASURED", ({**base, **row},))
    monkeypatch.setattr(precision, "bf16_hardware", lambda device_type="cpu": (hardware, "test hardware"))


# ---- the setting --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["fp16", "BF16 ", "", 1])
def test_a_bad_setting_names_the_field_and_the_value(bad):
    with pytest.raises(UserInputError, match=r"TrainingConfig\.precision.*" + repr(bad).replace("(", r"\(")):
        TrainingConfig(precision=bad)


def test_explicit_beats_the_environment_which_beats_the_default(monkeypatch):
    assert precision.setting_from(None) == ("auto", "default")
    monkeypatch.setenv(precision.ENV_VAR, "FP32")
    assert precision.setting_from(None) == ("fp32", precision.ENV_VAR)
    assert precision.setting_from("bf16") == ("bf16", "argument")
    monkeypatch.setenv(precision.ENV_VAR, "half")
    with pytest.raises(UserInputError, match=precision.ENV_VAR + ".*'half'"):
        precision.setting_from(None)


def test_non_finite_training_numbers_are_refused_up_front():
    for name in ("learning_rate", "weight_decay", "max_grad_norm"):
        with pytest.raises(UserInputError, match=f"TrainingConfig.{name}.*nan"):
            TrainingConfig(**{name: float("nan")})
    with pytest.raises(UserInputError, match="learning_rate.*inf"):
        TrainingConfig(learning_rate=float("inf"))


# ---- resolution ------------------------------------------------------------------------------------


def test_auto_picks_bf16_only_for_measured_faster_checked_workloads(monkeypatch):
    _fake_table(monkeypatch)
    resolve = lambda phase="train", batch=8, **kw: precision.resolve("auto", **{**TINY, **kw}, phase=phase,  # noqa: E731
                                                                     batch_size=batch)
    assert resolve().dtype is BF16 and "measured faster" in resolve().reason
    assert resolve(batch=2).dtype is None and "not measured faster" in resolve(batch=2).reason  # below min_batch
    assert resolve(phase="eval").dtype is None and "not measured" in resolve(phase="eval").reason
    assert resolve(hidden_size=64).dtype is None  # another size of the same family: not measured
    _fake_table(monkeypatch, checked=())
    assert resolve().dtype is None and "no paired A_T check" in resolve().reason
    _fake_table(monkeypatch, min_batch=None)
    assert resolve().dtype is None
    _fake_table(monkeypatch, hardware=False)
    assert resolve().dtype is None and "test hardware" in resolve().reason
    # explicit settings do what they say, whatever was measured
    assert precision.resolve("fp32", **TINY, phase="train", batch_size=8).dtype is None
    bf16 = precision.resolve("bf16", **TINY, phase="eval", batch_size=1)
    assert bf16.dtype is BF16 and "emulated" in bf16.reason
    # on a GPU nothing is measured: auto stays fp32, bf16 is autocast on that device
    _fake_table(monkeypatch)
    assert precision.resolve("auto", **TINY, phase="train", batch_size=8, device_type="cuda").dtype is None
    assert precision.resolve("bf16", **TINY, phase="train", batch_size=8, device_type="cuda").device_type == "cuda"
    with pytest.raises(UserInputError, match="phase"):
        resolve(phase="training")


def test_the_shipped_table_is_consistent():
    """Each row says bf16 only from a batch on which every measured larger batch was faster."""
    keys = {(r["model_type"], r["hidden_size"], r["phase"]) for r in precision.MEASURED}
    assert len(keys) == len(precision.MEASURED) and all(r["phase"] in precision.PHASES for r in precision.MEASURED)
    for row in precision.MEASURED:
        measured = {b: v for b, v in row["speedup"].items() if v is not None}
        if row["min_batch"] is not None:
            assert all(v > 1 for b, v in measured.items() if b >= row["min_batch"]), row
        else:  # no batch from which bf16 stays faster: slower at the largest measured one
            assert not measured or measured[max(measured)] <= 1, row


def test_the_bf16_detector_reads_the_cpu_flags():
    found, evidence = precision.bf16_hardware.__wrapped__("cpu")
    cpuinfo = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    if flags is not None:
        # The flags decide. oneDNN also says yes on AVX-512 CPUs without bf16 units (it emulates bf16 there,
        # which is not faster), so it is asked only where no flags can be read.
        assert found == ("avx512_bf16" in flags.split() or "amx_bf16" in flags.split()), evidence
    else:
        assert found == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert isinstance(evidence, str) and evidence


# ---- the loop under autocast -------------------------------------------------------------------------


def _record_autocast(model) -> list[tuple[bool, bool]]:
    """(autocast on, grad enabled) at every backbone forward."""
    seen = []
    model.backbone.register_forward_hook(
        lambda module, args, output: seen.append((torch.is_autocast_enabled("cpu"), torch.is_grad_enabled())))
    return seen


def test_bf16_runs_the_training_forward_and_evaluation_under_autocast_with_an_fp32_loss(stream, monkeypatch):
    model = _model()
    seen = _record_autocast(model)
    trainer = _trainer(stream, model, precision="bf16")
    losses = []
    backward = trainer.accelerator.backward
    def recording_backward(loss, **kw):
        losses.append(loss.dtype)
        return backward(loss, **kw)

    monkeypatch.setattr(trainer.accelerator, "backward", recording_backward)
    result = trainer.fit()
    assert result.finished and losses and set(losses) == {torch.float32}
    assert (True, True) in seen and (True, False) in seen  # training steps and evaluations
    assert all(on for on, _ in seen)
    records = result.records["precision"]
    assert records["train"]["dtype"] == "bf16" and "bf16 set" in records["eval"]["reason"]
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast, not a cast of the weights


def test_fp32_and_auto_on_an_unmeasured_backbone_never_autocast(stream):
    for setting in ("fp32", None):
        model = _model()
        seen = _record_autocast(model)
        result = _trainer(stream, model, precision=setting).fit()
        assert seen and not any(on for on, _ in seen)
        assert result.records["precision"]["train"]["dtype"] == "fp32"


def test_auto_follows_the_measured_table_per_phase(stream, monkeypatch):
    _fake_table(monkeypatch)  # the tiny ViT measured faster in training only
    model = _model()
    seen = _record_autocast(model)
    result = _trainer(stream, model).fit()
    assert {on for on, grad in seen if grad} == {True} and {on for on, grad in seen if not grad} == {False}
    assert [result.records["precision"][p]["dtype"] for p in ("train", "features", "eval")] == ["bf16", "fp32", "fp32"]


def test_the_environment_variable_reaches_the_trainer(stream, monkeypatch):
    monkeypatch.setenv(precision.ENV_VAR, "bf16")
    trainer = _trainer(stream)
    assert trainer.precision["train"].dtype is BF16 and precision.ENV_VAR in trainer.precision["train"].reason
    assert _trainer(stream, precision="fp32").precision["train"].dtype is None  # explicit wins


def test_statistics_stay_float64_and_kept_features_float32_under_bf16(stream):
    model = _model(SLDAConfig())
    result = _trainer(stream, model, precision="bf16").fit()
    assert result.finished
    floats = {name: b.dtype for name, b in model.head.named_buffers() if b.is_floating_point()}
    assert floats and set(floats.values()) == {torch.float64}, floats
    collator = ImageCollator(16, num_channels=3)
    loader = make_test_loader(stream[0], collator, 8, make_accelerator(TrainingConfig(), cpu=True))
    batches = feature_batches(model, loader, precision="bf16")
    assert batches and all(b["features"].dtype == torch.float32 for b in batches)
    fp32 = torch.cat([b["features"] for b in feature_batches(model, loader, precision="fp32")])
    bf16 = torch.cat([b["features"] for b in batches])
    assert not torch.equal(fp32, bf16) and torch.allclose(fp32, bf16, atol=0.1, rtol=0.05)  # bf16 did run


def test_evaluate_experience_resolves_a_setting_itself(stream):
    model = _model()
    seen = _record_autocast(model)
    accelerator = make_accelerator(TrainingConfig(), cpu=True)
    loader = make_test_loader(stream[0], ImageCollator(16, num_channels=3), 8, accelerator)
    evaluate_experience(model, loader, make_accelerator(TrainingConfig(), cpu=True), precision="bf16")
    assert seen and all(on for on, _ in seen)


# ---- the non-finite guard ----------------------------------------------------------------------------------


class NaNInputs:
    """A collator whose batches carry NaN pixels from the ``at``-th batch on."""

    def __init__(self, at: int = 0) -> None:
        self.inner, self.at, self.calls = ImageCollator(16, num_channels=3), at, 0

    def __call__(self, examples):
        batch = self.inner(examples)
        if self.calls >= self.at:
            batch["pixel_values"] = torch.full_like(batch["pixel_values"], float("nan"))
        self.calls += 1
        return batch


def _fit_expecting(trainer, match: str, tmp_path) -> None:
    with pytest.raises(NonFiniteTrainingError, match=match):
        trainer.fit()
    assert not any((tmp_path / "ckpt").glob("**/adapter_model.safetensors"))  # nothing saved


@pytest.mark.parametrize("max_grad_norm", [1.0, 0.0])
def test_nan_inputs_stop_training_before_the_step(stream, tmp_path, max_grad_norm):
    model = _model()
    trainer = _trainer(stream, model, max_grad_norm=max_grad_norm, checkpoint_dir=str(tmp_path / "ckpt"))
    # untrained evaluations read the test split first: only training batches carry NaN
    trainer.collator = NaNInputs()
    before = [p.detach().clone() for p in model.backbone.parameters()]
    _fit_expecting(trainer, r"task 0 step 1 .*the loss is nan", tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(before, model.backbone.parameters()))  # the NaN step never ran


def test_an_infinite_learning_rate_stops_training(stream, tmp_path):
    trainer = _trainer(stream, checkpoint_dir=str(tmp_path / "ckpt"))
    trainer.config.learning_rate = float("inf")  # past the config's own check
    _fit_expecting(trainer, r"learning rate of parameter group 0 is inf", tmp_path)


def test_nan_gradients_are_caught_by_the_clipping_norm(stream, tmp_path):
    model = _model()
    next(model.backbone.parameters()).register_hook(lambda grad: torch.full_like(grad, float("nan")))
    _fit_expecting(_trainer(stream, model, checkpoint_dir=str(tmp_path / "ckpt")), "gradient norm .* nan", tmp_path)


def test_nan_statistics_are_caught_at_the_task_end(stream, tmp_path):
    trainer = _trainer(stream, _model(SLDAConfig()), checkpoint_dir=str(tmp_path / "ckpt"))
    trainer.collator = NaNInputs()
    _fit_expecting(trainer, r"after task 0: buffer 'head\.\w+' holds NaN", tmp_path)


# ---- threads ----------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_threads(monkeypatch):
    saved = torch.get_num_threads()
    for name in threads.THREAD_ENV + ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    threads.reset()
    yield monkeypatch
    threads.reset()
    torch.set_num_threads(saved)


def test_the_default_is_the_process_share_of_the_usable_cores_less_the_busy_ones(fresh_threads):
    fresh_threads.setattr(threads, "usable_cores", lambda: 8)
    fresh_threads.setattr(threads, "busy_cores", lambda: 0)
    assert threads.default_threads()[0] == 8
    fresh_threads.setenv("WORLD_SIZE", "4")
    assert threads.default_threads()[0] == 2
    fresh_threads.setenv("LOCAL_WORLD_SIZE", "2")  # the processes on this machine, not the job's
    assert threads.default_threads()[0] == 4
    fresh_threads.setattr(threads, "busy_cores", lambda: 5)
    assert threads.default_threads() == (1, "8 usable core(s) / 2 local process(es), 5 busy by the load average")
    assert threads.default_threads(load_aware=False)[0] == 4
    fresh_threads.setattr(threads, "busy_cores", lambda: 20)
    assert threads.default_threads()[0] == 1


def test_an_explicit_thread_count_is_respected(fresh_threads):
    fresh_threads.setattr(threads, "usable_cores", lambda: 8)
    fresh_threads.setattr(threads, "busy_cores", lambda: 0)
    torch.set_num_threads(8)  # torch's own default here
    fresh_threads.setenv("OMP_NUM_THREADS", "8")
    assert threads.apply_default_threads() == {"threads": 8, "reason": "set by the user (OMP_NUM_THREADS=8)"}
    assert torch.get_num_threads() == 8
    threads.reset()
    fresh_threads.delenv("OMP_NUM_THREADS")
    torch.set_num_threads(3)  # a user's torch.set_num_threads
    assert threads.apply_default_threads()["threads"] == 3 and torch.get_num_threads() == 3
    threads.reset()
    torch.set_num_threads(8)
    fresh_threads.setenv("LOCAL_WORLD_SIZE", "2")
    assert threads.apply_default_threads()["threads"] == 4 and torch.get_num_threads() == 4
    torch.set_num_threads(1)  # later calls keep the first decision
    assert threads.apply_default_threads()["threads"] == 4 and torch.get_num_threads() == 1


def test_the_optimizer_is_fused_where_training_runs_in_bf16(stream):
    params = [torch.nn.Parameter(torch.zeros(3))]
    fused = lambda **training: _trainer(stream, **training)._optimizer(params).defaults.get("fused")  # noqa: E731
    assert fused(precision="bf16") is True and fused(precision="bf16", optimizer="sgd") is True
    assert not fused(precision="fp32") and not fused()  # fp32 keeps the per-parameter loop's numbers
    assert fused(precision="fp32", fused_optimizer=True) is True and not fused(precision="bf16", fused_optimizer=False)
    with pytest.raises(UserInputError, match="fused_optimizer"):
        TrainingConfig(fused_optimizer="yes")


def _image_methods() -> list[str]:
    from hf_clroute.core.registry import available_methods
    return [m for m in available_methods() if m != "prompt-tuning"]  # prompt tuning needs word embeddings


@pytest.mark.parametrize("method", _image_methods())
def test_every_method_trains_and_scores_under_bf16(stream, method):
    """Replay memories, distillation targets, routers and statistics all meet bf16 activations here."""
    from hf_clroute.core.registry import get_method

    model = _model(get_method(method).config_class())
    result = _trainer(stream, model, precision="bf16").fit()
    assert result.finished and result.records["precision"]["train"]["dtype"] == "bf16"
    assert all(0.0 <= a <= 1.0 for row in result.accuracy_matrix for a in row)
