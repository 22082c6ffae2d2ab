"""What the model families share: embedding -> residual layers -> final norm -> LM head, the loader hooks, the
cache contract over one recurrent layer kind and one attention kind, and the step-kind checks.

A family subclasses `HybridLM` and keeps what is its own: its layer kinds and how it builds them, its config
spec, its checkpoint names, and the state module / page roles of its kinds (`recurrent_state`,
`attention_pages`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import torch
from torch import nn

from ..ops.linear import linear
from ..parallel import SINGLE, TPGroup
from ..parallel.pipeline import Stage, whole
from .batch import ForwardBatch
from .layers.embedding import Embedding
from .layers.mlp import Linear
from .layers.params import checkpoint_targets

if TYPE_CHECKING:
    from ..cache.protocol import PageRoles, StateModule

Device = torch.device | str


@dataclass(frozen=True)
class DraftRoles:
    """How a recurrent layer kind's state module keeps drafts between steps when built with
    `num_draft_tokens > 0`: `marker` is a role it has only then; `name` and `why` word the refusals."""

    marker: str
    name: str
    why: str


REPLAY = DraftRoles("pnat", "replay", "the accept hook counts the step's tokens into the replay history")


class Trunk(nn.Module):
    """`norm(layers(embedding(ids)))`, the embedding and the norm registered under the checkpoint's names.

    A pipeline stage's trunk holds its layers only, each under its global index (`layers.{i}`, as the
    checkpoint names it); a stage without the embedding (None) takes hidden states instead of ids, and one
    without the norm (None) returns its last layer's output."""

    def __init__(self, embedding_name: str, embedding: Embedding | None,
                 layers: Sequence[nn.Module] | dict[int, nn.Module], norm_name: str, norm: nn.Module | None) -> None:
        super().__init__()
        self.embedding_name, self.norm_name = embedding_name, norm_name
        if embedding is not None:
            self.add_module(embedding_name, embedding)
        numbered = layers.items() if isinstance(layers, dict) else enumerate(layers)
        self.layers = nn.ModuleList()
        for i, layer in numbered:
            self.layers.add_module(str(i), layer)
        if norm is not None:
            self.add_module(norm_name, norm)

    @property
    def embedding(self) -> Embedding | None:
        return getattr(self, self.embedding_name, None)

    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids: [N] (or `hidden` [N, D] from the stage before) -> hidden [N, D], after the final norm
        on the stage that holds it. Each layer maps the stream x + delta to (x', delta') (`residual`): its
        last residual add is left to the next norm, which fuses it (`RMSNorm.add`)."""
        x = self.embedding(input_ids) if hidden is None else hidden
        delta = None
        for layer in self.layers:
            x, delta = layer.residual(x, delta, batch)
        norm = getattr(self, self.norm_name, None)
        if norm is not None:
            return norm.add(x, delta)[0]
        return x if delta is None else x + delta


class HybridLM(nn.Module):
    """A causal LM over a `Trunk` (registered as `trunk_name`) and an LM head (None: tied to the embedding).

    Class attributes a family sets: `spec_type` (its config spec: `from_dict(config)`, `count(kind)`,
    `vocab_size`), `recurrent_kind` / `attention_kind` (the spec's kinds of the layers with slot state and
    with pages), `state_name` (the recurrent state module's name) and `draft_roles`; and `layer_kinds()`.

    `stage`: a pipeline stage's model holds that stage's layers only (the embedding on the first, the final
    norm and LM head on the last); its cache covers its own layers (a mixer's index counts the layers of
    its kind before it within the stage), so a stage without recurrent layers has no state module.
    """

    spec_type: ClassVar[Any]
    recurrent_kind: ClassVar[str]
    attention_kind: ClassVar[str]
    state_name: ClassVar[str]
    draft_roles: ClassVar[DraftRoles] = REPLAY

    def __init__(self, spec: Any, trunk_name: str, trunk: Trunk, lm_head: Linear | None, dtype: torch.dtype,
                 tp: TPGroup = SINGLE, stage: Stage | None = None) -> None:
        super().__init__()
        self.spec, self.dtype, self.trunk_name, self.tp = spec, dtype, trunk_name, tp
        self.stage = stage or whole(len(self.layer_kinds()))
        self.add_module(trunk_name, trunk)
        self.lm_head = lm_head

    @classmethod
    def from_config(cls, config: dict[str, Any], device: Device, dtype: torch.dtype, tp: TPGroup = SINGLE,
                    stage: Stage | None = None) -> "HybridLM":
        """The model, or with `tp` of more than one rank this rank's shard of it (docs/parallel.md): heads,
        groups and intermediate sizes split, embedding and LM head replicated, every mixer and MLP
        returning a partial sum that its layer all-reduces. With `stage`, only that pipeline stage's part."""
        return cls(cls.spec_type.from_dict(config), device, dtype, tp, stage)

    @classmethod
    def num_layers(cls, config: dict[str, Any]) -> int:
        """Decoder layers of a checkpoint's config."""
        return len(cls.layer_kinds_of(cls.spec_type.from_dict(config)))

    @staticmethod
    def layer_kinds_of(spec: Any) -> Sequence[str]:
        """The kind of every decoder layer, in order."""
        raise NotImplementedError

    def layer_kinds(self) -> Sequence[str]:
        return self.layer_kinds_of(self.spec)

    def local_count(self, kind: str) -> int:
        """Layers of `kind` on this stage (all of them for an unsplit model)."""
        return sum(k == kind for k in list(self.layer_kinds())[self.stage.first : self.stage.end])

    @property
    def trunk(self) -> Trunk:
        return getattr(self, self.trunk_name)

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    # ------------------------------------------------------------------ checkpoint
    def tensor_targets(self) -> dict[str, torch.Tensor]:
        return checkpoint_targets(self)

    @staticmethod
    def checkpoint_names(name: str) -> list[str]:
        """Spellings of one tensor's name a checkpoint may use."""
        return [name]

    # ------------------------------------------------------------------ cache contract
    def state_modules(self, num_draft_tokens: int, **options: Any) -> list[StateModule]:
        """One state module over the recurrent layers (layer i = the i-th of `recurrent_kind`), none without
        them; `options` go to the family's `recurrent_state` (e.g. a replay state's `hist`)."""
        n = self.local_count(self.recurrent_kind)
        return [self.recurrent_state(n, num_draft_tokens, **options)] if n else []

    def page_roles(self, page_size: int) -> PageRoles | None:
        """Pages over the attention layers (layer i = the i-th of `attention_kind`), None without them."""
        n = self.local_count(self.attention_kind)
        return self.attention_pages(n, page_size) if n else None

    def recurrent_state(self, num_layers: int, num_draft_tokens: int, **options: Any) -> StateModule:
        raise NotImplementedError

    def attention_pages(self, num_layers: int, page_size: int) -> PageRoles:
        raise NotImplementedError

    # ------------------------------------------------------------------ compute
    def check_step(self, num_tokens: int, batch: ForwardBatch) -> None:
        """Raise ValueError when the batch does not hold `num_tokens` tokens, or asks for a step kind the
        recurrent roles cannot serve: speculative without draft roles, plain decode over them, or plain
        decode of more than 1 token per row."""
        gen = batch.num_generation_rows * batch.generation_tokens
        if batch.num_context_tokens + gen != num_tokens:
            raise ValueError(f"{num_tokens} tokens, but the batch has {batch.num_context_tokens} context tokens "
                             f"and {batch.num_generation_rows} x {batch.generation_tokens} generation tokens")
        if not (batch.num_generation_rows and self.local_count(self.recurrent_kind)):
            return
        roles = self.draft_roles
        drafting = roles.marker in batch.states[self.state_name]
        if batch.speculative and not drafting:
            raise ValueError(f"a speculative step needs the {roles.name} roles: build the state with "
                             "num_draft_tokens > 0")
        if not batch.speculative and drafting:
            raise ValueError(f"with {roles.name} roles every generation step must run speculative=True (T = 1 is "
                             f"fine): {roles.why}")
        if not batch.speculative and batch.generation_tokens != 1:
            raise ValueError(f"plain decode feeds 1 token per row, got {batch.generation_tokens}")

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids: [N] -> hidden [N, D] after the final norm. A later pipeline stage takes the stage
        before's `hidden` [N, D] instead of embedding the ids; a stage before the last returns its last
        layer's output (no norm)."""
        self.check_step(input_ids.shape[0], batch)
        return self.trunk(input_ids, batch, hidden)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [M, D] -> [M, V] float32 (the last stage's)."""
        weight = self.trunk.embedding.weight if self.lm_head is None else self.lm_head.weight
        return linear(hidden, weight, out_dtype=torch.float32)
