"""Relabel committed rows whose method name has since changed meaning (``hf-clroute merge --rename``).

A method's name can come to mean other settings: ``mars`` once trained the first literal reading of the
paper, which lives on as ``mars-paper``. Rows run before that are measurements of ``mars-paper``, and a table
that still calls them ``mars`` misleads. A rename is refused unless it is provably a relabelling:

* every adapter-config field the row recorded (``settings.adapter_config``; the run's own identity fields
  aside) equals what the new name resolves to today for the row's suite, the recorded seed and its pick; and
* every field the new name has that the row did not record (a field added after the run) is at its
  default: a new option's default keeps the behaviour the code had before it (the rule every config
  follows; ``MarsConfig``'s later options default to the first reading), so the row ran that.

The row keeps its recorded settings, gains ``renamed_from``, and the merge records the command.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hf_clroute.bench.harness.settings import resolve_run
from hf_clroute.errors import UserInputError

# Fields that name the run, not the method: its classes, labels, history and backbone identity.
IDENTITY_FIELDS = frozenset({
    "class_order", "id2label", "label2id", "training_history", "base_model_fingerprint", "base_model_name_or_path",
    "base_model_revision", "adaptation_record", "method",
})


def parse_renames(pairs: list[str]) -> dict[str, str]:
    """``["old=new", ...]`` -> ``{old: new}``, each side a non-empty name."""
    renames: dict[str, str] = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new or old == new:
            raise UserInputError(f"--rename takes OLD=NEW pairs of two different method names, got {pair!r}")
        renames[old] = new
    return renames


def check_relabel(suite: Any, old: str, new: str, row: dict[str, Any]) -> None:
    """Raise :class:`UserInputError` unless ``row`` (recorded as ``old``) ran what ``new`` means today."""
    recorded = (row.get("settings") or {}).get("adapter_config")
    if not recorded:
        raise UserInputError(f"--rename {old}={new}: the row records no settings, so the rename cannot be checked")
    seed = (row["settings"].get("training") or {}).get("seed")  # the seed the record was resolved for
    if seed is None:
        seed = min(r["seed"] for r in row["per_seed"])
    pick = (row.get("selection") or {}).get("pick") or {}
    settings = resolve_run(suite, new, seed, selected=pick)
    today = dataclasses.asdict(settings.adapter_config)
    differ = {k: (recorded[k], today.get(k, "<absent>")) for k in recorded
              if k not in IDENTITY_FIELDS and recorded[k] != today.get(k, "<absent>")}
    if differ:
        raise UserInputError(f"--rename {old}={new}: the row ran other settings than {new!r} resolves to: "
                             + ", ".join(f"{k} ran {a!r}, {new} has {b!r}" for k, (a, b) in sorted(differ.items())))
    defaults = {f.name: f.default for f in dataclasses.fields(settings.adapter_config)
                if f.default is not dataclasses.MISSING}
    added = sorted(k for k in today if k not in recorded and k not in IDENTITY_FIELDS
                   and (k not in defaults or today[k] != defaults[k]))
    if added:
        raise UserInputError(f"--rename {old}={new}: {', '.join(added)} did not exist when the row ran, and "
                             f"{new!r} sets them away from the default that keeps the behaviour before them")


def rename_rows(results: dict[str, Any], renames: dict[str, str], suite: Any) -> None:
    """Rename ``results["methods"]`` rows in place, each checked by :func:`check_relabel`."""
    methods = results["methods"]
    for old, new in renames.items():
        if old not in methods:
            raise UserInputError(f"--rename {old}={new}: no row {old!r} in these results (rows: {sorted(methods)})")
        if new in methods:
            raise UserInputError(f"--rename {old}={new}: these results already have a row {new!r}")
        check_relabel(suite, old, new, methods[old])
    for old, new in renames.items():
        methods[new] = {**methods.pop(old), "renamed_from": old}
