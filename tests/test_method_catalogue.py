"""The method catalogue: one name per method (hyphenated, old `_` spellings still load), one settings folder
per kind of entry, and a short `hf-clroute methods`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import BertModel

from hf_clroute import CLConfig, get_cl_model
from hf_clroute.backbones.catalog import tiny_bert_config
from hf_clroute.baselines.prompt_tuning import PromptTuningBaseline, PromptTuningBaselineConfig
from hf_clroute.bench.harness.settings import (
    CONFIG_ROOT,
    SETTINGS_FOLDERS,
    method_file,
    method_summary,
    method_variants,
    registered_method,
    resolve_run,
)
from hf_clroute.bench.harness.suites import SuiteConfig
from hf_clroute.core.model import CONFIG_NAME, CLModel
from hf_clroute.core.registry import (
    available_methods,
    canonical_name,
    get_method,
    method_key,
    register_method,
)

OLD_NAMES = {"prompt_tuning": "prompt-tuning", "prompt_tuning-ctl": "prompt-tuning-ctl"}


def settings_files(folder: str) -> dict[str, object]:
    return {path.stem: path for path in sorted((CONFIG_ROOT / folder).glob("*.json"))}


def test_old_names_find_the_renamed_method():
    assert get_method("prompt_tuning") is get_method("prompt-tuning")
    assert get_method("prompt_tuning").config_class is PromptTuningBaselineConfig
    assert PromptTuningBaselineConfig.method == "prompt-tuning"
    assert canonical_name("prompt_tuning-ctl") == "prompt-tuning-ctl"
    with pytest.raises(ValueError, match="unknown method 'prompt tuning'"):
        get_method("prompt tuning")
    rows = {"prompt_tuning": 1, "rwf": 2}  # a committed results.json's rows keep the old name
    assert method_key(rows, "prompt-tuning") == method_key(rows, "prompt_tuning") == "prompt_tuning"
    assert method_key({"prompt-tuning": 1}, "prompt_tuning") == "prompt-tuning" and method_key(rows, "lora") is None


def test_names_use_one_separator_and_the_config_alone_declares_them():
    names = available_methods() + [n for folder in SETTINGS_FOLDERS[1:] for n in settings_files(folder)]
    assert not [n for n in names if n != canonical_name(n)]
    for name in available_methods():
        entry = get_method(name)
        assert entry.config_class.method == name and entry.method_class.config_class is entry.config_class

    class Underscored(PromptTuningBaselineConfig):
        method = "my_method"

    with pytest.raises(ValueError, match="separate words with '-'"):
        register_method(Underscored, PromptTuningBaseline)
    with pytest.raises(ValueError, match="config_class is PromptTuningBaselineConfig"):
        register_method(type("Other", (PromptTuningBaselineConfig,), {"method": "other"}), PromptTuningBaseline)


def test_an_adapter_saved_under_the_old_name_loads(tmp_path):
    torch.manual_seed(0)
    BertModel(tiny_bert_config()).save_pretrained(tmp_path / "bert")
    model = get_cl_model(BertModel.from_pretrained(tmp_path / "bert"), PromptTuningBaselineConfig(num_virtual_tokens=2))
    model.grow_head(3)
    model.save_pretrained(tmp_path / "adapter")
    config_file = tmp_path / "adapter" / CONFIG_NAME
    saved = json.loads(config_file.read_text())
    assert saved["method"] == "prompt-tuning"
    config_file.write_text(json.dumps({**saved, "method": "prompt_tuning"}))  # as an adapter saved before the rename

    config = CLConfig.from_pretrained(tmp_path / "adapter")
    assert isinstance(config, PromptTuningBaselineConfig) and config.method == "prompt-tuning"
    loaded = CLModel.from_pretrained(BertModel.from_pretrained(tmp_path / "bert"), tmp_path / "adapter").eval()
    inputs = {"input_ids": torch.randint(5, 100, (2, 8), generator=torch.Generator().manual_seed(1)),
              "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, model.eval()(**inputs).logits)


def test_settings_and_the_command_line_accept_old_names(tmp_path):
    suite = SuiteConfig.load("wordnet")
    for old, new in OLD_NAMES.items():
        assert registered_method(old) == "prompt-tuning" and method_file(old) == method_file(new)
        old_run, new_run = resolve_run(suite, old, 0), resolve_run(suite, new, 0)
        assert old_run.adapter_config == new_run.adapter_config and old_run.training == new_run.training
        assert old_run.sources == new_run.sources
    run = resolve_run(suite, "prompt_tuning-ctl", 0)
    assert run.adapter_config.current_task_loss and run.sources["config.current_task_loss"] == (
        "configs/ablations/prompt-tuning-ctl.json")
    shown = subprocess.run([sys.executable, "-m", "hf_clroute.cli", "train", "--suite", "wordnet", "--method",
                            "prompt_tuning", "--show-settings", "--output-dir", str(tmp_path / "run")],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "prompt-tuning" in shown.stdout and "configs/methods/prompt-tuning.json" in shown.stdout


def test_each_folder_holds_its_kind_of_settings():
    methods, variants, ablations = (settings_files(folder) for folder in SETTINGS_FOLDERS)
    assert sorted(methods) == available_methods()  # every registered method, and nothing else
    assert not (set(methods) & set(variants)) and not (set(variants) & set(ablations))
    assert not (set(methods) & set(ablations))
    for name in methods:
        assert "method" not in method_file(name), name  # the config class alone names a method
    for name, method in method_variants():
        assert registered_method(name) in methods, (name, method)
    for folder in SETTINGS_FOLDERS:
        for name in settings_files(folder):
            summary = method_summary(name)
            assert summary and len(summary) <= 80 and "\n" not in summary, name
            assert not any(mark in summary for mark in ("%", "±", "accuracy", "scored")), name


def test_methods_lists_methods_and_variants_in_at_most_40_lines():
    def lines(*args: str) -> list[str]:
        result = subprocess.run([sys.executable, "-c", "import sys; from hf_clroute.cli import main; "
                                 f"sys.exit(main(['methods', *{list(args)!r}]))"], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout.splitlines()

    short, everything = lines(), lines("--all")
    listed = {line.split()[0] for line in short[1:-1]}
    assert len(short) <= 40 and listed == set(available_methods()) | set(settings_files("variants"))
    assert {line.split()[0] for line in everything[1:]} == listed | set(settings_files("ablations"))
    assert all(len(line) <= 120 for line in everything)
