"""`hf-clroute push-results`: a benchmark run's evaluation as a Hub dataset repo, in one commit.

The repo holds the run's ``results.json`` and ``results.md``, its plots, its ``selection.json`` when it has
one, and :data:`TABLE_FILE`: one row per (method, seed) with every scalar the run recorded for that seed
(A_T, F_T, ...), the pick it ran with (``selection``, JSON) and each matrix (``accuracy_matrix``) as a list
column. The dataset card (README.md) points ``datasets.load_dataset(repo_id)`` at that table (its
``configs:`` header) and says what the run was: suite, seeds, selection, commands, library versions.

Everything is checked before anything is sent (a folder that is not a run, no or a broken results.json,
no per-seed rows, a bad repo id), staged in a temporary directory and uploaded as one commit: a failed push
leaves the repo at its previous commit (a repo it created holds none of the run's files) and the run's
folder untouched. A later push of the same repo replaces the files a push writes, in one commit too.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hf_clroute.core.model_card import (
    EVAL_METRICS,
    benchmark_dataset,
    build_commit,
    library_versions,
    package_license,
)
from hf_clroute.errors import UserInputError
from hf_clroute.hub.io import atomic_write_text, push_folder, read_json

#: the per-seed table inside the dataset repo (what ``load_dataset`` loads)
TABLE_FILE = "data/per_seed.parquet"
#: the split ``load_dataset(repo_id)`` names it
SPLIT = "train"
#: what a push writes, and so what a later push of the same repo replaces (``.gitattributes`` always stays)
MANAGED = ("README.md", "results.json", "results.md", "*selection.json", "*.png", "plots/*", "data/*")
_FIRST = ("method", "seed", *EVAL_METRICS)


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` when the Hub accepts it as a dataset repo id (``name`` or ``namespace/name``), else a
    one-line error naming ``--repo-id``."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(repo_id, str) or not repo_id.strip():
        raise UserInputError("--repo-id is empty; give the dataset repo to push to, e.g. me/split-mnist-results")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise UserInputError(f"--repo-id {repo_id!r} is not a Hub repo id: {str(err).splitlines()[0]}") from err
    return repo_id


def read_run(run_dir: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """The run's folder and its results.json, or a one-line error saying what is missing."""
    path = Path(run_dir).expanduser()
    if not path.exists():
        raise UserInputError(f"no run directory at {run_dir}")
    if not path.is_dir():
        raise UserInputError(f"{run_dir} is a file; expected an `hf-clroute bench --out` run directory")
    results_file = path / "results.json"
    if not results_file.is_file():
        raise UserInputError(f"{run_dir} is not a bench run directory (no results.json)")
    results = read_json(results_file, "results file")
    methods = results.get("methods")
    if not isinstance(methods, dict) or not methods or not all(isinstance(row, dict) for row in methods.values()):
        raise UserInputError(f"{results_file} has no 'methods' table of rows; is it a bench run's results.json?")
    return path, results


def seed_rows(results: dict[str, Any], source: str = "results.json") -> list[dict[str, Any]]:
    """One dict per (method, seed) of a run: the method, the seed, every scalar of that seed's row, its
    ``selection`` (JSON text) and every ``*_matrix`` list; other nested values stay in results.json only."""
    rows = []
    for method, row in results["methods"].items():
        for seed_row in row.get("per_seed") or []:
            out: dict[str, Any] = {"method": method, "seed": seed_row.get("seed")}
            for key, value in seed_row.items():
                if key == "seed":
                    continue
                if key == "selection":
                    out[key] = None if value is None else json.dumps(value, sort_keys=True)
                elif key.endswith("_matrix") and isinstance(value, list):
                    out[key] = value
                elif value is None or isinstance(value, (bool, int, float, str)):
                    out[key] = value
            rows.append(out)
    if not rows:
        raise UserInputError(f"{source} records no per-seed rows ('per_seed' of each method): nothing to tabulate")
    return rows


def _matrix_column(values: list[Any]) -> Any:
    import pyarrow as pa

    try:
        cells = [None if v is None else [[None if x is None else float(x) for x in row] for row in v] for v in values]
    except (TypeError, ValueError):  # not a list of lists of numbers: kept whole, as JSON text
        return pa.array([None if v is None else json.dumps(v) for v in values], pa.string())
    return pa.array(cells, pa.list_(pa.list_(pa.float64())))


