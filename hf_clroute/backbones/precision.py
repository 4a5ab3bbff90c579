"""Mixed precision: when to run a backbone under bf16 autocast, and the autocast itself.

One setting, ``auto`` / ``bf16`` / ``fp32``. Where it comes from, first found wins:

1. an explicit argument (``TrainingConfig.precision``, a suite's ``training.precision``,
   the ``precision=`` of :func:`resolve_for`);
2. the environment variable ``HF_CLROUTE_PRECISION``;
3. the default, ``auto``.

``bf16`` runs every phase under ``torch.autocast(device, dtype=torch.bfloat16)``; ``fp32``
never does. ``auto`` runs a phase (``train``: the training step, forward and backward;
``features``: frozen-feature extraction; ``eval``: scoring a test split) in bf16 only when
the device has bf16 units (a CPU with AVX-512 BF16 or AMX, checked at run time) and the
workload is in :data:`MEASURED` (read from ``bf16_speedups.json``) as faster in bf16 on such a
CPU, with a paired fp32-vs-bf16 check of A_T on its suites within the paired noise. Anything not
measured stays fp32: bf16 autocast is not a free win (it can make training slower).
On CUDA, ``auto`` stays fp32 (nothing measured on a GPU here); ``bf16`` there is autocast
as Accelerate's ``mixed_precision="bf16"`` does it.

Autocast lowers matmuls and convolutions only: losses (cross-entropy, MSE, KL) stay float32
under it, and float64 tensors are never cast, so the statistics heads' sums and solves stay
float64. Under ``accelerate launch --mixed_precision bf16|fp16`` the launcher's choice wins
for training (Accelerate wraps the prepared model itself).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ContextManager

import torch

from hf_clroute.errors import UserInputError

SETTINGS = ("auto", "bf16", "fp32")
PHASES = ("train", "features", "eval")
ENV_VAR = "HF_CLROUTE_PRECISION"
DEFAULT = "auto"

#: The measured table :data:`MEASURED` is read from (it says on which CPU, when and by which command).
MEASURED_FILE = Path(__file__).with_name("bf16_speedups.json")


def _load_measured(path: Path) -> tuple[str, tuple[dict[str, Any], ...]]:
    """(the command that measured the table, its rows), batch sizes as ints and suites as tuples."""
    table = json.loads(path.read_text())
    rows = tuple({**row, "speedup": {int(b): v for b, v in row["speedup"].items()}, "checked": tuple(row["checked"])}
                 for row in table["rows"])
    return table["measured_by"], rows


#: bf16-autocast speed-ups over fp32, one row per backbone (``model_type``, hidden size) and phase, by batch size,
#: measured on a CPU with bf16 units by ``MEASURED_BY``. Inference rows serve both the ``features`` and the
#: ``eval`` phase (the same backbone forward).
#: ``min_batch``: the smallest measured batch from which bf16 was faster at every larger measured batch
#: (None: not faster at the largest); smaller batches were not measured faster and stay fp32.
#: ``checked``: the suites whose paired A_T check found A_T within the paired noise; auto picks bf16 only where
#: every suite checked on that backbone is listed (none listed: fp32).
MEASURED_BY, MEASURED = _load_measured(MEASURED_FILE)


def check_setting(value: Any, field: str = "precision") -> str:
    """``value`` if it is one of :data:`SETTINGS`, else a :class:`UserInputError` naming ``field``."""
    if value not in SETTINGS:
        raise UserInputError(f"{field} must be one of {', '.join(map(repr, SETTINGS))}, got {value!r}")
    return value


def setting_from(explicit: str | None = None) -> tuple[str, str]:
    """(setting, where it came from): ``explicit`` > ``$HF_CLROUTE_PRECISION`` > ``auto``."""
    if explicit is not None:
        return check_setting(explicit), "argument"
    env = os.environ.get(ENV_VAR)
    if env:
        return check_setting(env.strip().lower(), f"environment variable {ENV_VAR}"), ENV_VAR
    return DEFAULT, "default"


@functools.lru_cache(maxsize=None)
def bf16_hardware(device_type: str = "cpu") -> tuple[bool, str]:
    """(whether ``device_type`` has bf16 arithmetic units, what says so), detected at run time."""
    if device_type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, "torch.cuda.is_bf16_supported()" if ok else "a CUDA device without bf16"
    if device_type != "cpu":
        return False, f"no bf16 rule for device {device_type!r}"
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:  # not Linux: ask oneDNN, which checks the same CPUID bits
        pass
    found = sorted(flags & {"avx512_bf16", "amx_bf16"})
    if found:
        return True, "CPU flags " + "+".join(found)
    if not flags and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return True, "oneDNN reports bf16 support"
    return False, "no avx512_bf16/amx_bf16 CPU flag"


@dataclass(frozen=True)
class Choice:
    """What one phase runs in, and why (recorded with the run's results)."""

    setting: str
    phase: str
    device_type: str
    dtype: torch.dtype | None  # None: plain float32, no autocast
    reason: str

    @property
    def name(self) -> str:
        return "bf16" if self.dtype is torch.bfloat16 else "fp32"

    def autocast(self) -> ContextManager:
        """``torch.autocast`` in this choice's dtype; a no-op for fp32."""
        return autocast(self.dtype, self.device_type)

    def to_dict(self) -> dict[str, str]:
        return {**asdict(self), "dtype": self.name}

    def describe(self) -> str:
        said = self.reason if self.reason.startswith(f"{self.setting}:") else f"{self.setting}: {self.reason}"
        return f"precision {self.phase}: {self.name} ({said})"


def autocast(dtype: torch.dtype | None, device_type: str = "cpu") -> ContextManager:
    """``torch.autocast(device_type, dtype=dtype)``, or a no-op when ``dtype`` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype)


def measured_row(model_type: str, hidden_size: int, phase: str) -> dict[str, Any] | None:
    return next((row for row in MEASURED if row["model_type"] == model_type
                 and row["hidden_size"] == hidden_size and row["phase"] == phase), None)


def resolve(
    setting: str | None, *, model_type: str, hidden_size: int, phase: str, batch_size: int,
    device_type: str = "cpu",
) -> Choice:
    """The dtype a phase runs in for a backbone (``model_type``, ``hidden_size``) at ``batch_size``."""
    if phase not in PHASES:
        raise UserInputError(f"phase must be one of {', '.join(map(repr, PHASES))}, got {phase!r}")
    setting, source = setting_from(setting)
    chose = functools.partial(Choice, setting, phase, device_type)
    if setting == "fp32":
        return chose(None, f"fp32 set ({source})")
    hardware, evidence = bf16_hardware(device_type)
    if setting == "bf16":
        note = evidence if hardware else f"{evidence}: emulated, expect it slower than fp32"
        return chose(torch.bfloat16, f"bf16 set ({source}); {note}")
    if not hardware:
        return chose(None, f"auto: {evidence}")
    if device_type != "cpu":
        return chose(None, f"auto: bf16 not measured on {device_type}; set precision='bf16' to use it")
    row = measured_row(model_type, hidden_size, phase)
    what = f"{model_type} width {hidden_size}, {phase}"
    if row is None:
        return chose(None, f"auto: bf16 not measured for {what}")
    if row["min_batch"] is None or batch_size < row["min_batch"]:
        return chose(None, f"auto: bf16 not measured faster for {what} at batch {batch_size} ({_speedups(row)})")
    if not row["checked"]:
        return chose(None, f"auto: {what} faster in bf16 ({_speedups(row)}) but no paired A_T check yet")
    return chose(torch.bfloat16, f"auto: {evidence}; {what} measured faster in bf16 ({_speedups(row)}), "
                                 f"A_T checked on {', '.join(row['checked'])}")


def _speedups(row: dict[str, Any]) -> str:
    return ", ".join(f"{v:.2f}x at batch {b}" for b, v in sorted(row["speedup"].items()) if v is not None) or "—"


def resolve_for(model: torch.nn.Module, phase: str, batch_size: int, setting: str | None = None,
                device: torch.device | str | None = None) -> Choice:
    """:func:`resolve` for a backbone or a model holding one (a ``CLModel``: its ``backbone``)."""
    from hf_clroute.backbones.catalog import get_backbone_spec, get_base_model

    backbone = getattr(model, "backbone", model)
    try:
        spec = get_backbone_spec(get_base_model(backbone))
        model_type, hidden = spec.model_type, spec.hidden_size(get_base_model(backbone))
    except (ValueError, AttributeError):  # not a known backbone (a bare test module): nothing measured
        model_type, hidden = type(backbone).__name__, 0
    if device is None:
        device = next((p.device for p in backbone.parameters()), torch.device("cpu"))
    return resolve(setting, model_type=model_type, hidden_size=hidden, phase=phase,
                   batch_size=batch_size, device_type=torch.device(device).type)
