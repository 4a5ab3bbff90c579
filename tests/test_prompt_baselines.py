"""RwF's paper baselines: L2P, DualPrompt, CODA-Prompt, Online-LoRA. Each defining mechanism,
save/load, their settings files, and 1 vs 2 processes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import BertModel, ViTImageProcessor, ViTModel

from hf_clroute import CLModel, get_cl_model
from hf_clroute.backbones.catalog import get_blocks, tiny_bert_config, tiny_vit_config
from hf_clroute.baselines import CodaPromptConfig, DualPromptConfig, L2PConfig, OnlineLoraConfig
from hf_clroute.baselines.coda_prompt import orthogonal_to
from hf_clroute.baselines.online_lora import MergeableLoRA, OnlineLora
from hf_clroute.baselines.prompt_pool import PrefixAttention
from hf_clroute.core.method import ContinualMethod, StepContext
from hf_clroute.core.outputs import CLModelOutput

REPO = Path(__file__).resolve().parents[1]
METHODS = {"l2p": L2PConfig, "dualprompt": DualPromptConfig, "coda-prompt": CodaPromptConfig,
           "online-lora": OnlineLoraConfig}


def vit(layers: int = 5) -> ViTModel:
    torch.manual_seed(0)
    return ViTModel(tiny_vit_config(num_hidden_layers=layers)).eval()


def bert(layers: int = 5, attn: str = "sdpa") -> BertModel:
    torch.manual_seed(0)
    return BertModel(tiny_bert_config(num_hidden_layers=layers, attn_implementation=attn)).eval()


def images(n: int = 6, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def start_task(model: CLModel, task: int, classes: list[int]) -> None:
    """What the engine does at a task's start: grow the head, record the classes, call the hook."""
    model.grow_head(max(classes) + 1)
    model.method.task_classes = list(classes)
    model.method.on_task_start(model, SimpleNamespace(classes=classes, name=f"t{task}"), StepContext(task))


def end_task(model: CLModel, task: int) -> None:
    model.method.on_task_end(model, None, StepContext(task))


