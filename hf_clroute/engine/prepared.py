"""The loop's dealings with Accelerate's prepared objects, shared by the stream and the adaptation phase.

Accelerate wraps the optimizer and offers its own gradient clipping; with no fp16 scaler, FSDP,
DeepSpeed or XLA in play both only forward to torch, at a cost per step. These helpers call torch
directly in that case (the same numbers), and drop a finished phase's prepared wrappers without a
full garbage collection.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedType


def optimizer_to_step(accelerator: Accelerator, optimizer: Any) -> Any:
    """The optimizer the loop calls ``step()`` and ``zero_grad()`` on: the prepared one, or the torch
    optimizer inside it when Accelerate's wrapper would only forward the calls.

    ``AcceleratedOptimizer`` adds a gradient-accumulation check, the fp16 loss scaler, XLA's
    gradient reduction and LOMO's no-op step around the torch optimizer. With none of them in play
    it forwards the call, after two package look-ups (``importlib`` ``find_spec``) and a signature
    inspection per step, a visible share of a small model's step on a CPU. The same torch ``step()`` runs
    either way, so the numbers are the same; subclasses (DeepSpeed, Megatron) keep the wrapper.
    """
    plain = (type(optimizer) is AcceleratedOptimizer and optimizer.scaler is None
             and accelerator.gradient_accumulation_steps == 1
             and accelerator.distributed_type != DistributedType.XLA)
    return optimizer.optimizer if plain else optimizer


def grad_clipper(accelerator: Accelerator) -> Callable[[list[torch.nn.Parameter], float], Any]:
    """The gradient clipping the loop calls: ``torch.nn.utils.clip_grad_norm_`` itself when
    ``accelerator.clip_grad_norm_`` would only call it (no fp16 scaler to unscale, no FSDP,
    DeepSpeed or XLA), else Accelerate's.

    On the plain path Accelerate first walks the parameters looking for sharded (DTensor)
    gradients and reads two environment flags, every step; the same torch call follows,
    so the numbers are the same.
    """
    plain = (accelerator.scaler is None and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true"
             and accelerator.distributed_type in (DistributedType.NO, DistributedType.MULTI_CPU,
                                                  DistributedType.MULTI_GPU))
    return torch.nn.utils.clip_grad_norm_ if plain else accelerator.clip_grad_norm_


def release_prepared(accelerator: Accelerator, optimizer: Any = None) -> None:
    """Drop the accelerator's references to a finished task's prepared model, optimizer and loader.

    What ``Accelerator.free_memory()`` does between tasks, without its full
    ``gc.collect()`` (slow at every task end with a few hundred thousand live
    objects). Accelerate's wrappers sit in reference cycles, so they go at the next
    automatic collection; the optimizer's moment tensors, the memory that counts, are
    released here at once. On CUDA with less than a quarter of the device memory free,
    the full ``free_memory()`` (collection and cache release) still runs.
    """
    if getattr(accelerator, "deepspeed_engine_wrapped", None) is not None:
        accelerator.free_memory()
        return
    if optimizer is not None:
        optimizer.state.clear()
    accelerator._schedulers, accelerator._optimizers = [], []
    accelerator._models, accelerator._dataloaders = [], []
    accelerator.step = 0
    if accelerator.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(accelerator.device)
        if free < total / 4:
            accelerator.free_memory()
