"""Demand that waits only because free MIG slices are fragmented, and the moves that would fit it.

Pure. On nodes whose DRA driver creates MIG instances itself (dra-dynamic-mig) the coordinator
plans no MIG change; what it can say is why a pending claim's profile does not fit although a
GPU has the free memory and compute slices for it, and which relocation of existing instances
would make room (agent/mig/advice.py's search, at most two moves). It is advice: nothing here
is executed.

A request counts as pending because of fragmentation when no GPU it may use (dra-dynamic-mig
nodes in its pool, offering its profile) has a free placement for it, and at least one has
enough free slices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.coordinator.fleet.inventory import NodeView
from agent.coordinator.planning.claimdemand import PendingRequest
from agent.dra.mode import AllocationMode
from agent.gpu.types import GpuLayout
from agent.mig.advice import Move, advise_gpu, moves_to_fit

__all__ = ["Fragmented", "MoveHint", "fragmented_requests"]

#: GPUs named per request: the best few, not the whole fleet.
MAX_HINTS = 3


@dataclass(frozen=True, slots=True)
class MoveHint:
    node: str
    gpu: int
    #: empty when more than two moves would be needed
    moves: tuple[Move, ...]
    #: where the request's instance would start after the moves
    start: int | None

    @property
    def text(self) -> str:
        if not self.moves:
            return f"{self.node} GPU {self.gpu} has the free slices, but more than two moves away"
        moves = " and ".join(str(m) for m in self.moves)
        return f"{self.node} GPU {self.gpu} (at slice {self.start}) if {moves}"


@dataclass(frozen=True, slots=True)
class Fragmented:
    who: str
    profile: str
    count: int
    #: GPUs with enough free slices but no free placement
    gpus: int
    hints: tuple[MoveHint, ...]

    @property
    def text(self) -> str:
        fits = "; or ".join(h.text for h in self.hints)
        return f"{self.who} {self.profile} fits {fits}"


def _candidates(
    views: Sequence[NodeView], pool: str | None, pools: Mapping[str, frozenset[str]]
) -> list[tuple[str, GpuLayout]]:
    allowed = None if pool is None else pools.get(pool, frozenset())
    return [
        (v.name, g)
        for v in sorted(views, key=lambda v: v.name)
        if v.plannable
        and v.allocation is not None
        and v.allocation.mode is AllocationMode.DRA_DYNAMIC_MIG
        and (allowed is None or v.name in allowed)
        for g in sorted(v.usable_layouts, key=lambda g: g.gpu.index)
        if g.gpu.mig_mode is not None and g.gpu.mig_mode.current
    ]


def _hint(node: str, layout: GpuLayout, profile: str) -> bool | MoveHint | None:
    """True when a placement is free; the moves when only fragmentation is in the way."""
    (advice,) = advise_gpu(layout, profile).profiles
    if advice.recommended is not None:
        return True
    if not advice.fragmented:
        return None
    found = moves_to_fit(layout, profile)
    moves, at = found if found is not None else ((), None)
    return MoveHint(node, layout.gpu.index, moves, None if at is None else at.start)


def fragmented_requests(
    views: Sequence[NodeView],
    waiting: Sequence[PendingRequest],
    pools: Mapping[str, frozenset[str]] | None = None,
) -> tuple[Fragmented, ...]:
    """The waiting requests only fragmentation keeps from fitting, with the moves per GPU."""
    out: list[Fragmented] = []
    #: (node, GPU, profile) -> a free placement exists, or the hint when fragmented
    cache: dict[tuple[str, int, str], bool | MoveHint | None] = {}
    for request in waiting:
        fits = False
        hints: list[MoveHint] = []
        for node, layout in _candidates(views, request.pool, pools or {}):
            if request.profile not in {p.name for p in layout.profiles}:
                continue
            key = (node, layout.gpu.index, request.profile)
            if key not in cache:
                cache[key] = _hint(node, layout, request.profile)
            found = cache[key]
            if found is True:
                fits = True
                break
            if isinstance(found, MoveHint):
                hints.append(found)
        if fits or not hints:
            continue
        ranked = sorted(
            hints,
            key=lambda h: (
                not h.moves,
                len(h.moves),
                sum(m.busy for m in h.moves),
                h.node,
                h.gpu,
            ),
        )
        out.append(
            Fragmented(
                request.who, request.profile, request.count, len(hints), tuple(ranked[:MAX_HINTS])
            )
        )
    return tuple(out)