def train_steps(model: CLModel, batch: dict, steps: int = 3, lr: float = 0.05, task: int = 0) -> None:
    optimizer = torch.optim.SGD(model.trainable_parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        out = model(**batch)
        out.loss.backward()
        optimizer.step()
        model.after_step(batch, out, StepContext(task))
    model.eval()


# ---- L2P: the top-N prompts by key match, at the input -------------------------------------------


def test_l2p_inserts_exactly_the_top_n_prompts_by_cosine_key_match():
    model = get_cl_model(vit(), L2PConfig(pool_size=10, prompt_length=2, top_n=3))
    model.grow_head(2)
    pool, keys = model.method.prompt_pool, model.method.keys
    with torch.no_grad():  # keys of very different norms: a top-N by dot product would pick others
        keys.mul_(torch.logspace(-3, 3, 10)[:, None])
    seen = {}
    model.backbone.embeddings.register_forward_hook(lambda m, a, out: seen.setdefault("embeddings", []).append(out))
    x = images()
    with torch.no_grad():
        model(pixel_values=x)
        query = model.backbone(pixel_values=x).last_hidden_state[:, 0]  # the frozen, unprompted [CLS]
    cosine = F.normalize(query, dim=-1) @ F.normalize(keys, dim=-1).T
    expected = cosine.topk(3, dim=-1).indices
    assert not torch.equal(expected.sort(-1).values, (query @ keys.T).topk(3, dim=-1).indices.sort(-1).values)
    unprompted, prompted = seen["embeddings"][0], seen["embeddings"][1]
    assert prompted.shape[1] == unprompted.shape[1] + 3 * 2
    torch.testing.assert_close(prompted[:, 1:7], pool[expected].flatten(1, 2).detach())
    torch.testing.assert_close(prompted[:, 7:], unprompted[:, 1:])  # the image tokens, after the prompts


def test_l2p_surrogate_trains_only_the_chosen_keys_and_reads_the_prompt_positions():
    model = get_cl_model(vit(), L2PConfig())
    start_task(model, 0, [0, 1])
    model.train()
    out = model(pixel_values=images(2), labels=torch.tensor([0, 1]))
    assert set(out.losses) == {"ce", "pull"}
    out.losses["pull"].backward()
    chosen = set(model.method.select(model.method.query(model, {"pixel_values": images(2)}))[0].flatten().tolist())
    touched = set(torch.nonzero(model.method.keys.grad.abs().sum(-1)).flatten().tolist())
    assert touched == chosen and len(chosen) < 10
    assert model.method.prompt_pool.grad is None  # the surrogate moves keys, not prompts


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("config", [L2PConfig(readout="pooled"), L2PConfig(), DualPromptConfig(), CodaPromptConfig()],
                         ids=["l2p-pooled", "l2p", "dualprompt", "coda-prompt"])
def test_prompts_on_bert_with_padding_match_each_sentence_alone(config, attn):
    """Input prompts and prefixes extend BERT's padding mask in either format: padding changes nothing."""
    model = get_cl_model(bert(attn=attn), config)
    start_task(model, 0, [0, 1])
    ids = torch.tensor([[2, 5, 6, 7, 3], [2, 9, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        both = model.method.features(model, {"input_ids": ids, "attention_mask": mask})
        alone = model.method.features(model, {"input_ids": ids[1:, :3], "attention_mask": mask[1:, :3]})
    torch.testing.assert_close(both[1], alone[0], atol=1e-5, rtol=1e-4)


# ---- DualPrompt: G and E prefixes at their blocks, on keys and values only ---------------------------


def reference_prefix_attention(attention: torch.nn.Module, x: torch.Tensor, pk: torch.Tensor,
                               pv: torch.Tensor) -> torch.Tensor:
    """ViT self-attention with prefix keys and values, written out: q from the tokens only."""
    heads = attention.config.num_attention_heads
    b, n, d = x.shape

    def split(t):
        return t.view(b, t.shape[1], heads, d // heads).transpose(1, 2)

    q = split(attention.q_proj(x))
    k = split(torch.cat([pk, attention.k_proj(x)], dim=1))
    v = split(torch.cat([pv, attention.v_proj(x)], dim=1))
    weights = torch.softmax(q @ k.transpose(-1, -2) / (d // heads) ** 0.5, dim=-1)
    return attention.o_proj((weights @ v).transpose(1, 2).reshape(b, n, d))


def test_dualprompt_puts_g_and_e_prefixes_at_their_blocks():
    model = get_cl_model(vit(layers=6), DualPromptConfig(g_length=2, e_length=4, e_pool_size=3))
    start_task(model, 0, [0, 1])
    blocks = get_blocks(model.backbone)
    wrapped = [i for i, block in enumerate(blocks) if isinstance(block.attention, PrefixAttention)]
    assert wrapped == [0, 1, 2, 3, 4]  # the paper's blocks 1-2 (G) and 3-5 (E); block 6 is left alone
    method = model.method
    seen = {}
    for i in wrapped:
        blocks[i].attention.register_forward_pre_hook(
            lambda m, a, i=i: seen.__setitem__(i, method.injector.prefixes.get(i)))
    model.train()
    model(pixel_values=images(2), labels=torch.tensor([0, 1]))
    for j, layer in enumerate([0, 1]):
        assert seen[layer][0].shape == (2, 2, 32)
        torch.testing.assert_close(seen[layer][0][0], method.g_prompt[j, 0])
        torch.testing.assert_close(seen[layer][1][1], method.g_prompt[j, 1])
    for j, layer in enumerate([2, 3, 4]):
        torch.testing.assert_close(seen[layer][0][1], method.e_prompts[0, j, 0])  # task 0's E-prompt
        torch.testing.assert_close(seen[layer][1][0], method.e_prompts[0, j, 1])


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_prefix_is_on_keys_and_values_only(attn):
    """The wrapped attention equals prefix attention written out (prefix keys/values, queries from the
    tokens only), and leaves the block's shapes as they were."""
    torch.manual_seed(0)
    backbone = ViTModel(tiny_vit_config(num_hidden_layers=5, attn_implementation=attn)).eval()
    model = get_cl_model(backbone, DualPromptConfig(g_length=3, e_length=4))
    attention = get_blocks(model.backbone)[1].attention
    x = torch.randn(2, 17, 32)
    pk, pv = torch.randn(2, 3, 32), torch.randn(2, 3, 32)
    with torch.no_grad(), model.method.injector.active(prefixes={1: (pk, pv)}):
        out = attention(x)[0]
    base = attention.base_layer
    torch.testing.assert_close(out, reference_prefix_attention(base, x, pk, pv), atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # no prefix for this block: the attention as it was
        torch.testing.assert_close(attention(x)[0], base(x)[0])


def test_dualprompt_predicts_with_the_best_matching_key_among_the_tasks_started():
    model = get_cl_model(vit(), DualPromptConfig(e_pool_size=4))
    for task in range(2):
        start_task(model, task, [2 * task, 2 * task + 1])
        end_task(model, task)
    method = model.eval().method  # prediction: chosen by key (training uses the current task's)
    query = torch.randn(3, 32)
    with torch.no_grad():
        method.e_keys[:2] = query[:2]  # task 0's key matches query 0, task 1's query 1
        method.e_keys[2:] = query[2]  # untrained keys are never candidates, however well they match
    index, _ = method.choose(query)
    assert index.tolist()[:2] == [0, 1] and index[2].item() in (0, 1)


def trainer_for(model, n_tasks: int = 3):
    """A trainer over a real ``n_tasks``-task stream (built, not run: what it refuses, it refuses here)."""
    from hf_clroute import ContinualTrainer, TrainingConfig
    from hf_clroute.data import ImageCollator, class_incremental, load_source
    from hf_clroute.engine import make_accelerator

    stream = class_incremental(load_source("mnist"), n_tasks=n_tasks, seed=0, classes=list(range(2 * n_tasks)),
                               train_per_class=2, test_per_class=2, name="mnist")
    config = TrainingConfig(batch_size=4, progress=False)
    collator = ImageCollator(16, num_channels=3)
    return ContinualTrainer(model, stream, config, collator, make_accelerator(config, cpu=True))


def test_dualprompt_refuses_more_tasks_than_e_prompts_before_training():
    model = get_cl_model(vit(), DualPromptConfig(e_pool_size=2))
    with pytest.raises(ValueError, match="e_pool_size is 2.*task count to 3"):
        trainer_for(model)  # refused at construction: nothing has trained
    assert model.method.tasks_done == 0
    trainer_for(get_cl_model(vit(), DualPromptConfig(e_pool_size=3)))  # one E-prompt per task fits
    continued = get_cl_model(vit(), DualPromptConfig(e_pool_size=4))
    start_task(continued, 0, [0, 1])
    end_task(continued, 0)  # an adapter that has used one E-prompt: 1 + 3 tasks
    trainer_for(continued)
    start_task(continued, 1, [2, 3])
    end_task(continued, 1)
    with pytest.raises(ValueError, match="task count to 5"):
        trainer_for(continued)


# ---- CODA-Prompt: components, orthogonal new ones, frozen old ones -----------------------------------


def test_orthogonal_to_gives_unit_vectors_orthogonal_to_the_old_span():
    generator = torch.Generator().manual_seed(0)
    old = torch.randn(5, 12, generator=generator)  # not orthonormal, as trained components are
    new = orthogonal_to(old, 4, generator)
    torch.testing.assert_close(new @ old.T, torch.zeros(4, 5), atol=1e-5, rtol=0)
    torch.testing.assert_close(new @ new.T, torch.eye(4), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="components_per_task"):
        orthogonal_to(old, 8, generator)


def test_coda_refuses_a_stream_whose_components_exceed_the_hidden_size_before_training():
    hidden = tiny_vit_config().hidden_size
    model = get_cl_model(vit(), CodaPromptConfig(components_per_task=hidden // 3 + 1, prompt_length=4))
    with pytest.raises(ValueError, match=f"components_per_task is {hidden // 3 + 1}: 3 tasks.*at most {hidden // 3}"):
        trainer_for(model)
    assert len(model.method.chunks) == 0  # refused before any task's components were made
    trainer_for(get_cl_model(vit(), CodaPromptConfig(components_per_task=hidden // 3, prompt_length=4)))


def test_coda_new_components_start_orthogonal_to_the_trained_old_ones():
    model = get_cl_model(vit(), CodaPromptConfig(components_per_task=3, prompt_length=4))
    start_task(model, 0, [0, 1])
    train_steps(model, {"pixel_values": images(4), "labels": torch.tensor([0, 1, 0, 1])})
    end_task(model, 0)
    start_task(model, 1, [2, 3])
    old, new = model.method.chunks
    assert len(model.method.layers) == 5
    for name in ("prompts", "keys", "attention"):
        for block in range(5):
            a, b = getattr(old, name)[block].flatten(1), getattr(new, name)[block].flatten(1)
            torch.testing.assert_close(b @ a.T, torch.zeros(3, 3), atol=1e-5, rtol=0)
            torch.testing.assert_close(b.norm(dim=-1), torch.ones(3), atol=1e-5, rtol=0)


def test_coda_old_components_get_no_gradient_after_the_boundary():
    model = get_cl_model(vit(), CodaPromptConfig(components_per_task=3))
    start_task(model, 0, [0, 1])
    end_task(model, 0)
    start_task(model, 1, [2, 3])
    old, new = model.method.chunks
    trainable = {id(p) for p in model.trainable_parameters()}
    assert not any(id(p) in trainable for p in old.parameters())
    assert all(id(p) in trainable for p in new.parameters())
    model.train()
    model(pixel_values=images(4), labels=torch.tensor([2, 3, 2, 3])).loss.backward()
    assert all(p.grad is None for p in old.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in new.parameters())
    # Both chunks weigh in on the prompt: the old ones still act, frozen.
    assert model.method.weights(torch.randn(2, 32), 0).shape == (2, 6)


# ---- Online-LoRA: consolidation at a loss plateau, no task boundary ------------------------------------


def test_online_lora_reads_no_task_boundary():
    for hook in ("begin_task", "on_task_start", "on_task_end"):
        assert getattr(OnlineLora, hook) is getattr(ContinualMethod, hook), hook


def step_output(model: CLModel, batch: dict, ce: float) -> CLModelOutput:
    out = model(**batch)
    out.losses = {**out.losses, "ce": torch.tensor(ce), "hard": torch.tensor(0.0)}  # the summed loss the plateau reads
    return out


def test_a_loss_plateau_merges_the_lora_and_starts_a_new_one():
    model = get_cl_model(vit(), OnlineLoraConfig(window=3, plateau_mean=0.2, plateau_variance=0.01, hard_buffer_size=2))
    model.grow_head(2)
    method, batch = model.method, {"pixel_values": images(4), "labels": torch.tensor([0, 1, 1, 0])}
    layers = list(method.adapted)
    assert len(layers) == 10 and all(isinstance(m, MergeableLoRA) for m in layers)  # q and v of 5 blocks
    with torch.no_grad():
        for layer in layers:
            layer.lora_B.normal_()  # a LoRA that has learned something
    deltas = [layer.delta().detach().clone() for layer in layers]
    with torch.no_grad():
        before = model(pixel_values=batch["pixel_values"]).logits
    for ce in (2.0, 1.5, 0.5, 0.15, 0.1):  # high, then falling: not yet a plateau (variance too high)
        model.after_step(batch, step_output(model, batch, ce), StepContext(0))
    assert method.consolidations == 0 and len(method.hard) == 2
    model.after_step(batch, step_output(model, batch, 0.1), StepContext(0))  # window 0.15, 0.1, 0.1
    assert method.consolidations == 1 and method.hard == []
    for layer, delta in zip(layers, deltas):
        torch.testing.assert_close(layer.merged, delta)  # merged into the weights ...
        assert not layer.lora_B.any() and layer.lora_A.any()  # ... and a fresh LoRA started
        assert layer.importance.sum() > 0
    with torch.no_grad():
        torch.testing.assert_close(model(pixel_values=batch["pixel_values"]).logits, before)  # same function
    for ce in (0.1, 0.1, 0.1):  # a second plateau needs a peak first
        model.after_step(batch, step_output(model, batch, ce), StepContext(0))
    assert method.consolidations == 1
    with torch.no_grad():
        layers[0].lora_B.normal_()
    model.train()
    assert model(**batch).losses["importance"] > 0  # the new LoRA pays for moving important weights


def test_a_restarted_lora_starts_with_fresh_optimizer_moments():
    layer = MergeableLoRA(torch.nn.Linear(4, 4).requires_grad_(False), r=2, scale=1.0)
    layer.restart(torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        layer(torch.randn(5, 4)).pow(2).sum().backward()
        optimizer.step()
    assert optimizer.state[layer.lora_B]["step"] == 3
    layer.merge()
    layer.restart(torch.Generator().manual_seed(1))
    optimizer.zero_grad()
    layer(torch.randn(5, 4)).pow(2).sum().backward()
    optimizer.step()
    assert optimizer.state[layer.lora_B]["step"] == 1


# ---- every method: save/load, settings, 1 vs 2 processes ----------------------------------------------


def trained(method: str, backbone_fn=vit) -> CLModel:
    """A model two tasks into a stream, with each method's state moved off its initial values."""
    config = METHODS[method]()
    if method == "online-lora":
        config = OnlineLoraConfig(window=2, plateau_mean=5.0, plateau_variance=5.0)  # consolidates every 2 steps
    model = get_cl_model(backbone_fn(), config)
    for task in range(2):
        start_task(model, task, [2 * task, 2 * task + 1])
        train_steps(model, {"pixel_values": images(4, seed=task), "labels": torch.tensor([0, 1, 0, 1]) + 2 * task})
        end_task(model, task)
    if method == "online-lora":
        assert model.method.consolidations >= 2
    return model


@pytest.mark.parametrize("method", sorted(METHODS))
def test_save_and_load_give_identical_predictions(method, tmp_path):
    model = trained(method)
    model.save_pretrained(tmp_path / method)
    reloaded = CLModel.from_pretrained(vit(), tmp_path / method).eval()
    x = images(5, seed=7)
    with torch.no_grad():
        assert torch.equal(model(pixel_values=x).logits, reloaded(pixel_values=x).logits)
    assert reloaded.method.extra_state() == model.method.extra_state()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_settings_files_give_the_paper_defaults_and_a_full_search_budget(method, checked_search_grid):
    from hf_clroute.bench.harness.settings import resolve_run
    from hf_clroute.bench.harness.suites import SuiteConfig

    checked_search_grid(method)
    settings = resolve_run(SuiteConfig.load("split-mnist"), method, seed=3)
    assert isinstance(settings.adapter_config, METHODS[method])
    assert settings.sources["training.learning_rate"] == f"configs/methods/{method}.json"
    assert settings.adapter_config.init_seed == 3  # the run seed drives the prompts' init
    assert settings.adapter_config.current_task_loss == (method != "online-lora")


@pytest.fixture(scope="module")
def one_and_two_processes(tmp_path_factory, train_group) -> Path:
    """Every method by training/train_continual.py on one process and under `accelerate launch` on two
    (one launch for all four: its start-up is the slow part)."""
    from test_engine import _write_run_config

    root = tmp_path_factory.mktemp("one-vs-two")
    backbone_dir = root / "tiny-vit"
    vit().save_pretrained(backbone_dir)
    processor = ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    processor.save_pretrained(backbone_dir)

    def run_config(method: str, processes: int) -> Path:
        path = _write_run_config(root, backbone_dir, method, root / f"{processes}-{method}")
        run = json.loads(path.read_text())
        # Online-LoRA consolidates every few steps here, so the gathered hard buffer and importance are exercised.
        run["suite"]["method_settings"]["online-lora"] = {
            "config": {"window": 2, "plateau_mean": 5.0, "plateau_variance": 5.0}}
        path.write_text(json.dumps(run))
        return path

    for processes in (1, 2):
        train_group([run_config(method, processes) for method in sorted(METHODS)], processes)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(METHODS))
def test_two_process_accelerate_run_matches_one_process(one_and_two_processes, method):
    r1, r2 = (json.loads((one_and_two_processes / f"{n}-{method}" / "result.json").read_text()) for n in (1, 2))
    assert r1["num_processes"] == 1 and r2["num_processes"] == 2
    flat1, flat2 = (sum(r["accuracy_matrix"], []) for r in (r1, r2))
    assert flat1 == pytest.approx(flat2, abs=0.051)
