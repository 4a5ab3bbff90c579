"""The ``charlm-domains`` suite: a character-level LM moving Shakespeare -> KJV Bible -> Python source.

Reproduces the APN paper's domain-shift experiment at CPU scale. A GPT-2
architecture char-LM (``char_lm_config``, size from the suite file) is trained
from scratch on domain A, then on B, then on C, one pass over each domain's
character budget; after every domain its perplexity on every domain's held-out
text is measured (``ppl_matrix[t][d]``: after domain t, on domain d).

Variants, "<architecture>-<adaptation>":

* architecture ``dense``: the GPT-2 MLP; ``apn``: every MLP replaced by a
  :class:`~hf_clroute.methods.apn.PatchFFN` bank (``hf_clroute/bench/configs/methods/apn.json``,
  ``suites.charlm-domains``), same depth and width;
* architecture ``<apn variant>`` (a settings file ``bench/configs/ablations/<name>.json`` with
  ``"method": "apn"``, e.g. ``apn-frozen-routing``): APN with that file's config on top of
  ``apn.json`` and its per-suite blocks, e.g. ``apn-frozen-routing-all``;
* adaptation ``all``: every weight trains on every domain (the paper's global
  fine-tuning); ``ffn``: everything trains on domain A, then only the FFNs (dense:
  ``finetune-ffn``) or the patch banks (APN: ``adapt_params="ffn"``).

Every variant uses the suite's one training config (same learning rate, batch,
data order and initial weights per seed), so only the FFN and the adaptation
scope differ. Corpus chunks are cut into ``block_size``-character windows so
the whole character budget is trained on (the collator keeps one window per text).

Reported per variant: retention = PPL_A after B / PPL_A after A (lower is better; 1 = no
forgetting), adaptation = PPL on each new domain right after training on it, parameters and
forward FLOPs per token (whole model and FFN part), training throughput (sequences/s) and its
APN/dense ratio, and for APN the patch overlap between domains (``patch_overlap``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset
from transformers import GPT2LMHeadModel

from hf_clroute.backbones.catalog import char_lm_config, get_blocks
from hf_clroute.backbones.char_tokenizer import CharTokenizer
from hf_clroute.baselines.finetune import FinetuneConfig
from hf_clroute.baselines.finetune_ffn import FfnFinetuneConfig
from hf_clroute.bench.harness.lr_schedule import (
    EVALUATE_ONLY,
    LRSchedule,
    ScheduledTrainer,
)
from hf_clroute.bench.harness.results import write_run
from hf_clroute.bench.harness.settings import merged_method_settings, registered_method
from hf_clroute.bench.harness.suites import load_suite, merge_seed_runs
from hf_clroute.core.config import CLConfig
from hf_clroute.core.model import get_cl_model
from hf_clroute.data import CausalLMCollator, load_text_corpus, text_domains
from hf_clroute.engine import TrainingConfig, make_accelerator
from hf_clroute.errors import UserInputError
from hf_clroute.methods.apn import ApnConfig, PatchFFN, patch_overlap, usage_per_domain
from hf_clroute.metrics import (
    format_mean_std,
    mean_std,
    perplexity_retention,
    retention,
)

ARCHITECTURES = ("dense", "apn")
LRSCHEDULE_FIELDS = {f.name for f in dataclasses.fields(LRSchedule)}
#: APN fields that act only from the second domain on: variants differing in them share domain A's run
AFTER_FIRST_DOMAIN = ("adapt_params", "freeze_routing_after_first_task")
ADAPTATIONS = ("all", "ffn")


@dataclass
class CharLMSuite:
    """The suite file's fields (``hf_clroute/bench/configs/suites/charlm-domains.json``)."""

    name: str = field(
        metadata={"help": "Suite name; also the key of per-suite settings in "
                          "hf_clroute/bench/configs/methods/apn.json."})
    runner: str = field(metadata={"help": "This runner: 'charlm'."})
    domains: list[Any] = field(metadata={"help": (
        "Text domains in training order (A, B, C, ...). Each is a built-in source (`hf-clroute data list`), a "
        "local .txt/parquet/json/csv file, a directory of them, a Hub dataset id, or a mapping "
        "{\"train\": file, \"test\": file, \"name\": shown name, \"text_column\": column}.")})
    model: dict[str, Any] = field(metadata={"help": "char_lm_config overrides: n_layer, n_embd, n_head, dropouts."})
    block_size: int = field(
        default=128, metadata={"help": "Characters per training/evaluation window (context length)."})
    train_chars: int = field(default=500_000, metadata={"help": "Training characters per domain (one pass)."})
    test_chars: int = field(default=50_000, metadata={"help": "Held-out characters per domain."})
    training: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "TrainingConfig fields, for every variant."})
    methods: list[str] = field(
        default_factory=list, metadata={"help": "Variants '<dense|apn>-<all|ffn>' run by default."})
    phases: list[dict[str, Any]] = field(default_factory=list, metadata={"help": (
        "Optional, one per domain: an LRSchedule (steps, learning_rate, warmup_steps, schedule, min_lr_ratio) that "
        "domain trains under, with a fresh optimiser: e.g. domain A to convergence, B under an adaptation budget. "
        "Each domain then trains for exactly its steps (its windows reshuffled and repeated as needed; "
        "training.epochs and train_chars only pick the text), and variants that differ only after domain A "
        "(adaptation scope, routing frozen after A) branch from one shared run on A per seed. "
        "Empty: every domain trains epochs x train_chars at training.learning_rate.")})
    quick: dict[str, Any] = field(default_factory=dict, metadata={"help": "Overrides of the fields above for --quick."})
    description: str = field(default="", metadata={"help": "What the suite measures."})
    bases: list[str] = field(default_factory=list, metadata={
        "help": "Set by the loader: the suites this one is based on (nearest first); their APN settings apply."})

    @classmethod
    def load(cls, name_or_path: str, quick: bool = False) -> "CharLMSuite":
        suite = load_suite(cls, name_or_path, quick)
        if suite.phases and len(suite.phases) != len(suite.domains):
            raise UserInputError(f"charlm suite {suite.name!r}: {len(suite.phases)} phases for "
                                 f"{len(suite.domains)} domains (give one per domain, or none)")
        suite.schedules()  # each phase checked now, naming its field
        return suite

    def schedules(self) -> list[LRSchedule]:
        out = []
        for i, phase in enumerate(self.phases):
            if not isinstance(phase, dict) or set(phase) - LRSCHEDULE_FIELDS:
                raise UserInputError(f"charlm suite {self.name!r}: phases[{i}] must be an object with fields "
                                     f"{sorted(LRSCHEDULE_FIELDS)}, got {phase!r}")
            out.append(LRSchedule(**phase))
        return out


