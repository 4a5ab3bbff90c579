"""How many intra-op threads torch uses: one per core of this process's share of the machine.

Torch's default is one thread per core of the machine, whatever else runs on it. Its
parallel regions end in a barrier, so when another job holds one of those cores every step
waits for the descheduled thread, which on a small machine shared with other jobs can cost most
of the speed (results/speed/README.md has the measurement).

The default here (:func:`default_threads`) is the cores this process may run on
(``os.sched_getaffinity``) divided among the processes of this machine (Accelerate's and
torchrun's ``LOCAL_WORLD_SIZE``, else ``WORLD_SIZE``), less the cores other work keeps busy by
the 1-minute load average, and at least 1. A user's own choice always wins: ``OMP_NUM_THREADS``
(or ``MKL_NUM_THREADS``) in the environment, or a ``torch.set_num_threads`` call made before
(torch then reports a count other than its own default). :func:`apply_default_threads` applies
it once per process: the trainer calls it when it starts, the command line at its start.
"""

from __future__ import annotations

import math
import os

import torch

#: Environment variables that set the thread count explicitly.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

_applied: dict[str, object] | None = None


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), not the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def local_processes() -> int:
    """Processes of this job on this machine, from the launcher's environment (1 when not launched)."""
    for name in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def busy_cores() -> int:
    """Cores other work keeps busy: the 1-minute load average, rounded (0 where unknown)."""
    try:
        return int(math.floor(os.getloadavg()[0] + 0.5))
    except (OSError, AttributeError):
        return 0


def default_threads(load_aware: bool = True) -> tuple[int, str]:
    """(threads, why): this process's share of the usable cores, less the busy ones, at least 1."""
    cores, procs = usable_cores(), local_processes()
    share = max(1, cores // procs)
    why = f"{cores} usable core(s) / {procs} local process(es)"
    if load_aware:
        busy = busy_cores()
        free = max(1, cores - busy) // procs
        if busy and free < share:
            share, why = max(1, free), f"{why}, {busy} busy by the load average"
    return share, why


def user_threads() -> tuple[int, str] | None:
    """(threads, where set) when the user chose the count, else None."""
    for name in THREAD_ENV:
        value = os.environ.get(name, "").strip()
        if value:
            return torch.get_num_threads(), f"{name}={value}"
    if torch.get_num_threads() != _torch_default():
        return torch.get_num_threads(), "torch.set_num_threads"
    return None


def _torch_default() -> int:
    # torch starts with one intra-op thread per core it may run on (OpenMP's default).
    return usable_cores()


def apply_default_threads(load_aware: bool = True) -> dict[str, object]:
    """Set torch's intra-op threads to :func:`default_threads`, unless the user chose a count; once
    per process (later calls return the first decision). Returns ``{"threads", "reason"}``."""
    global _applied
    if _applied is not None:
        return dict(_applied)
    chosen = user_threads()
    if chosen is not None:
        threads, reason = chosen[0], f"set by the user ({chosen[1]})"
    else:
        threads, reason = default_threads(load_aware)
        torch.set_num_threads(threads)
        reason = f"default: {reason}"
    _applied = {"threads": threads, "reason": reason}
    return dict(_applied)


def reset() -> None:
    """Forget the decision (tests)."""
    global _applied
    _applied = None
