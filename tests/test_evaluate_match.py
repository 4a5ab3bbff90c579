"""`evaluate` says which of a suite's classes the adapter knows, and refuses a suite it shares no class
name with (whose scores would be chance, silently)."""

from __future__ import annotations

import json

import pytest

from hf_clroute.cli import main
from hf_clroute.commands.evaluate import evaluate_adapter

MNIST = ["0", "1", "2", "3"]


@pytest.fixture(scope="module")
def adapter(tiny_suite, tmp_path_factory):
    """An NCM adapter trained on the tiny suite: MNIST digits 0-3 (class names '0'..'3')."""
    out = tmp_path_factory.mktemp("evaluate_match")
    assert main(["bench", "--suite", str(tiny_suite), "--methods", "ncm", "--seeds", "0", "--quick", "--out",
                 str(out), "--no-progress"]) == 0
    return str(out / "adapters" / "ncm")


def _suite(tiny_suite, tmp_path, **changes) -> str:
    suite = {**json.loads(tiny_suite.read_text()), **changes}
    path = tmp_path / f"{suite['name']}.json"
    path.write_text(json.dumps(suite))
    return str(path)


def test_evaluate_says_how_many_classes_it_knows(adapter, tiny_suite, capsys):
    assert main(["evaluate", "--adapter", adapter, "--suite", str(tiny_suite), "--quick"]) == 0
    out = capsys.readouterr().out
    assert "adapter knows 4 of 4 classes of suite tiny-mnist: ['" in out

    result = evaluate_adapter(adapter, tiny_suite, quick=True, verbose=False)
    assert capsys.readouterr().out == ""
    assert sorted(result.match.known) == MNIST and len(result.accuracy) == 2
    assert result.overall > 0.25  # NCM on frozen features beats chance on 4 digits


def test_evaluate_counts_then_refuses_classes_it_never_learned(adapter, tiny_suite, tmp_path, capsys):
    six = _suite(tiny_suite, tmp_path, name="tiny-mnist-6", max_classes=6, n_tasks=3)
    assert main(["evaluate", "--adapter", adapter, "--suite", six, "--quick"]) == 2
    captured = capsys.readouterr()
    assert "adapter knows 4 of 6 classes of suite tiny-mnist-6" in captured.out
    assert "never learned" in captured.err


def test_evaluate_refuses_a_suite_sharing_no_class_name(adapter, tiny_suite, tmp_path, capsys):
    fashion = _suite(tiny_suite, tmp_path, name="tiny-fashion", dataset="fashion_mnist")
    assert main(["evaluate", "--adapter", adapter, "--suite", fashion, "--quick"]) == 2
    err = capsys.readouterr().err
    assert "suite 'tiny-fashion' shares no class name with this adapter" in err
    assert "the adapter's classes are [" in err and "'T-shirt/top'" in err
    with pytest.raises(ValueError, match=r"shares no class name .* the suite's are \[.*'Trouser'"):
        evaluate_adapter(adapter, fashion, quick=True)
