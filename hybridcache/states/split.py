"""How a role's live bytes split over tensor-parallel ranks: the description a state module (or page role
set) gives so that a request's state saved at one tensor-parallel size can be resumed at another
(disaggregated prefill/decode, `hybridcache.disagg.reshard`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HeadSplit:
    """Along `axis` of the role's live shape (`RoleSpec.live_shape`, per layer), the row is the
    concatenation of `parts`, each `(units, width)`: `units` heads (or groups) of `width` entries each,
    counted at this module's size. Each part splits by unit over the ranks on its own (a conv window over
    concatenated x/B/C or q/k/v sections is three parts). `axis` None: replicated, every rank holds the
    whole row (PNAT, buffer index, MLA latent pages)."""

    axis: int | None
    parts: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if (self.axis is None) != (not self.parts):
            raise ValueError("a HeadSplit names an axis and its parts, or neither (replicated)")
        if any(u < 1 or w < 1 for u, w in self.parts):
            raise ValueError(f"head split parts need units and widths >= 1, got {self.parts}")


REPLICATED = HeadSplit(None)


def heads(units: int, axis: int = 0) -> HeadSplit:
    """`units` heads of one entry each along `axis`."""
    return HeadSplit(axis, ((units, 1),))


def role_splits(module) -> dict[str, HeadSplit]:
    """`module.head_splits()` under the cache's role names (`"mamba2.ssm"`)."""
    return {f"{module.name}.{name}": split for name, split in module.head_splits().items()}
