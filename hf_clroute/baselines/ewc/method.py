"""Online EWC (Schwarz et al. 2018, "Progress & Compress"; Kirkpatrick et al. 2017).

At the end of each task the diagonal (empirical) Fisher information of the
trainable parameters is estimated at the task's final parameters theta*, from
per-example gradients of the cross-entropy on the last ``fisher_samples`` training
examples of the task (the stream is shuffled within a task, so they are a
uniform sample of it). Online EWC keeps one running Fisher and one anchor:
``F <- gamma * F + F_task`` and ``theta* <- theta``; training then adds
``lambda / 2 * sum F (theta - theta*)^2``. Parameters that grew since (the head's
new rows) are penalised only on their old part.

Fisher and anchors are buffers, saved with the adapter. With a trained backbone
(the default, like naive fine-tuning) that is two extra copies of it: they are
the method's state. Under several processes each process estimates the Fisher on
its own examples and the estimates are averaged, so all processes agree.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from hf_clroute.baselines.ewc.config import EWCConfig
from hf_clroute.core.method import ContinualMethod, StepContext
from hf_clroute.core.outputs import model_inputs

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel


def trainable_named_parameters(model: "CLModel") -> dict[str, nn.Parameter]:
    """The model's trainable parameters by name (what a snapshot or a Fisher covers)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def overlap(param: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """The part of ``param`` that ``reference`` (saved before ``param`` grew) covers."""
    return param[tuple(slice(0, size) for size in reference.shape)]


class ParamStore(nn.Module):
    """Named tensors shaped like a model's parameters, held as buffers so they save with the adapter.

    Parameter names contain dots, which buffer names may not: they are stored with
    ``__`` instead. ``persistent=False`` keeps them out of the saved file.
    """

    def put(self, name: str, tensor: torch.Tensor, persistent: bool = True) -> None:
        self.register_buffer(name.replace(".", "__"), tensor, persistent=persistent)

    def items(self) -> list[tuple[str, torch.Tensor]]:
        return [(key.replace("__", "."), value) for key, value in self._buffers.items()]

    def set_persistent(self, persistent: bool) -> None:
        for name, value in self.items():
            self.put(name, value, persistent)

    def shapes(self) -> dict[str, list]:
        return {name: [list(value.shape), str(value.dtype).removeprefix("torch.")] for name, value in self.items()}

    def allocate(self, shapes: dict[str, list], persistent: bool = True) -> None:
        """Empty tensors of the recorded shapes, to be filled by loading a checkpoint."""
        for name, (shape, dtype) in shapes.items():
            self.put(name, torch.zeros(shape, dtype=getattr(torch, dtype)), persistent)


class OnlineEWC(ContinualMethod):
    config_class = EWCConfig
    supported_modalities = ("image", "text")

    def __init__(self, config: EWCConfig) -> None:
        super().__init__(config)
        self.fisher = ParamStore()
        self.anchor = ParamStore()
        self._recent: deque[dict[str, torch.Tensor]] = deque()

    def penalty(self, model: "CLModel") -> torch.Tensor:
        params = dict(model.named_parameters())
        anchors = dict(self.anchor.items())
        total = torch.zeros((), device=next(iter(params.values())).device)
        for name, fisher in self.fisher.items():
            diff = overlap(params[name], fisher) - anchors[name]
            total = total + (fisher * diff.pow(2)).sum()
        return 0.5 * self.config.ewc_lambda * total

    def extra_losses(self, model, batch, logits) -> dict[str, torch.Tensor]:
        return {"ewc": self.penalty(model)} if len(self.fisher.items()) else {}

    def after_step(self, model, batch, out, ctx: StepContext) -> None:
        # Keep the most recent examples of this task (inputs + labels, on the CPU).
        self._recent.append({k: v.detach().cpu() for k, v in batch.items()})
        kept = self.config.fisher_samples
        while sum(len(b["labels"]) for b in self._recent) - len(self._recent[0]["labels"]) >= kept:
            self._recent.popleft()

    def on_task_end(self, model, experience, ctx: StepContext) -> None:
        params = trainable_named_parameters(model)
        squares, count = self._squared_gradients(model, params)
        squares = {n: ctx.reduce(s) for n, s in squares.items()}
        count = int(ctx.reduce(torch.tensor(float(count))))
        old = dict(self.fisher.items())
        for name, param in params.items():
            fisher = squares[name] / max(count, 1)
            if name in old:  # decay the running Fisher; rows added since start at zero
                overlap(fisher, old[name]).add_(self.config.gamma * old[name])
            self.fisher.put(name, fisher)
            self.anchor.put(name, param.detach().clone())
        self._recent.clear()

    def _squared_gradients(self, model, params: dict[str, nn.Parameter]) -> tuple[dict[str, torch.Tensor], int]:
        """Sum over the kept examples of each parameter's squared per-example gradient."""
        squares = {n: torch.zeros_like(p) for n, p in params.items()}
        was_training, count = model.training, 0
        model.eval()  # theta* as it predicts: no dropout in the estimate
        device = next(iter(params.values())).device
        for batch in reversed(self._recent):  # newest first, up to fisher_samples examples
            for i in range(min(len(batch["labels"]), self.config.fisher_samples - count)):
                example = {k: v[i : i + 1].to(device) for k, v in batch.items()}
                loss = F.cross_entropy(model(**model_inputs(example)).logits, example["labels"])
                # autograd.grad leaves .grad alone, and DDP's hooks out of this.
                grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
                for name, grad in zip(params, grads):
                    if grad is not None:
                        squares[name] += grad.detach().pow(2)
                count += 1
        model.train(was_training)
        return squares, count

    def extra_state(self) -> dict[str, Any]:
        return {"fisher": self.fisher.shapes()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        shapes = state.get("fisher", {})
        self.fisher.allocate(shapes)
        self.anchor.allocate(shapes)
