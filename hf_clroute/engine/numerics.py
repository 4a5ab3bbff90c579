"""The loop's numerics: each phase's precision, and the guard that stops a run going non-finite.

A run that goes NaN must not end as a finished adapter full of NaNs (nor a checkpoint a resume
would continue from). The trainer checks, before every optimiser step, the loss, the gradients'
norm (computed by the clipping anyway) and the learning rates, in one device sync; and at every
task end and before every checkpoint, every trained parameter and float buffer (a statistics
head's sums, a replay memory). Without clipping a NaN gradient is caught at the task's end.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from accelerate import Accelerator

from hf_clroute.backbones.precision import PHASES, Choice, resolve_for
from hf_clroute.errors import NonFiniteTrainingError

ADVICE = ("nothing was saved as a finished adapter. Check the inputs for NaN, lower training.learning_rate, "
          "set training.max_grad_norm, or use training.precision='fp32'")


def phase_choices(model: torch.nn.Module, config: Any, accelerator: Accelerator) -> dict[str, Choice]:
    """The dtype of each phase (:mod:`hf_clroute.backbones.precision`) for ``config`` (a ``TrainingConfig``). Under
    ``accelerate launch --mixed_precision bf16|fp16`` Accelerate's autocast on the prepared model decides."""
    device = accelerator.device
    launched = str(getattr(accelerator, "mixed_precision", "no"))
    if launched != "no":
        return {phase: Choice("accelerate", phase, device.type, None,
                              f"accelerate launch --mixed_precision {launched} decides") for phase in PHASES}
    batch = {"train": max(1, config.batch_size // accelerator.num_processes),
             "features": config.eval_batch_size, "eval": config.eval_batch_size}
    return {phase: resolve_for(model, phase, batch[phase], config.precision, device) for phase in PHASES}


def describe(choices: dict[str, Choice], threads: dict[str, Any]) -> str:
    """The one line a run prints about its precision and threads (the reasons are in its records)."""
    settings = "/".join(dict.fromkeys(c.setting for c in choices.values()))
    chosen = ", ".join(f"{phase} {c.name if c.setting != 'accelerate' else 'accelerate'}"
                       for phase, c in choices.items())
    return f"precision ({settings}): {chosen}; torch threads {threads['threads']} ({threads['reason']})"


def check_step(loss: torch.Tensor, grad_norm: Any, optimizer: torch.optim.Optimizer, where: str) -> None:
    """Raise :class:`NonFiniteTrainingError` when the loss, the gradient norm (None: not clipped) or a
    learning rate is NaN or infinite, before the step would write it into the parameters."""
    values = [loss.detach().float().reshape(())]
    if grad_norm is not None:
        values.append(torch.as_tensor(grad_norm).detach().float().reshape(()).to(values[0].device))
    values = torch.stack(values).cpu()  # the one sync
    if not bool(torch.isfinite(values).all()):
        name = "loss" if not math.isfinite(values[0]) else "gradient norm (before clipping)"
        value = values[0] if name == "loss" else values[1]
        raise NonFiniteTrainingError(f"{where}: the {name} is {value.item()}; {ADVICE}.")
    for i, group in enumerate(optimizer.param_groups):
        if not math.isfinite(group["lr"]):
            raise NonFiniteTrainingError(
                f"{where}: the learning rate of parameter group {i} is {group['lr']}; {ADVICE}.")


def check_finite_state(model: torch.nn.Module, where: str) -> None:
    """Raise :class:`NonFiniteTrainingError` naming the first trained parameter or float buffer holding NaN/inf."""
    tensors = itertools.chain(
        (("parameter", n, p) for n, p in model.named_parameters() if p.requires_grad),
        (("buffer", n, b) for n, b in model.named_buffers() if b.is_floating_point()))
    for kind, name, tensor in tensors:
        if tensor.numel() and not bool(torch.isfinite(tensor).all()):
            raise NonFiniteTrainingError(f"{where}: {kind} {name!r} holds NaN or inf values; {ADVICE}.")