def is_architecture(name: str) -> bool:
    """'dense', 'apn', or an APN settings variant (``bench/configs/ablations/<name>.json`` with ``"method": "apn"``)."""
    return name in ARCHITECTURES or (name.startswith("apn-") and registered_method(name) == "apn")


def parse_variant(name: str) -> tuple[str, str]:
    arch, _, adapt = name.rpartition("-")
    if not is_architecture(arch) or adapt not in ADAPTATIONS:
        raise ValueError(f"unknown charlm-domains variant {name!r}: use '<{'|'.join(ARCHITECTURES)}|apn-...>-"
                         f"<{'|'.join(ADAPTATIONS)}>' (apn-...: an APN settings file in bench/configs/ablations)")
    return arch, adapt


def expand_variants(methods: list[str]) -> list[str]:
    """'apn' means both 'apn-all' and 'apn-ffn' (likewise an APN settings variant alone)."""
    out = []
    for m in methods:
        out += [f"{m}-{a}" for a in ADAPTATIONS] if is_architecture(m) else [m]
    for m in out:
        parse_variant(m)
    return list(dict.fromkeys(out))


def apn_settings(suite: CharLMSuite, arch: str = "apn") -> dict[str, Any]:
    """APN's config fields for this suite: its method file (for a variant: apn.json, then the variant's
    file), then the blocks of the suites it is based on, then its own."""
    return merged_method_settings(arch, [*reversed(suite.bases), suite.name])["config"]


