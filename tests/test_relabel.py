"""`hf-clroute merge --rename`: a committed row is relabelled only when it provably ran what the new
name means today (issue 32 changed what `mars` trains; its earlier rows are `mars-paper` measurements)."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from hf_clroute.bench.harness.relabel import parse_renames, rename_rows
from hf_clroute.bench.harness.settings import resolve_run
from hf_clroute.bench.harness.suites import SuiteConfig
from hf_clroute.errors import UserInputError

ADDED_BY_ISSUE_32 = ("full_output_consistency", "anchor_memory", "reference_window", "stage2_ratio")


def recorded_row(suite: SuiteConfig, method: str, seed: int = 3) -> dict:
    """A row as a bench run before issue 32 recorded it: the resolved config without the fields added since."""
    config = dataclasses.asdict(resolve_run(suite, method, seed).adapter_config)
    for name in ADDED_BY_ISSUE_32:
        config.pop(name)
    return {"per_seed": [{"seed": s, "A_T": 0.3} for s in range(5)], "selection": {"pick": {}},
            "settings": {"adapter_config": config, "training": {"seed": seed}}}


def test_a_row_is_relabelled_only_to_the_name_that_means_what_it_ran():
    suite = SuiteConfig.load("split-mnist")
    old = recorded_row(suite, "mars-paper")  # the first reading, then called mars
    results = {"methods": {"mars": copy.deepcopy(old), "ncm": {"per_seed": []}}}
    rename_rows(results, {"mars": "mars-paper"}, suite)
    assert set(results["methods"]) == {"mars-paper", "ncm"}
    row = results["methods"]["mars-paper"]
    assert row["renamed_from"] == "mars" and row["per_seed"] == old["per_seed"] and row["settings"] == old["settings"]

    # today's mars sets the added options away from the defaults that keep the earlier behaviour
    with pytest.raises(UserInputError, match=r"anchor_memory, full_output_consistency did not exist when the row ran"):
        rename_rows({"methods": {"old": copy.deepcopy(old)}}, {"old": "mars"}, suite)
    # a recorded value that differs is named, with both sides
    with pytest.raises(UserInputError, match=r"use_sgse ran True, mars-no-sgse has False"):
        rename_rows({"methods": {"mars": copy.deepcopy(old)}}, {"mars": "mars-no-sgse"}, suite)
    with pytest.raises(UserInputError, match=r"no row 'absent'"):
        rename_rows({"methods": {"mars": old}}, {"absent": "mars-paper"}, suite)
    with pytest.raises(UserInputError, match=r"already have a row 'ncm'"):
        rename_rows({"methods": {"mars": old, "ncm": {}}}, {"mars": "ncm"}, suite)


def test_rename_pairs_are_parsed_and_checked():
    assert parse_renames(["mars=mars-paper", "a=b"]) == {"mars": "mars-paper", "a": "b"}
    for bad in ("mars", "mars=", "=x", "a=a"):
        with pytest.raises(UserInputError, match="OLD=NEW"):
            parse_renames([bad])