def _scalar_column(values: list[Any]) -> Any:
    """One Arrow type per column: bool, int64, float64 (an int among floats becomes a float) or string;
    values of mixed kinds become JSON text, a column of nulls float64."""
    import pyarrow as pa

    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pa.array(values, pa.bool_())
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        if present and all(isinstance(v, int) for v in present):
            return pa.array(values, pa.int64())
        return pa.array([None if v is None else float(v) for v in values], pa.float64())
    if all(isinstance(v, str) for v in present):
        return pa.array(values, pa.string())
    return pa.array([None if v is None else json.dumps(v) for v in values], pa.string())


def seed_table(rows: list[dict[str, Any]]) -> Any:
    """The per-seed rows as one Arrow table: method, seed and the card's metrics first, the rest by name,
    matrices last."""
    import pyarrow as pa

    keys = list(dict.fromkeys(k for row in rows for k in row))
    matrices = sorted(k for k in keys if k.endswith("_matrix"))
    order = [k for k in _FIRST if k in keys] + sorted(k for k in keys if k not in _FIRST and k not in matrices)
    columns = {k: _scalar_column([row.get(k) for row in rows]) for k in order}
    columns.update({k: _matrix_column([row.get(k) for row in rows]) for k in matrices})
    return pa.table(columns)


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text.replace("|", "\\|").replace("\n", " ")


def selection_markdown(results: dict[str, Any]) -> str:
    """Each method's pick and where it was chosen: its seeds' recorded selection, else the run's."""
    lines = ["| method | pick | chosen on |", "|---|---|---|"]
    for method, row in results["methods"].items():
        seeds = [r["selection"] for r in row.get("per_seed") or [] if isinstance(r.get("selection"), dict)]
        record = seeds[0] if seeds else row.get("selection")
        record = record if isinstance(record, dict) else {}
        pick = record.get("pick")
        shown = "not recorded" if pick is None else "the settings files' values" if pick == {} else _cell(pick)
        chosen = record.get("chosen_on") or ("the run's selection.json (hf-clroute tune)" if record else "")
        lines.append(f"| {method} | {shown} | {_cell(chosen)} |")
    return "\n".join(lines)


def _suite_markdown(results: dict[str, Any]) -> str:
    config = results.get("config") or {}
    dataset = config.get("dataset")
    hub_id = benchmark_dataset(results)
    facts = [
        ("suite", results.get("suite")),
        ("runner", results.get("kind")),
        ("what it is", config.get("description")),
        ("dataset", f"`{dataset}`" + (f" ({hub_id})" if hub_id else "") if dataset else None),
        ("tasks", config.get("n_tasks")),
        ("scenario", f"{config['scenario']}-incremental" if config.get("scenario") else None),
        ("backbone", f"`{config['backbone']}`" if config.get("backbone") else None),
        ("training", f"`{json.dumps(config['training'], sort_keys=True)}`" if config.get("training") else None),
        ("seeds", ", ".join(map(str, results.get("seeds") or [])) or None),
    ]
    return "\n".join(f"- **{name}:** {value}" for name, value in facts if value not in (None, ""))


def _columns_markdown(table: Any) -> str:
    return "\n".join(f"| `{field.name}` | {field.type} |" for field in table.schema)