def variant_config(suite: CharLMSuite, variant: str) -> CLConfig:
    arch, adapt = parse_variant(variant)
    if arch == "dense":
        return FinetuneConfig(freeze_backbone=False) if adapt == "all" else FfnFinetuneConfig()
    settings = apn_settings(suite, arch)
    return ApnConfig(**{**settings, "mode": "replace", "freeze_backbone": False, "adapt_params": adapt})


# ------------------------------------------------------------------ data
def windows(split: Dataset, size: int) -> Dataset:
    """Each text cut into consecutive ``size``-character windows (short tails dropped)."""
    def cut(batch: dict[str, list]) -> dict[str, list]:
        return {"text": [t[i:i + size] for t in batch["text"] for i in range(0, len(t) - size // 4, size)]}

    return split.map(cut, batched=True, remove_columns=split.column_names)


def domain_name(ref: Any) -> str:
    """The name a domain is shown under: a source or Hub id as given, a file's stem, a directory's
    name, a mapping's ``name`` (else its train file's stem)."""
    if isinstance(ref, dict):
        if ref.get("name"):
            return str(ref["name"])
        first = ref.get("train") or next(v for k, v in ref.items() if k not in ("name", "text_column"))
        return Path(str(first[0] if isinstance(first, list) else first)).name.split(".")[0]
    path = Path(str(ref)).expanduser()
    return path.name.split(".")[0] if path.is_file() else path.name if path.is_dir() else str(ref)


def load_domain(ref: Any, seed: int) -> Any:
    """One domain's ``DatasetDict(train, test)`` with a ``text`` column, through the corpus loader
    (a file without a test split holds out 10% of its lines, chosen by ``seed``)."""
    if isinstance(ref, dict):
        files = {k: v for k, v in ref.items() if k not in ("name", "text_column")}
        if not files:
            raise ValueError(f"charlm domain {ref!r}: the mapping names no files (give 'train' and 'test')")
        return load_text_corpus(files, ref.get("text_column", "text"), seed=seed)
    if not isinstance(ref, str):
        raise ValueError(f"charlm domain {ref!r}: give a source name, a path, a Hub id or a mapping")
    return load_text_corpus(ref, seed=seed)


def build_stream(suite: CharLMSuite, seed: int) -> tuple[list, CharTokenizer]:
    """The domains' experiences for ``seed`` (chunks picked by ``text_domains``, then cut into
    windows, training windows shuffled by the seed) and a tokenizer over their characters."""
    names = [domain_name(d) for d in suite.domains]
    if len(set(names)) != len(names):
        raise ValueError(f"charlm suite {suite.name!r}: two domains share a name ({names}); "
                         "give mappings with distinct 'name' fields")
    # The held-out split of a file without one is fixed (seed 0), so every run seed tests on the same text.
    stream = text_domains([load_domain(d, seed=0) for d in suite.domains], names,
                          train_chars=suite.train_chars, test_chars=suite.test_chars, seed=seed)
    stream = [
        dataclasses.replace(e, train=windows(e.train, suite.block_size).shuffle(seed=seed).flatten_indices(),
                            test=windows(e.test, suite.block_size))
        for e in stream
    ]
    texts = [t for e in stream for split in (e.train, e.test) for t in split["text"]]
    if suite.phases:
        batch = suite.training.get("batch_size", TrainingConfig.batch_size)
        stream = [dataclasses.replace(e, train=exactly(e.train, phase.steps * batch, seed))
                  for e, phase in zip(stream, suite.schedules(), strict=True)]
    return stream, CharTokenizer.from_corpus(texts)


def exactly(train: Dataset, n: int, seed: int) -> Dataset:
    """``n`` training windows: whole reshufflings of ``train`` (seeded) one after another, cut at ``n``."""
    rng = np.random.default_rng([seed, len(train)])
    order = np.concatenate([rng.permutation(len(train)) for _ in range(-(-n // len(train)))])[:n]
    return train.select(order).flatten_indices()


# ------------------------------------------------------------------ cost
def flops_per_token(model: GPT2LMHeadModel, block_size: int) -> dict[str, int]:
    """Forward FLOPs (2 x multiply-adds) per token; attention scores at a full ``block_size`` context."""
    cfg = model.config
    d = cfg.n_embd
    ffn = 0
    for block in get_blocks(model):
        if isinstance(block.mlp, PatchFFN):
            ffn += block.mlp.flops_per_token()
        else:
            ffn += 2 * (block.mlp.c_fc.weight.numel() + block.mlp.c_proj.weight.numel())
    attention = cfg.n_layer * (2 * 4 * d * d + 2 * 2 * block_size * d)
    return {"ffn_flops_per_token": ffn, "model_flops_per_token": ffn + attention + 2 * d * cfg.vocab_size}


def param_counts(model: GPT2LMHeadModel) -> dict[str, int]:
    ffn = sum(p.numel() for block in get_blocks(model) for p in block.mlp.parameters())
    return {"params": sum(p.numel() for p in model.parameters()), "ffn_params": ffn}


# ------------------------------------------------------------------ running
def new_model(suite: CharLMSuite, variant: str, seed: int, tokenizer: CharTokenizer) -> Any:
    torch.manual_seed(seed)  # the same initial attention/embedding weights for every variant of a seed
    backbone = GPT2LMHeadModel(char_lm_config(len(tokenizer), n_positions=suite.block_size, **suite.model))
    return get_cl_model(backbone, variant_config(suite, variant))


def train(model: Any, suite: CharLMSuite, stream: list, tokenizer: CharTokenizer, seed: int, progress: bool,
          schedules: list[LRSchedule | str | None] | None = None) -> tuple[Any, float, list[list[float]]]:
    """(StreamResult, wall seconds, the rate of every step per task) of ``model`` over ``stream``."""
    training = TrainingConfig(**{**suite.training, "seed": seed, "progress": progress})
    started = time.perf_counter()
    trainer = ScheduledTrainer(model, stream, training, CausalLMCollator(tokenizer, suite.block_size),
                               make_accelerator(training), schedules=schedules or [])
    result = trainer.fit()
    return result, time.perf_counter() - started, trainer.lr_history


def make_row(model: Any, variant: str, seed: int, suite: CharLMSuite, results: list, wall_s: float) -> dict:
    """One variant's per-seed row; ``results``: its StreamResults in order (the last has the whole matrix)."""
    result = results[-1]
    P = result.accuracy_matrix
    samples = sum(r.train_samples for r in results)
    seconds = sum(r.train_seconds for r in results)
    row = {
        "seed": seed,
        "ppl_matrix": P,
        "untrained_ppl": results[0].untrained_accuracy,
        "retention": retention(P, domain=0, after=1) if len(P) > 1 else 1.0,
        "retention_final": perplexity_retention(P)["retention"],
        "adaptation": [P[t][t] for t in range(1, len(P))],
        "train_samples_per_s": samples / seconds if seconds else 0.0,
        "train_tokens_per_s": (samples / seconds if seconds else 0.0) * suite.block_size,
        "infer_samples_per_s": result.infer_samples_per_s,
        "peak_mem_mb": max(r.peak_mem_mb for r in results),
        "trainable_params": int(result.params["trainable_params"]),
        "trainable_pct": float(result.params["trainable_pct"]),
        "wall_s": wall_s,
        **param_counts(model.backbone),
        **flops_per_token(model.backbone, suite.block_size),
    }
    if parse_variant(variant)[0] != "dense":
        row["patch_usage"] = model.method.patch_usage.tolist()
        row["patch_overlap"] = patch_overlap(model.method.patch_usage)
        row["patch_usage_per_domain"] = usage_per_domain(model.method.patch_usage)
    return row


def run_variant(suite: CharLMSuite, variant: str, seed: int, stream: list, tokenizer: CharTokenizer,
                progress: bool) -> dict:
    """A variant over the whole stream at the training config's constant rate (a suite without phases)."""
    model = new_model(suite, variant, seed, tokenizer)
    result, wall, _ = train(model, suite, stream, tokenizer, seed, progress)
    return make_row(model, variant, seed, suite, [result], wall)


def first_domain_key(suite: CharLMSuite, variant: str) -> str:
    """Variants with the same key train identically on domain A: the architecture and its settings
    but for the fields that act only from the second domain on."""
    arch, _ = parse_variant(variant)
    if arch == "dense":
        return "dense"
    settings = {k: v for k, v in apn_settings(suite, arch).items() if k not in AFTER_FIRST_DOMAIN}
    return "apn " + json.dumps(settings, sort_keys=True)


def branch(trained: Any, suite: CharLMSuite, variant: str) -> Any:
    """A copy of a model trained on domain A, set to train the later domains as ``variant``."""
    config = variant_config(suite, variant)
    if parse_variant(variant)[0] == "dense":  # the dense methods keep no state: the trained weights under its method
        return get_cl_model(copy.deepcopy(trained.backbone), config)
    model = copy.deepcopy(trained)  # patch usage of domain A included
    for name in AFTER_FIRST_DOMAIN:  # read from the second task on (Apn.on_task_start); the config object is shared
        setattr(model.config, name, getattr(config, name))
    return model


def run_phased(suite: CharLMSuite, variants: list[str], seed: int, stream: list, tokenizer: CharTokenizer,
               progress: bool) -> dict[str, dict]:
    """Every variant under the suite's phases; variants that differ only after domain A branch from one
    run on A. The later domains then train on a stream whose first domain is read without training,
    so its row is the trained model's on every domain and the method sees the later domains as tasks 1, 2, ..."""
    schedules = suite.schedules()
    # Domain A keeps one window (an experience needs training data), read without training.
    rest = [dataclasses.replace(stream[0], train=stream[0].train.select([0])), *stream[1:]]
    groups: dict[str, list[str]] = {}
    for variant in variants:
        groups.setdefault(first_domain_key(suite, variant), []).append(variant)
    rows = {}
    for members in groups.values():
        first = new_model(suite, members[0], seed, tokenizer)
        result_a, wall_a, lr_a = train(first, suite, stream[:1], tokenizer, seed, progress, schedules[:1])
        for variant in members:
            model = branch(first, suite, variant)
            result, wall, lr_rest = train(model, suite, rest, tokenizer, seed, progress,
                                          [EVALUATE_ONLY, *schedules[1:]])
            row = make_row(model, variant, seed, suite, [result_a, result], wall_a + wall)
            row["first_domain_wall_s"] = wall_a
            row["phase_lr"] = [{"steps": len(h), "first": h[0], "peak": max(h), "last": h[-1]}
                               for h in [lr_a[0], *lr_rest[1:]] if h]
            rows[variant] = row
    return rows


def _stat(runs: list[dict], get) -> dict[str, float]:
    return mean_std([get(r) for r in runs])


def aggregate_variant(runs: list[dict]) -> dict[str, Any]:
    T = len(runs[0]["ppl_matrix"])
    out = {
        "ppl_matrix": np.mean([r["ppl_matrix"] for r in runs], axis=0).round(4).tolist(),
        "retention": _stat(runs, lambda r: r["retention"]),
        "retention_final": [_stat(runs, lambda r, d=d: r["retention_final"][d]) for d in range(T - 1)],
        "initial_ppl": _stat(runs, lambda r: r["ppl_matrix"][0][0]),
        "adaptation": [_stat(runs, lambda r, t=t: r["adaptation"][t]) for t in range(T - 1)],
        "final_ppl": [_stat(runs, lambda r, d=d: r["ppl_matrix"][-1][d]) for d in range(T)],
        **{k: _stat(runs, lambda r, k=k: r[k])
           for k in ("train_samples_per_s", "train_tokens_per_s", "infer_samples_per_s", "wall_s")},
        **{k: runs[0][k] for k in ("params", "ffn_params", "ffn_flops_per_token", "model_flops_per_token",
                                    "trainable_params", "trainable_pct")},
        "peak_mem_mb": max(r["peak_mem_mb"] for r in runs),
        "per_seed": [{k: v for k, v in r.items() if k != "patch_usage"} for r in runs],
    }
    if "patch_overlap" in runs[0]:
        out["patch_overlap"] = {
            key: np.mean([r["patch_overlap"][key] for r in runs], axis=0).round(4).tolist()
            for key in runs[0]["patch_overlap"]
        }
    if all("patch_usage_per_domain" in r for r in runs):
        out["patch_usage_per_domain"] = [
            {k: _stat(runs, lambda r, t=t, k=k: r["patch_usage_per_domain"][t][k])
             for k in runs[0]["patch_usage_per_domain"][t]}
            for t in range(T)
        ]
    return out


def run(name_or_path: str, *, methods: list[str] | None, seeds: list[int], quick: bool, out: str | Path,
        progress: bool = False) -> dict:
    """``hf-clroute bench --suite charlm-domains``: writes ``out/results.json`` and ``out/results.md``."""
    suite = CharLMSuite.load(name_or_path, quick=quick)
    variants = expand_variants(methods or suite.methods)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for seed in seeds:
        stream, tokenizer = build_stream(suite, seed)
        phased = run_phased(suite, variants, seed, stream, tokenizer, progress) if suite.phases else {}
        for variant in variants:
            row = phased.get(variant) or run_variant(suite, variant, seed, stream, tokenizer, progress)
            runs[variant].append(row)
            print(f"[{suite.name}] seed {seed} {variant}: PPL_A {row['ppl_matrix'][0][0]:.2f} -> "
                  f"{row['ppl_matrix'][1][0]:.2f} after B (retention {row['retention']:.2f}), "
                  f"new-domain PPL {', '.join(f'{x:.2f}' for x in row['adaptation'])} ({row['wall_s']:.0f}s)",
                  flush=True)
    config = {k: v for k, v in dataclasses.asdict(suite).items() if k not in ("quick", "bases")}
    config["domain_names"] = [domain_name(d) for d in suite.domains]
    config["apn"] = apn_settings(suite)
    archs = dict.fromkeys(parse_variant(v)[0] for v in variants)
    variant_settings = {a: apn_settings(suite, a) for a in archs if a not in ARCHITECTURES}
    if variant_settings:  # the APN settings variants' own configs
        config["apn_variants"] = variant_settings
    return write_results({"suite": suite.name, "seeds": seeds, "quick": quick, "config": config}, runs, out)


def write_results(header: dict, runs: dict[str, list[dict]], out: Path) -> dict:
    """Aggregate per-seed rows into ``out/results.json`` and ``out/results.md``."""
    methods = {v: aggregate_variant(r) for v, r in runs.items()}
    results = {**header, "kind": "charlm", "methods": methods}
    results["throughput_ratio"] = {
        adapt: methods[f"apn-{adapt}"]["train_samples_per_s"]["mean"]
        / methods[f"dense-{adapt}"]["train_samples_per_s"]["mean"]
        for adapt in ADAPTATIONS
        if f"apn-{adapt}" in methods and f"dense-{adapt}" in methods
    }
    return write_run(out, results, results_markdown(results))


# ------------------------------------------------------------------ report
def _f(stat: dict[str, float], digits: int = 2, n: int | None = None) -> str:
    """mean ± std; "mean (one seed)" for a row of one seed (``n``), which has no spread to show."""
    return format_mean_std(stat, scale=1, digits=digits, n=n)


def results_markdown(results: dict) -> str:
    cfg = results["config"]
    domains = cfg.get("domain_names") or cfg["domains"]
    model = ", ".join(f"{k}={v}" for k, v in cfg["model"].items())
    epochs = cfg.get("training", {}).get("epochs", 1)
    passes = "one pass" if epochs == 1 else f"{epochs} passes (epochs)"
    if cfg.get("phases"):  # each domain trains for its own steps under its own schedule
        batch = cfg.get("training", {}).get("batch_size", TrainingConfig.batch_size)

        def floor(p: dict[str, Any]) -> str:
            return f" to {p.get('min_lr_ratio', 0.1):g} x peak" if p.get("schedule", "cosine") == "cosine" else ""

        passes = "; ".join(
            f"{d}: {p['steps']} steps of {batch} windows at peak rate {p['learning_rate']:g} "
            f"({p.get('warmup_steps', 0)} warm-up, then {p.get('schedule', 'cosine')}{floor(p)})"
            for d, p in zip(domains, cfg["phases"])) + ", a fresh AdamW per domain; windows cut from"
    lines = [
        f"# {results['suite']} (seeds {', '.join(map(str, results['seeds']))}{', quick' if results['quick'] else ''})",
        "",
        f"Char-level GPT-2 ({model}, context {cfg['block_size']}) trained from scratch on "
        f"{' -> '.join(domains)}, {passes} {'' if cfg.get('phases') else 'over '}{cfg['train_chars']:,} characters "
        "per domain; perplexity on "
        f"{cfg['test_chars']:,} held-out characters per domain. APN: {json.dumps(cfg['apn'], sort_keys=True)}. "
        "Mean ± std over seeds. Retention = PPL_A after B / PPL_A after A (1 = no forgetting). "
        "Adaptation = PPL on a domain right after training on it. `all`: every weight trains on every domain; "
        "`ffn`: after the first domain only the FFNs (dense) / patch banks (APN) train.",
        *([""] + [f"`{a}`: APN with "
                  f"{json.dumps({k: v for k, v in s.items() if cfg['apn'].get(k) != v}, sort_keys=True)} "
                  f"(bench/configs/ablations/{a}.json)." for a, s in cfg["apn_variants"].items()]
          if cfg.get("apn_variants") else []),
        "",
        f"| variant | PPL A after A | PPL A after B | retention A (B) | PPL B after B | PPL C after C | "
        f"final PPL {'/'.join(d[:3] for d in domains)} | params | FFN params | FLOPs/token (FFN) | train seq/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in results["methods"].items():
        P = [r["ppl_matrix"] for r in m["per_seed"]]
        n = len(P)
        after_b = mean_std([p[1][0] for p in P])
        final = " / ".join(f"{s['mean']:.2f}" for s in m["final_ppl"])
        adaptation = " | ".join([_f(s, n=n) for s in m["adaptation"][:2]] + ["–"] * (2 - len(m["adaptation"][:2])))
        lines.append(
            f"| {name} | {_f(m['initial_ppl'], n=n)} | {_f(after_b, n=n)} | {_f(m['retention'], n=n)} | {adaptation} | "
            f"{final} | {m['params']:,} | {m['ffn_params']:,} | {m['model_flops_per_token']:,} "
            f"({m['ffn_flops_per_token']:,}) | {_f(m['train_samples_per_s'], 1, n)} |"
        )
    if results.get("throughput_ratio"):
        ratios = ", ".join(f"{k}: {v:.2f}" for k, v in results["throughput_ratio"].items())
        lines += ["", f"Training throughput APN / dense (same adaptation variant): {ratios}."]
    if cfg.get("apn_variants"):
        lines += ["", *summary_table(results, domains)]
    for name, m in results["methods"].items():
        lines += ["", f"**{name}** perplexity matrix (row: after training on; column: evaluated on "
                      f"{', '.join(domains)}):", ""]
        lines += ["| after \\ on | " + " | ".join(domains) + " |", "|---" * (len(domains) + 1) + "|"]
        lines += [f"| {domains[t]} | " + " | ".join(f"{x:.2f}" for x in row) + " |"
                  for t, row in enumerate(m["ppl_matrix"])]
        if "patch_overlap" in m:
            lines += ["", f"{name} patch overlap between domains (weighted Jaccard of usage / Jaccard of the patches "
                      "covering 80% of assignments; mean over layers and seeds):", "",
                      "| domains | weighted Jaccard | Jaccard |", "|---|---|---|"]
            w, j = m["patch_overlap"]["weighted_jaccard"], m["patch_overlap"]["jaccard"]
            lines += [f"| {domains[s]} vs {domains[t]} | {w[s][t]:.3f} | {j[s][t]:.3f} |"
                      for s in range(len(domains)) for t in range(s + 1, len(domains))]
        if "patch_usage_per_domain" in m:
            lines += ["", f"{name} patch usage per domain while training on it (mean ± std over seeds; per bank, "
                      "averaged over banks): patches holding 80% of its assignments, usage entropy / log K, and the "
                      f"share of its assignments in {domains[0]}'s 80% patches:", "",
                      "| domain | patches (80%) | entropy | share in first domain's patches |", "|---|---|---|---|"]
            n = len(m["per_seed"])
            lines += [f"| {domains[t]} | {_f(u['patches_covering'], 1, n)} | {_f(u['usage_entropy'], 3, n)} | "
                      f"{_f(u['share_in_first_cover'], 3, n)} |" for t, u in enumerate(m["patch_usage_per_domain"])]
    return "\n".join(lines) + "\n"


def summary_table(results: dict, domains: list[str]) -> list[str]:
    """Per variant: retention of the first domain after each later one, adaptation PPL, and the
    patch overlap (weighted Jaccard) of every domain pair (APN variants), mean ± std over seeds."""
    T = len(domains)
    pairs = [(s, t) for s in range(T) for t in range(s + 1, T)]
    head = (["variant"] + [f"retention {domains[0][:3]} after {domains[t][:3]}" for t in range(1, T)]
            + [f"adaptation PPL {domains[t][:3]}" for t in range(1, T)]
            + [f"overlap {domains[s][:3]}-{domains[t][:3]}" for s, t in pairs])
    lines = ["Summary (mean ± std over seeds; retention = PPL of the first domain after a later one / right after "
             "it; overlap = weighted Jaccard of the two domains' patch usage, mean over layers):", "",
             "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, m in results["methods"].items():
        P = [r["ppl_matrix"] for r in m["per_seed"]]
        cells = [_f(mean_std([p[t][0] / p[0][0] for p in P]), n=len(P)) for t in range(1, T)]
        cells += [_f(s, n=len(P)) for s in m["adaptation"]]
        for s, t in pairs:
            seeds = [r["patch_overlap"]["weighted_jaccard"][s][t] for r in m["per_seed"] if "patch_overlap" in r]
            cells.append(_f(mean_std(seeds), 3, len(seeds)) if seeds else "–")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def merge(run_dirs: list[Path], out: Path, drop: tuple[str, ...] = ()) -> dict:
    """Join runs of one charlm suite (e.g. one per seed) and re-aggregate them."""
    return merge_seed_runs(run_dirs, out, write_results, drop)
