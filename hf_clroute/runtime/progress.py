"""Progress bars on a terminal only; one plain line per step of work everywhere else.

A tqdm bar redraws itself with carriage returns. On a terminal that is one line
that moves; written to a file or a pipe (CI, ``nohup``, a job scheduler) every
redraw stays, and a log fills with hundreds of half-lines. So bars are drawn only
when stderr is a terminal (or in a notebook, where tqdm draws a widget), and the
trainer writes one line per task instead (:func:`log_line`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def bars_enabled(progress: bool = True) -> bool:
    """Whether to draw progress bars: asked for (``progress``) and stderr shows them as bars."""
    if not progress:
        return False
    if tqdm.__module__ == "tqdm.notebook":  # a Jupyter kernel: a widget, not carriage returns
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def progress_bar(iterable: Iterable[T], *, progress: bool = True, **tqdm_kwargs: Any) -> Iterable[T]:
    """``iterable`` under a tqdm bar when :func:`bars_enabled`, else a tqdm that draws nothing
    (it still takes ``set_postfix`` and friends, so callers need no second code path)."""
    return tqdm(iterable, disable=not bars_enabled(progress), **tqdm_kwargs)


def log_line(text: str) -> None:
    """One progress line on stderr (beside where the bars would be), flushed so a log file has it at once."""
    print(text, file=sys.stderr, flush=True)


def task_line(task_id: int, name: str, seconds: float, mean_loss: float | None, row: list[float],
              perplexity: bool = False) -> str:
    """The line the trainer writes at a task's end: its time, mean training loss and the boundary row
    over the tasks seen so far (accuracy in %, or perplexity for a language model)."""
    seen = row[: task_id + 1]
    loss = "no training loss" if mean_loss is None else f"mean loss {mean_loss:.4f}"
    if perplexity:
        scores = f"perplexity on seen tasks {sum(seen) / len(seen):.2f} [{', '.join(f'{x:.2f}' for x in seen)}]"
    else:
        scores = (f"accuracy on seen tasks {100 * sum(seen) / len(seen):.1f}% "
                  f"[{', '.join(f'{100 * x:.1f}' for x in seen)}]")
    return f"task {task_id} ({name}): {seconds:.1f} s, {loss}, {scores}"


def quiet_library_bars() -> None:
    """Turn off the bars huggingface_hub, transformers and datasets draw (downloads, loading weights,
    ``map``) when stderr is not a terminal, through their environment switches: the command line calls
    this before importing them, and processes it starts inherit it. A switch the user set is kept."""
    if bars_enabled():
        return
    for switch in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        os.environ.setdefault(switch, "1")