def dataset_card(results: dict[str, Any], repo_id: str, table: Any, results_md: str | None) -> str:
    """The dataset repo's README.md: the ``configs:`` header ``load_dataset`` reads, then what the run was."""
    from huggingface_hub import DatasetCardData

    suite = str(results.get("suite") or "run")
    data = DatasetCardData(
        pretty_name=f"hf_clroute results: {suite}",
        license=package_license(),
        tags=list(dict.fromkeys(t for t in ("continual-learning", "hf_clroute", "benchmark-results", suite,
                                             results.get("kind")) if t)),
        size_categories=["n<1K" if table.num_rows < 1_000 else "1K<n<10K" if table.num_rows < 10_000 else "10K<n<100K"],
        configs=[{"config_name": "default", "data_files": [{"split": SPLIT, "path": TABLE_FILE}]}],
    )
    commands = "\n".join(results.get("commands") or []) or "(no command recorded)"
    commit = build_commit()
    versions = ", ".join(f"{k} {v}" for k, v in library_versions().items())
    table_md = ("\n".join(("#" + line) if line.startswith("#") else line for line in results_md.splitlines())
                if results_md else "The run wrote no results.md.")
    return f"""---
{data.to_yaml()}
---

# hf_clroute results: {suite}

The evaluation of one hf_clroute benchmark run ({table.num_rows} rows: every method on every seed). The
figures are self-reported by hf_clroute, measured by the run itself; no one else has verified them.

```python
from datasets import load_dataset

rows = load_dataset("{repo_id}", split="{SPLIT}")  # one row per (method, seed)
```

## Files

- `{TABLE_FILE}`: one row per (method, seed); accuracies are fractions (1 = 100%), each `*_matrix` is
  the seed's matrix (row i: after training on task i, column j: accuracy on task j), `selection` the pick
  it ran with (JSON). Nested records (curves, precision, threads) are in results.json only.
- `results.json`: everything the run recorded; `results.md`: its table (below); `plots/`: its plots.

| column | type |
|---|---|
{_columns_markdown(table)}

## The run

{_suite_markdown(results)}

## Selection

Hyper-parameters each method ran with, and where they were chosen (never on the test split):

{selection_markdown(results)}

## Commands

```bash
{commands}
```

## Results

{table_md}

## Library versions

Recorded when this repo was pushed (the run's own versions, where it recorded them, are in results.json).

- **Built from:** {f"hf_clroute commit `{commit}`" if commit else "an installed hf_clroute (no git checkout)"}
- **Library versions:** {versions}
"""


def run_files(run_dir: Path) -> list[str]:
    """The run's files a push carries, relative to ``run_dir``: results, selections and plots (no adapters,
    no checkpoints: those are models, pushed with ``hf-clroute push``)."""
    names = ["results.json", "results.md", *sorted(p.name for p in run_dir.glob("*selection.json"))]
    names += sorted(p.name for p in run_dir.glob("*.png"))
    if (run_dir / "plots").is_dir():
        names += sorted(p.relative_to(run_dir).as_posix() for p in (run_dir / "plots").rglob("*.png"))
    return [n for n in dict.fromkeys(names) if (run_dir / n).is_file()]


def stage_run(run_dir: Path, results: dict[str, Any], repo_id: str, stage: Path) -> list[str]:
    """Write everything the dataset repo will hold into ``stage``; returns its files (relative paths)."""
    import pyarrow.parquet as pq

    for name in run_files(run_dir):
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(run_dir / name, stage / name)
    table = seed_table(seed_rows(results, str(run_dir / "results.json")))
    (stage / TABLE_FILE).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, stage / TABLE_FILE)
    results_md = (run_dir / "results.md").read_text() if (run_dir / "results.md").is_file() else None
    atomic_write_text(stage / "README.md", dataset_card(results, repo_id, table, results_md))
    return sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file())


def push_dataset_folder(folder: str | os.PathLike, repo_id: str, *, what: str,
                        commit_message: str = "Upload hf_clroute results", **kwargs: Any) -> str:
    """Upload ``folder`` to the dataset repo ``repo_id`` in one commit with :func:`~hf_clroute.hub.io.push_folder`,
    replacing the files of :data:`MANAGED` an earlier push left; ``kwargs``: ``token``, ``private``,
    ``revision``, ``create_pr``, ``timeout``."""
    return push_folder(folder, repo_id, what=what, commit_message=commit_message, repo_type="dataset",
                       delete_patterns=list(MANAGED), **kwargs)


def push_results(run_dir: str | os.PathLike, repo_id: str, **kwargs: Any) -> str:
    """Push a bench run's evaluation to the dataset repo ``repo_id`` in one commit; returns the commit URL.

    ``run_dir``: an ``hf-clroute bench --out`` (or ``merge --out``) folder. Every check runs before the
    Hub is called; ``kwargs`` go to :func:`push_dataset_folder` (``token``, ``private``, ``revision``,
    ``create_pr``, ``timeout``)."""
    repo_id = check_repo_id(repo_id)
    path, results = read_run(run_dir)
    seed_rows(results, str(path / "results.json"))  # refuses a run without per-seed rows before the stage
    with tempfile.TemporaryDirectory(prefix="hf_clroute_push_results_") as tmp:
        stage_run(path, results, repo_id, Path(tmp))
        return push_dataset_folder(tmp, repo_id, what=f"results of {run_dir}", **kwargs)
