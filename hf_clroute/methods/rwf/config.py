"""``RwfConfig``: Routing without Forgetting.

What is trained
---------------
Each routed block gets one Hopfield router (``hopfield.HopfieldRouter``) that
pools the block's L input tokens Z into m prompts P = softmax(beta Q K^T) V,
with K = Z W_K and V = Z W_V. W_K and W_V are frozen buffers: never trained.
Only the *query side* Q is trained:

* ``query_mode="projected"`` (default): Q = S W_Q^T + b_Q, with m learned base
  queries S (m x d) and one trainable d x d query projection (W_Q, b_Q) per
  routed layer: d^2 + d + m * d parameters per routed layer, plus the classifier head.
* ``query_mode="static"``: Q itself (m x d) is learned directly: m * d parameters
  per routed layer, the lightest variant.

Each field's help says whether its default is the paper's or ours. The frozen
value projection W_V (``value_init``) and the routing temperature are tuned on
validation (``rwf.json``'s search points), not fixed by the paper.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hf_clroute.core.config import CLConfig


@dataclass
class RwfConfig(CLConfig):
    method: ClassVar[str] = "rwf"

    num_prompts: int = field(
        default=8,
        metadata={"help": "m: prompts pooled per routed block (per chunk for a causal LM) and appended to its "
                          "tokens (ours: the paper's parameter count fixes the query projection, not m)."},
    )
    routing: str = field(
        default="cosine",
        metadata={
            "help": "Routing scores. 'cosine' (ours): cos(q, k) / temperature (queries and keys normalised, so the "
            "softmax stays soft and input-dependent however the query norms grow in training); 'dot': the "
            "paper's beta <q, k>, which on layer-normed tokens collapses to one token per prompt."
        },
    )
    temperature: float = field(
        default=0.1,
        metadata={"help": "Cosine routing: the softmax temperature (ours: cosines lie in [-1, 1], 0.1 spans 20 "
                          "logits; tuned on validation beside value_init, see rwf.json's search points)."},
    )
    learn_temperature: bool = field(
        default=False,
        metadata={"help": "Cosine routing: train log(temperature) per routed layer with the queries (recorded in "
                          "the routing-health record); off by default (ours: the paper's beta is fixed)."},
    )
    beta: float | None = field(
        default=None,
        metadata={"help": "Dot routing (the paper's form, scores = beta <q, k>, softmax over the tokens): the inverse "
                          "temperature; None = beta_scale / sqrt(hidden size), as in attention (ours: the paper gives "
                          "no value)."},
    )
    beta_scale: float = field(
        default=1.0,
        metadata={"help": "Dot routing with beta None: beta = beta_scale / sqrt(hidden size), so one value means the "
                          "same softness on every width; tuned on validation beside value_init (rwf-dot.json's "
                          "search points). 1.0: attention's scaling."},
    )
    routed_layers: list[int] | None = field(
        default=None,
        metadata={"help": "0-based indices of the routed blocks; None = the first 3 (the paper's; all, if the "
                          "backbone has fewer)."},
    )
    query_mode: str = field(
        default="projected",
        metadata={
            "help": "'projected' (the paper's, by its trainable-parameter count): Q = S W_Q^T + b with learned "
            "base queries S (m x d) and a trainable d x d projection per layer; 'static': Q (m x d) learned "
            "directly (the lightest variant)."
        },
    )
    query_init_std: float = field(
        default=1.0,
        metadata={
            "help": "Std of the initial queries (S, or Q when static). 1.0 (ours) gives queries of norm ~sqrt(d), "
            "like layer-normed tokens, so the initial routing logits beta <q, k> have unit scale."
        },
    )
    query_projection_init: str = field(
        default="identity",
        metadata={
            "help": "Initial W_Q in projected mode: 'identity' (ours: queries start as the base queries) or "
            "'zeros' (every prompt starts as the mean token)."
        },
    )
    key_init: str = field(
        default="identity",
        metadata={"help": "Frozen W_K: 'identity' (ours; the paper freezes W_K without fixing it: route in the "
                          "block's own token space, and with a trainable query projection any fixed invertible W_K "
                          "is nearly absorbed by W_Q), 'orthogonal' (seeded) or 'pretrained' (the block's own "
                          "attention key projection, its weight without the bias; variant rwf-pretrained-key)."},
    )
    value_init: str = field(
        default="identity",
        metadata={
            "help": "Frozen W_V, tuned on validation (rwf.json's search points). The paper freezes W_V without "
            "fixing it. 'identity' (the default, ours): prompts are convex mixtures of the block's tokens, "
            "inputs the frozen attention already understands, but routing can then only re-weight attention, "
            "never add a direction; 'orthogonal' (seeded): a norm-preserving rotation, prompts off the tokens' "
            "span; 'pretrained': the block's own attention value projection (weight and bias)."
        },
    )
    causal_chunk_size: int = field(
        default=16,
        metadata={
            "help": "Causal LMs only (ours: the paper routes vision encoders): positions are grouped in chunks of "
            "this many tokens; the m prompts of a chunk "
            "pool the tokens up to the chunk's first position, so no position sees a later token. 1 = exact "
            "per-position prompts (L*m extra rows: costly for long contexts)."
        },
    )
    current_task_loss: bool = field(
        default=True,
        metadata={
            "help": "As in CLConfig, but on by default (ours, the convention of the prompt methods RwF is "
            "compared with: L2P, DualPrompt, CODA-Prompt): cross-entropy over the current task's classes."
        },
    )
    train_routers_for_tasks: int | None = field(
        default=None,
        metadata={
            "help": "Train the routers on the first N tasks only, then freeze them (None, the paper's: on every "
            "task). With a statistics head (head='lda', 'ranpac', ...) the routers learn through that head's "
            "loss on the first tasks, and the head's class statistics then accumulate on features that no "
            "longer move."
        },
    )
    head_refresh_steps: int = field(
        default=10,
        metadata={
            "help": "With a statistics head (ours), while the routers train: re-solve the head from its "
            "statistics every this many steps, so the routers' loss reads the current class statistics "
            "(otherwise a head is solved only before an evaluation, and before its first solve its classes "
            "score -inf: no gradient)."
        },
    )
    init_seed: int = field(
        default=0,
        metadata={"help": "Seed of the router initialisation (queries, orthogonal W_K/W_V), independent of the "
                          "global RNG."},
    )

    ROUTINGS: ClassVar[tuple[str, ...]] = ("cosine", "dot")
    QUERY_MODES: ClassVar[tuple[str, ...]] = ("projected", "static")
    PROJECTION_INITS: ClassVar[tuple[str, ...]] = ("identity", "zeros")
    MATRIX_INITS: ClassVar[tuple[str, ...]] = ("identity", "orthogonal", "pretrained")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.freeze_backbone:
            raise ValueError("RwfConfig.freeze_backbone must be True: RwF trains only the query side and the head")
        for name in ("num_prompts", "causal_chunk_size", "head_refresh_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"RwfConfig.{name} must be a positive integer, got {value!r}")
        if self.beta is not None:
            self._check_positive("beta")
            if self.routing != "dot":
                raise ValueError(f"RwfConfig.beta applies to routing='dot' only (routing is {self.routing!r}: "
                                 "set temperature instead)")
        self._check_positive("beta_scale")
        if self.beta_scale != 1.0 and (self.routing != "dot" or self.beta is not None):
            raise ValueError(f"RwfConfig.beta_scale ({self.beta_scale}) applies to routing='dot' with beta None only "
                             f"(routing {self.routing!r}, beta {self.beta!r})")
        self._check_positive("temperature")
        if self.train_routers_for_tasks is not None:
            n = self.train_routers_for_tasks
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValueError(f"RwfConfig.train_routers_for_tasks must be None or an integer >= 0, got {n!r}")
        self._check_positive("query_init_std")
        if self.routed_layers is not None:
            layers = self.routed_layers
            if (
                not isinstance(layers, list)
                or not layers
                or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in layers)
                or len(set(layers)) != len(layers)
            ):
                raise ValueError(
                    f"RwfConfig.routed_layers must be a non-empty list of distinct indices >= 0, got {layers!r}")
        choices = {
            "routing": self.ROUTINGS,
            "query_mode": self.QUERY_MODES,
            "query_projection_init": self.PROJECTION_INITS,
            "key_init": self.MATRIX_INITS,
            "value_init": self.MATRIX_INITS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"RwfConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")

    def resolve_layers(self, num_blocks: int) -> list[int]:
        """The routed block indices for a backbone with ``num_blocks`` blocks."""
        if self.routed_layers is None:
            return list(range(min(3, num_blocks)))
        bad = [i for i in self.routed_layers if i >= num_blocks]
        if bad:
            raise ValueError(f"RwfConfig.routed_layers {bad} out of range: the backbone has {num_blocks} blocks")
        return sorted(self.routed_layers)
