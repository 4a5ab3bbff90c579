"""Every baseline on a tiny real stream (MNIST on a tiny ViT, WordNet on a tiny BERT):
a few training steps, a bit-identical save/load, and each one's own behaviour."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors import safe_open
from transformers import AutoTokenizer, BertModel, GPT2LMHeadModel, ViTModel

from hf_clroute import CLConfig, ContinualTrainer, TrainingConfig, get_cl_model
from hf_clroute.backbones.catalog import char_lm_config, offline_model_path, tiny_bert_config, tiny_vit_config
from hf_clroute.baselines import (
    ERConfig,
    EWCConfig,
    FinetuneConfig,
    JointConfig,
    KNNConfig,
    LoraBaselineConfig,
    LwFConfig,
    NCMConfig,
    PromptTuningBaselineConfig,
    RanPACConfig,
    SimpleCILConfig,
    SLDAConfig,
    VPTConfig,
)
from hf_clroute.bench.runners.classification import summarize_result
from hf_clroute.core.model import PEFT_WEIGHTS_NAME, WEIGHTS_NAME, CLModel
from hf_clroute.core.outputs import model_inputs
from hf_clroute.data import ImageCollator, TextClassificationCollator, class_incremental, load_source
from hf_clroute.engine import make_accelerator

IMAGE_METHODS = {
    "finetune": FinetuneConfig,
    "ncm": NCMConfig,
    "simplecil": SimpleCILConfig,
    "slda": SLDAConfig,
    "ranpac": lambda: RanPACConfig(head_options={"projection_dim": 64, "ridge_lambda": 1.0, "nonlinearity": "relu"}),
    "knn": lambda: KNNConfig(buffer_size=16),
    "lora": LoraBaselineConfig,
    "vpt": VPTConfig,
    "er": lambda: ERConfig(buffer_size=16),
    "lwf": LwFConfig,
    "ewc": lambda: EWCConfig(fisher_samples=8),
    "joint": JointConfig,
}
TEXT_METHODS = {**IMAGE_METHODS, "er": lambda: ERConfig(buffer_size=16, max_length=24)}
del TEXT_METHODS["vpt"]
TEXT_METHODS["prompt-tuning"] = lambda: PromptTuningBaselineConfig(num_virtual_tokens=4)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one torch thread (conftest)


# ---- tiny real streams ---------------------------------------------------------------
@pytest.fixture(scope="module")
def image_stream():
    return class_incremental(
        load_source("mnist"), n_tasks=2, seed=0, classes=[0, 1, 2, 3], train_per_class=8, test_per_class=4, name="mnist"
    )


@pytest.fixture(scope="module")
def text_stream():
    return class_incremental(
        load_source("wordnet"), n_tasks=2, seed=0, classes=[4, 18, 6, 9], train_per_class=8, test_per_class=4,
        name="wordnet",
    )


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(offline_model_path("minilm"))


def tiny_vit() -> ViTModel:
    torch.manual_seed(0)
    return ViTModel(tiny_vit_config())


def tiny_bert(vocab_size: int) -> BertModel:
    torch.manual_seed(0)
    return BertModel(tiny_bert_config(vocab_size=vocab_size, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def image_collator() -> ImageCollator:
    cfg = tiny_vit_config()
    return ImageCollator(cfg.image_size, num_channels=cfg.num_channels)


def fit(model, stream, collator):
    config = TrainingConfig(batch_size=8, learning_rate=1e-3, progress=False)
    trainer = ContinualTrainer(model, stream, config, collator, make_accelerator(config, cpu=True))
    return trainer.fit()


@pytest.fixture(scope="module")
def fitted_image(image_stream):
    """Each image baseline trained once over the stream (tests that change a model copy it)."""
    cache = {}

    def get(method):
        if method not in cache:
            model = get_cl_model(tiny_vit(), IMAGE_METHODS[method]())
            cache[method] = (model, fit(model, image_stream, image_collator()))
        return cache[method]

    return get


def first_test_batch(stream, collator, n=6):
    return collator([stream[0].test[i] for i in range(n)])


def assert_bit_identical_reload(model, make_backbone, tmp_path, batch):
    model.save_pretrained(tmp_path)
    loaded = CLModel.from_pretrained(make_backbone(), tmp_path)
    saved, restored = model.adapter_state_dict(), loaded.adapter_state_dict()
    assert saved.keys() == restored.keys()
    for key, tensor in saved.items():
        assert torch.equal(tensor, restored[key]), key
    assert loaded.extra_state() == model.extra_state()
    model.eval(), loaded.eval()
    with torch.no_grad():
        ours, theirs = model(**model_inputs(batch)).logits, loaded(**model_inputs(batch)).logits
    assert torch.equal(ours, theirs)
    return loaded


# ---- every baseline: a few steps, then save/load -------------------------------------
@pytest.mark.parametrize("method", sorted(IMAGE_METHODS))
def test_image_baseline_trains_and_reloads(method, image_stream, fitted_image, tmp_path):
    model, result = fitted_image(method)
    assert result.finished and len(result.accuracy_matrix) == 2
    assert 0.0 <= min(result.accuracy_matrix[-1]) and max(result.accuracy_matrix[-1]) <= 1.0
    assert_bit_identical_reload(model, tiny_vit, tmp_path, first_test_batch(image_stream, image_collator()))


@pytest.mark.parametrize("method", sorted(TEXT_METHODS))
def test_text_baseline_trains_and_reloads(method, text_stream, tokenizer, tmp_path):
    collator = TextClassificationCollator(tokenizer, max_length=24)
    make = lambda: tiny_bert(tokenizer.vocab_size)  # noqa: E731
    model = get_cl_model(make(), TEXT_METHODS[method]())
    result = fit(model, text_stream, collator)
    assert result.finished and len(result.accuracy_matrix) == 2
    assert_bit_identical_reload(model, make, tmp_path, first_test_batch(text_stream, collator))


# ---- method-specific behaviour -------------------------------------------------------
def test_lora_is_peft_and_leaves_the_backbone_untouched(fitted_image, tmp_path):
    model, _ = fitted_image("lora")
    before = tiny_vit().state_dict()
    lora_layer = model.backbone.layers[0].attention.q_proj
    assert type(lora_layer).__module__.startswith("peft.tuners.lora")
    # The wrapped weights live under base_layer, bit-identical to the untrained backbone.
    after = {k.replace(".base_layer", ""): v for k, v in model.backbone.state_dict().items() if "lora_" not in k}
    assert after.keys() == before.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    model.save_pretrained(tmp_path)  # PEFT's format: its file holds the LoRA matrices alone, the head is beside it
    with safe_open(str(tmp_path / PEFT_WEIGHTS_NAME), framework="pt") as handle:
        keys = set(handle.keys())
    assert keys and all(".lora_A." in k or ".lora_B." in k for k in keys)
    assert any(".lora_B." in k for k in keys)
    with safe_open(str(tmp_path / WEIGHTS_NAME), framework="pt") as handle:
        assert set(handle.keys()) == {"head.weight", "head.bias"}


def tiny_char_lm() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(char_lm_config(40, n_embd=32, n_layer=2, n_head=2, n_positions=32))


def test_lora_on_gpt2_uses_fan_in_fan_out(tmp_path):
    make = tiny_char_lm
    model = get_cl_model(make(), LoraBaselineConfig(r=2))
    layer = model.backbone.transformer.h[0].attn.c_attn
    assert layer.fan_in_fan_out and model.trainable_parameters()
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()  # make the adapter matter before comparing
    ids = torch.randint(4, 40, (2, 12))
    assert_bit_identical_reload(model, make, tmp_path, {"input_ids": ids})


def test_prompt_tuning_keeps_shapes_and_points_vit_users_to_vpt(text_stream, tokenizer):
    collator = TextClassificationCollator(tokenizer, max_length=24)
    batch = model_inputs(first_test_batch(text_stream, collator, n=3))
    plain = get_cl_model(tiny_bert(tokenizer.vocab_size), FinetuneConfig(freeze_backbone=True))
    prompted = get_cl_model(tiny_bert(tokenizer.vocab_size), PromptTuningBaselineConfig(num_virtual_tokens=4))
    with torch.no_grad():
        p, q = plain.extract_features(batch), prompted.method.features(prompted, batch)
    assert p.shape == q.shape == (3, 32) and not torch.allclose(p, q)
    # Only the PEFT prompt (+ head, empty before any task) is trainable; no backbone tensor saved.
    assert set(prompted.adapter_state_dict()) == {
        "method.prompt_encoder.default.embedding.weight", "head.weight", "head.bias"
    }
    with pytest.raises(ValueError, match=r"supports \('text',\).*use 'vpt'"):
        get_cl_model(tiny_vit(), PromptTuningBaselineConfig())


def test_vpt_inserts_prompts_after_cls_and_keeps_feature_shape():
    model = get_cl_model(tiny_vit(), VPTConfig(num_prompts=3))
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        hidden = model.backbone(pixel_values=pixels).last_hidden_state
        features = model.extract_features({"pixel_values": pixels})
    assert hidden.shape == (2, 1 + 3 + 16, 32) and features.shape == (2, 32)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {"method.prompts", "head.weight", "head.bias"}
    with pytest.raises(ValueError, match=r"supports \('image',\)"):
        get_cl_model(tiny_bert(100), VPTConfig())


def test_er_buffer_keeps_old_task_examples_and_saves_them(image_stream, fitted_image, tmp_path):
    model, _ = fitted_image("er")
    buffer = model.method.buffer
    assert len(buffer) == 16 and buffer.num_seen == 32
    labels = set(buffer.contents()["labels"].tolist())
    assert labels & set(image_stream[0].classes) and labels & set(image_stream[1].classes)
    loaded = CLModel.from_pretrained(tiny_vit(), _saved(model, tmp_path))
    for name, value in buffer.contents().items():
        assert torch.equal(loaded.method.buffer.contents()[name], value)


def test_er_trains_on_current_plus_replayed_batch(image_stream):
    model = get_cl_model(tiny_vit(), ERConfig(buffer_size=16))
    model.grow_head(4)
    batch = image_collator()([image_stream[0].train[i] for i in range(8)])
    model.method.buffer.add(batch)
    model.train()
    out = model(**batch)
    assert out.logits.shape == (8, 4) and set(out.losses) == {"ce", "replay"} and out.losses["replay"] > 0
    torch.testing.assert_close(out.loss, out.losses["ce"] + out.losses["replay"])


def test_ewc_penalty_is_zero_at_the_anchor_and_grows_away_from_it(fitted_image):
    model = copy.deepcopy(fitted_image("ewc")[0])
    ewc = model.method
    assert dict(ewc.fisher.items()).keys() == dict(ewc.anchor.items()).keys() != set()
    assert ewc.penalty(model).item() == 0.0  # anchors were just taken at the last task end
    penalties = []
    for scale in (1e-2, 1e-1):
        with torch.no_grad():
            for p in model.trainable_parameters():
                p.add_(scale)
            penalties.append(ewc.penalty(model).item())
            for p in model.trainable_parameters():
                p.sub_(scale)
    assert 0.0 < penalties[0] < penalties[1]


def test_lwf_is_zero_when_the_model_equals_its_snapshot(image_stream, fitted_image, tmp_path):
    model = copy.deepcopy(fitted_image("lwf")[0])
    lwf, inputs = model.method, model_inputs(first_test_batch(image_stream, image_collator()))
    assert lwf.num_old_classes == 4
    model.train()
    assert lwf.distillation(model, inputs, model(**inputs).logits).item() == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        model.head.weight.mul_(3.0)
    assert lwf.distillation(model, inputs, model(**inputs).logits).item() > 1e-3
    # The teacher now differs from the model: it is saved, and reloads as it was.
    lwf.after_step(model, None, None, None)
    loaded = CLModel.from_pretrained(tiny_vit(), _saved(model, tmp_path))
    assert loaded.method.distillation(loaded, inputs, loaded(**inputs).logits).item() == pytest.approx(
        lwf.distillation(model, inputs, model(**inputs).logits).item()
    )


def test_lwf_teacher_is_not_saved_at_a_task_boundary(image_stream, fitted_image, tmp_path):
    model, _ = fitted_image("lwf")
    saved = _saved(model, tmp_path)
    with safe_open(str(saved / WEIGHTS_NAME), framework="pt") as handle:
        assert not [k for k in handle.keys() if k.startswith("method.teacher")]
    loaded = CLModel.from_pretrained(tiny_vit(), saved)
    inputs = model_inputs(first_test_batch(image_stream, image_collator()))
    loaded.method.on_task_start(loaded, image_stream[0], None)  # rebuilds the teacher from the weights
    assert loaded.method.distillation(loaded, inputs, loaded(**inputs).logits).item() == pytest.approx(0.0, abs=1e-6)


def test_joint_stream_at_task_t_covers_tasks_up_to_t(image_stream):
    model = get_cl_model(tiny_vit(), JointConfig(shuffle_seed=3))
    for t in range(2):
        rows = list(model.method.training_stream(image_stream[t], image_stream[: t + 1], epochs=1))
        expected = sum(len(e.train) for e in image_stream[: t + 1])
        assert len(rows) == expected
        assert {r["label"] for r in rows} == {c for e in image_stream[: t + 1] for c in e.classes}
    labels = [r["label"] for r in rows]
    assert labels != sorted(labels)  # shuffled together, not task after task
    again = [r["label"] for r in model.method.training_stream(image_stream[1], image_stream, epochs=1)]
    assert again == labels  # the same seed gives the same order


def test_joint_final_trains_only_at_the_last_task_on_every_task(image_stream):
    model = get_cl_model(tiny_vit(), JointConfig(shuffle_seed=3, schedule="final"))
    start = copy.deepcopy(model.adapter_state_dict())
    result = fit(model, image_stream, image_collator())
    # one step count per task: nothing at task 0, the union of both tasks (16 + 16 rows, batch 8) at task 1
    assert result.global_step == -(-sum(len(e.train) for e in image_stream) // 8)
    assert any(not torch.equal(start[k], v) for k, v in model.adapter_state_dict().items())
    fresh = get_cl_model(tiny_vit(), JointConfig(shuffle_seed=3, schedule="final")).method
    fresh.check_stream(len(image_stream))  # the trainer tells the method the stream's length
    assert len(fresh.training_stream(image_stream[0], image_stream[:1], epochs=1)) == 0
    # its earlier rows score the untrained model: the summary says n/a rather than a forgetting figure
    assert result.records["undefined_metrics"] == ["A_bar", "F_T", "BWT", "A_AUC"]
    row = summarize_result(result, "class")
    assert row["A_T"] == pytest.approx(sum(result.accuracy_matrix[-1]) / 2)
    assert all(row[k] is None for k in ("A_bar", "F_T", "BWT", "A_AUC"))
    cumulative = fit(get_cl_model(tiny_vit(), JointConfig(shuffle_seed=3)), image_stream, image_collator())
    assert "undefined_metrics" not in cumulative.records
    assert summarize_result(cumulative, "class")["F_T"] is not None


def test_joint_spreads_its_anytime_evaluations_over_every_task_it_reads(image_stream):
    """Joint training's task t reads tasks 0..t: its anytime evaluations are spread over that union's steps
    (the stream has no length, so the method says how much it reads), not over the last task's share."""
    model = get_cl_model(tiny_vit(), JointConfig(shuffle_seed=3))
    config = TrainingConfig(batch_size=4, learning_rate=1e-3, progress=False, evals_per_task=4, epochs=2)
    result = ContinualTrainer(model, image_stream, config, image_collator(), make_accelerator(config, cpu=True)).fit()
    task0 = 2 * len(image_stream[0].train) // 4  # 8 steps
    union = 2 * sum(len(e.train) for e in image_stream) // 4  # 16 steps
    assert model.method.training_examples(image_stream[1], image_stream, 2) == 4 * union
    steps = [step for step, _ in result.anytime]
    assert steps == [2, 4, 6, 8] + [task0 + k for k in (4, 8, 12, 16)]


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: LoraBaselineConfig(r=0), "r"),
        (lambda: LoraBaselineConfig(freeze_backbone=False), "freeze_backbone"),
        (lambda: PromptTuningBaselineConfig(prompt_tuning_init="TEXT"), "prompt_tuning_init"),
        (lambda: VPTConfig(num_prompts=0), "num_prompts"),
        (lambda: ERConfig(buffer_size=0), "buffer_size"),
        (lambda: LwFConfig(temperature=0), "temperature"),
        (lambda: EWCConfig(gamma=1.5), "gamma"),
        (lambda: JointConfig(schedule="offline"), "schedule"),
    ],
)
def test_config_validation_names_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_configs_round_trip_through_json(tmp_path):
    for make in [*IMAGE_METHODS.values(), *TEXT_METHODS.values()]:
        config = make()
        config.save_pretrained(tmp_path)
        assert CLConfig.from_pretrained(tmp_path) == config


def _saved(model, path):
    model.save_pretrained(path)
    return path
