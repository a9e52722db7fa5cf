"""The agents' health marks as the coordinator reads them (the wire's records -> its own). Pure.

Each GPU and MIG instance of a GetNode answer may carry a HealthMark (docs/health.md): healthy,
degraded (usable, watched) or failed (not usable until its action). A GPU without a verdict
is ``unknown``, never healthy unchecked; an instance without one has no verdict of its own
and counts as its GPU. A node is as bad as its worst GPU or instance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.health import machine
from agent.wire.node import NodeGpu

__all__ = [
    "ACTIONS",
    "DEGRADED",
    "FAILED",
    "HEALTHY",
    "STATES",
    "UNKNOWN",
    "GpuMark",
    "InstanceMark",
    "Mark",
    "gpu_marks",
    "worst",
]

HEALTHY, DEGRADED, FAILED, UNKNOWN = "healthy", "degraded", "failed", "unknown"
#: best to worst: a node shows the worst of its GPUs and instances
STATES = (HEALTHY, UNKNOWN, DEGRADED, FAILED)
#: what clears a mark, as the agent names it
ACTIONS = ("none", "restart-application", "reset-gpu", "reboot-node")

_STATE = {
    machine.State.HEALTHY: HEALTHY,
    machine.State.DEGRADED: DEGRADED,
    machine.State.FAILED: FAILED,
}


@dataclass(frozen=True, slots=True)
class Mark:
    """One verdict: ``since`` in seconds since the epoch (None when the agent gave none)."""

    state: str
    reason: str = ""
    action: str = ""
    pods: tuple[str, ...] = ()
    since: float | None = None


@dataclass(frozen=True, slots=True)
class InstanceMark:
    gpu_instance_id: int
    profile: str
    mark: Mark


@dataclass(frozen=True, slots=True)
class GpuMark:
    index: int
    uuid: str
    mark: Mark
    #: instances that carry a verdict of their own
    instances: tuple[InstanceMark, ...] = ()
    #: the GPU's own state, or worse when one of its instances is worse (set from the others)
    state: str = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        state = self.mark.state
        if self.instances:
            state = worst([state, *(i.mark.state for i in self.instances)])
        object.__setattr__(self, "state", state)

    @property
    def pods(self) -> tuple[str, ...]:
        """The pods the marks name (the GPU's and its instances'), each once, in order."""
        if not self.instances:
            return self.mark.pods
        seen = dict.fromkeys(self.mark.pods)
        for i in self.instances:
            seen.update(dict.fromkeys(i.mark.pods))
        return tuple(seen)

    @property
    def failed_marks(self) -> tuple[tuple[str, Mark], ...]:
        """(what, mark) of each failed verdict on this GPU: ``GPU 2``, ``GPU 2 GI 7 (1g.10gb)``."""
        found = [(f"GPU {self.index}", self.mark)] if self.mark.state == FAILED else []
        found += [
            (f"GPU {self.index} GI {i.gpu_instance_id} ({i.profile})", i.mark)
            for i in self.instances
            if i.mark.state == FAILED
        ]
        return tuple(found)

    @property
    def worst_mark(self) -> tuple[str, Mark]:
        """(what, mark) of the worst verdict: the GPU's own when it is as bad as any."""
        if self.mark.state == self.state:
            return f"GPU {self.index}", self.mark
        marks = [(f"GPU {self.index}", self.mark)] + [
            (f"GPU {self.index} GI {i.gpu_instance_id} ({i.profile})", i.mark)
            for i in self.instances
        ]
        return next((w, m) for w, m in marks if m.state == self.state)

    def describe(self) -> str:
        """``GPU 2 failed: XID 79 (...) (action reset-gpu)``: the worst verdict, in words."""
        what, mark = self.worst_mark
        text = f"{what} {mark.state}"
        if mark.reason:
            text += f": {mark.reason}"
        if mark.action not in ("", "none") and not mark.reason.endswith(f"needs {mark.action}"):
            text += f" (action {mark.action})"
        return text


def _mark(found: machine.Mark | None) -> Mark:
    if found is None:  # no verdict, or one in a state this coordinator does not know
        return Mark(UNKNOWN)
    return Mark(_STATE[found.state], found.reason, found.action, found.pods, found.since)


def gpu_marks(gpus: Iterable[NodeGpu]) -> tuple[GpuMark, ...]:
    """Each GPU's verdict and its instances' own verdicts, from a GetNode answer."""
    out = []
    for g in gpus:
        layout = g.layout
        instances: tuple[InstanceMark, ...] = ()
        judged = g.instance_conditions
        if judged:  # most GPUs have none: no generator for them (8,000 GPUs a sweep)
            instances = tuple(
                InstanceMark(gi.id, gi.profile_name, _mark(judged[gi.id]))
                for gi in layout.instances
                if gi.id in judged
            )
        out.append(GpuMark(layout.gpu.index, layout.gpu.uuid, _mark(g.condition), instances))
    return tuple(out)


def worst(states: Sequence[str] | Iterable[str]) -> str:
    """The worst of ``states`` (failed, degraded, unknown, healthy); ``unknown`` when none."""
    found = list(states)
    if not found:
        return UNKNOWN
    return max(found, key=STATES.index)
