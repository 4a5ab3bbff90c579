"""Experience replay (ER) with a reservoir-sampled buffer of a stated size.

Every training example passes through :class:`~hf_clroute.core.replay_buffer.ReservoirBuffer`
(model inputs + labels), so the buffer is a uniform sample of everything seen so far.
Each step trains on the current batch plus an equally large batch drawn from the
buffer, in one forward pass: the loss is CE(current) + CE(replayed), the
replayed term reported as the extra loss ``replay``. The buffer is part of the
adapter (its tensors are buffers), so a saved ER adapter resumes with its memory.

Several processes: the global batch is gathered so every process keeps the same
buffer (the one a single process would keep), and the replayed global batch is
drawn with a generator seeded by (seed, step), each process taking its slice;
1 and N processes therefore follow the same trajectory, as for the plain loop.

Text inputs vary in length, so ``input_ids``/``attention_mask``/``token_type_ids``
are stored right-padded to ``max_length`` (zeros, masked out) and trimmed back to
the longest attended length when replayed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from hf_clroute.baselines.er.config import ERConfig
from hf_clroute.core.method import ContinualMethod, StepContext
from hf_clroute.core.outputs import CLModelOutput, model_inputs
from hf_clroute.core.replay_buffer import ReservoirBuffer

if TYPE_CHECKING:  # pragma: no cover
    from hf_clroute.core.model import CLModel

_SEQUENCE_FIELDS = ("input_ids", "attention_mask", "token_type_ids")
#: what the buffer keeps of a batch (cached ``features`` when the bench feeds them instead of inputs).
_STORED_FIELDS = _SEQUENCE_FIELDS + ("pixel_values", "features", "labels")


class ExperienceReplay(ContinualMethod):
    config_class = ERConfig
    supported_modalities = ("image", "text")

    def __init__(self, config: ERConfig) -> None:
        super().__init__(config)
        self.buffer = ReservoirBuffer(config.buffer_size, seed=config.seed)
        self._step = 0
        self._process = (0, 1)  # (index, count): which slice of a replayed global batch is ours

    # ---- the replayed half of each training forward ---------------------------------
    def forward(self, model: "CLModel", batch: dict[str, torch.Tensor]) -> CLModelOutput:
        """The current batch and an equally large replayed one in one pass; the replayed
        half adds its own cross-entropy (``losses['replay']``)."""
        if not self.training or len(self.buffer) == 0 or "labels" not in batch:
            return super().forward(model, batch)
        inputs = model_inputs(batch)
        current = next(iter(inputs.values())).shape[0]
        replay = self._draw(current)
        replay_labels = replay.pop("labels")
        features = self.features(model, _concat_inputs(inputs, replay))
        logits = self.classify(model, features)
        out = self.with_loss(model, batch, CLModelOutput(logits=logits[:current], features=features[:current].detach()))
        replay_logits = logits[current:]
        replayed = F.cross_entropy(replay_logits, replay_labels.to(replay_logits.device))
        out.losses["replay"] = self.config.replay_weight * replayed
        out.loss = out.loss + out.losses["replay"]
        return out

    def _draw(self, local_batch: int) -> dict[str, torch.Tensor]:
        index, count = self._process
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + self._step)
        sample = self.buffer.sample(local_batch * count, generator=generator)
        return {k: v[index::count] for k, v in sample.items()}

    # ---- filling the buffer ------------------------------------------------------------
    def on_task_start(self, model, experience, ctx: StepContext) -> None:
        self._process = (ctx.process_index, ctx.num_processes)

    def after_step(self, model, batch, out, ctx: StepContext) -> None:
        self._step = ctx.global_step + 1
        stored = {k: self._fixed_length(k, v) for k, v in batch.items() if k in _STORED_FIELDS}
        stored = {k: ctx.gather(v) for k, v in stored.items()}
        self.buffer.add({k: v.detach().to(self.buffer_device) for k, v in stored.items()})

    @property
    def buffer_device(self) -> torch.device:
        stored = list(self.buffer.buffers())
        return stored[0].device if stored else torch.device("cpu")

    def _fixed_length(self, name: str, value: torch.Tensor) -> torch.Tensor:
        if name not in _SEQUENCE_FIELDS:
            return value
        length = value.shape[1]
        if length > self.config.max_length:
            raise ValueError(f"ER: a batch of {length} tokens exceeds ERConfig.max_length={self.config.max_length}")
        return F.pad(value, (0, self.config.max_length - length))

    # ---- state -------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        return {"buffer": self.buffer.extra_state(), "step": self._step}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.buffer.load_extra_state(state.get("buffer", {}))
        self._step = int(state.get("step", 0))


def _concat_inputs(current: dict[str, torch.Tensor], replay: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Stack the current and replayed inputs into one batch (text padded to a common length)."""
    if "attention_mask" in replay:  # trim stored padding, then pad both sides to one length
        longest = int(replay["attention_mask"].any(dim=0).nonzero().max()) + 1
        replay = {k: v[:, :longest] if k in _SEQUENCE_FIELDS else v for k, v in replay.items()}
    joined = {}
    for name, value in current.items():
        other = replay[name].to(value.device, value.dtype)
        if name in _SEQUENCE_FIELDS:
            length = max(value.shape[1], other.shape[1])
            value, other = (F.pad(t, (0, length - t.shape[1])) for t in (value, other))
        joined[name] = torch.cat([value, other])
    return joined

