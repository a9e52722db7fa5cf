"""MIG planning: a GPU's current layout + desired counts -> the layout to reach, and the steps.

Pure functions over the records of :mod:`agent.gpu.types` (STYLE.md practice 3): no NVML, no I/O.
What the GPU should hold is resolved by agent/mig/desired.py; where its instances go, and why
they do not fit, is agent/mig/placement.py's search. Here: the plan and its steps (destroy, mode,
create), and mig-parted's assert. Instances with running processes are never destroyed unless
forced: the plan names the process that blocks each change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from agent.errors import InvalidSpec
from agent.gpu.types import GpuInstance, GpuLayout, Placement, Process
from agent.mig.desired import Desired, Shape, counts_of, current_counts, resolve
from agent.mig.placement import (
    Infeasibility,
    capacity_problem,
    explain,
    largest_free,
    room_meter,
    search,
    slice_mask,
)
from agent.mig.state import CiState, GiState, GpuMigState, gi_state

# -- plan records ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DestroyCi:
    action: ClassVar[str] = "destroy-ci"

    gi_id: int
    ci_id: int
    gi: str

    def __str__(self) -> str:
        return f"destroy compute instance {self.ci_id} of GPU instance {self.gi_id} ({self.gi})"


@dataclass(frozen=True, slots=True)
class DestroyGi:
    action: ClassVar[str] = "destroy-gi"

    gi_id: int
    gi: str

    def __str__(self) -> str:
        return f"destroy GPU instance {self.gi_id} ({self.gi})"


@dataclass(frozen=True, slots=True)
class SetMigMode:
    action: ClassVar[str] = "set-mode"

    enable: bool

    def __str__(self) -> str:
        return f"set MIG mode {'enabled' if self.enable else 'disabled'}"


@dataclass(frozen=True, slots=True)
class ResetGpu:
    """Run only if the driver leaves the new mode pending (it resets by itself when it can)."""

    action: ClassVar[str] = "reset"

    def __str__(self) -> str:
        return "reset the GPU if the MIG mode is left pending"


@dataclass(frozen=True, slots=True)
class CreateGi:
    action: ClassVar[str] = "create-gi"

    profile_id: int
    profile_name: str
    placement: Placement

    def __str__(self) -> str:
        return f"create GPU instance {self.profile_name} at {self.placement}"


@dataclass(frozen=True, slots=True)
class CreateCi:
    action: ClassVar[str] = "create-ci"

    gi_placement: Placement
    gi: str
    ci: CiState

    def __str__(self) -> str:
        where = "" if self.ci.start is None else f" at {self.ci.start}:{self.ci.slices}"
        return f"create {self.ci.slices}-slice compute instance{where} in {self.gi}"


Step = DestroyCi | DestroyGi | SetMigMode | ResetGpu | CreateGi | CreateCi


@dataclass(frozen=True, slots=True)
class ModeChange:
    enable: bool
    #: the current mode differs, so the change needs an activation (a GPU reset unless the driver
    #: resets by itself); False when only a pending opposite request is cancelled.
    activation: bool


@dataclass(frozen=True, slots=True)
class Blocker:
    """A running process in the way of a change."""

    pid: int
    gpu_instance_id: int | None
    instance: str  # "3g.20gb@4:4", or "whole GPU"
    change: str  # "destroy" or "MIG mode change"

    def __str__(self) -> str:
        return f"process {self.pid} on {self.instance} blocks {self.change}"


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """What an apply would do to one GPU. ``target`` is None when infeasible or deferred."""

    layout: GpuLayout
    desired: Desired
    mode_change: ModeChange | None = None
    keep: tuple[GpuInstance, ...] = ()
    destroy: tuple[GpuInstance, ...] = ()
    create: tuple[GiState, ...] = ()
    blockers: tuple[Blocker, ...] = ()
    infeasible: Infeasibility | None = None
    target: GpuMigState | None = None
    steps: tuple[Step, ...] = ()
    #: the driver reports no profiles while MIG is off: the layout is planned after the switch.
    deferred: bool = False
    forced: bool = False
    free_region: Placement | None = None

    @property
    def status(self) -> str:
        if self.infeasible is not None:
            return "infeasible"
        if self.blockers and not self.forced:
            return "blocked"
        return "change" if self.steps else "unchanged"

    @property
    def problem(self) -> str:
        """Why it cannot be applied as it is: what does not fit, or what blocks it."""
        if self.infeasible is not None:
            return self.infeasible.reason
        return "; ".join(str(b) for b in self.blockers) or self.status


# -- planning --------------------------------------------------------------------------------------


def plan_gpu(layout: GpuLayout, desired: Desired, *, force: bool = False) -> GpuPlan:
    """Plan one GPU. InvalidSpec for a profile this board lacks; infeasible/blocked are data."""
    gpu = layout.gpu
    mode = gpu.mig_mode
    if mode is None:
        if desired.mig_enabled:
            why = Infeasibility(f"GPU {gpu.index} ({gpu.name}) is not MIG-capable")
            return GpuPlan(layout, desired, infeasible=why, forced=force)
        return GpuPlan(layout, desired, forced=force)
    mode_change = None
    if (mode.current, mode.pending) != (desired.mig_enabled, desired.mig_enabled):
        mode_change = ModeChange(
            desired.mig_enabled, activation=mode.current != desired.mig_enabled
        )
    if not desired.mig_enabled:
        return _finish(layout, desired, mode_change, (), (), force)
    if mode_change is not None and mode_change.activation and not layout.profiles:
        steps = (SetMigMode(True), ResetGpu())
        blockers = _mode_blockers(layout.processes)
        return GpuPlan(
            layout,
            desired,
            mode_change,
            blockers=blockers,
            steps=steps,
            deferred=True,
            forced=force,
        )
    shapes = resolve(desired, layout)
    problem = capacity_problem(shapes, layout)
    if problem is not None:
        return GpuPlan(layout, desired, mode_change, infeasible=problem, forced=force)
    existing = layout.instances if mode.current else ()
    busy = {p.gpu_instance_id for p in layout.processes if p.gpu_instance_id is not None}
    pinned = () if force else tuple(gi for gi in existing if gi.id in busy)
    room = room_meter(layout.profiles)
    choice = search(shapes, existing, pinned, busy, room)
    if choice is None and pinned:
        # Busy instances cannot all stay: plan as --force would, and name the blockers.
        choice = search(shapes, existing, (), busy, room)
    if choice is None:
        return GpuPlan(
            layout, desired, mode_change, infeasible=explain(shapes, layout), forced=force
        )
    kept, new = choice
    return _finish(layout, desired, mode_change, kept, new, force)


def _finish(
    layout: GpuLayout,
    desired: Desired,
    mode_change: ModeChange | None,
    kept: Sequence[GpuInstance],
    new: Sequence[tuple[Shape, Placement]],
    force: bool,
) -> GpuPlan:
    enabled = desired.mig_enabled
    current = layout.instances if layout.gpu.mig_mode and layout.gpu.mig_mode.current else ()
    kept_ids = {gi.id for gi in kept}
    destroy = tuple(gi for gi in current if gi.id not in kept_ids)
    create = tuple(
        GiState(s.profile.id, s.profile.name, p, tuple(CiState(c) for c in s.cis)) for s, p in new
    )
    target = GpuMigState(
        layout.gpu.uuid,
        enabled,
        tuple(sorted((*(gi_state(gi) for gi in kept), *create), key=lambda gi: gi.placement)),
    )
    blockers = _destroy_blockers(destroy, layout.processes)
    if mode_change is not None and mode_change.activation:
        blockers += _mode_blockers(layout.processes)
    occupied = 0
    for gi in target.instances:
        occupied |= slice_mask(gi.placement)
    return GpuPlan(
        layout,
        desired,
        mode_change,
        keep=tuple(kept),
        destroy=destroy,
        create=create,
        blockers=blockers,
        target=target,
        steps=converge_steps(layout, target),
        forced=force,
        free_region=largest_free(occupied, layout.total_memory_slices) if enabled else None,
    )


def _destroy_blockers(
    destroy: Sequence[GpuInstance], processes: Sequence[Process]
) -> tuple[Blocker, ...]:
    labels = {gi.id: f"{gi.profile_name}@{gi.placement}" for gi in destroy}
    return tuple(
        Blocker(p.pid, p.gpu_instance_id, labels[p.gpu_instance_id], "destroy")
        for p in processes
        if p.gpu_instance_id in labels
    )


def _mode_blockers(processes: Sequence[Process]) -> tuple[Blocker, ...]:
    # Processes on a GI are already named by the destroy of that GI.
    return tuple(
        Blocker(p.pid, None, "whole GPU", "MIG mode change")
        for p in processes
        if p.gpu_instance_id is None
    )


def converge_steps(layout: GpuLayout, target: GpuMigState) -> tuple[Step, ...]:
    """The NVML mutations that turn ``layout`` into ``target``: destroy, mode, create.

    Instances that already satisfy the target stay untouched; the rest is destroyed (CIs first,
    §7.5) and the missing ones are created at their exact placements with their CIs, widest first.
    Used for applies and, with a snapshot as the target, for rollbacks.
    """
    mode = layout.gpu.mig_mode
    current_on = bool(mode and mode.current)
    keep: set[int] = set()
    satisfied: set[Placement] = set()
    if current_on and target.mig_enabled:
        wanted = {gi.placement: gi for gi in target.instances}
        for gi in layout.instances:
            want = wanted.get(gi.placement)
            if want is not None and want.satisfied_by(gi_state(gi)):
                keep.add(gi.id)
                satisfied.add(gi.placement)
    steps: list[Step] = []
    for gi in layout.instances if current_on else ():
        if gi.id not in keep:
            label = f"{gi.profile_name}@{gi.placement}"
            steps += [DestroyCi(gi.id, ci.id, label) for ci in gi.compute_instances]
            steps.append(DestroyGi(gi.id, label))
    on = target.mig_enabled
    if mode is not None and (mode.current, mode.pending) != (on, on):
        steps.append(SetMigMode(target.mig_enabled))
        if mode.current != target.mig_enabled:
            steps.append(ResetGpu())
    for want in target.instances:
        if want.placement not in satisfied:
            steps.append(CreateGi(want.profile_id, want.profile_name, want.placement))
            cis = sorted(want.cis, key=lambda c: (-c.slices, c.start is None, c.start or 0))
            steps += [CreateCi(want.placement, want.label, ci) for ci in cis]
    return tuple(steps)


# -- assert ----------------------------------------------------------------------------------------


def mismatches(layout: GpuLayout, desired: Desired, *, mode_only: bool = False) -> tuple[str, ...]:
    """Why ``layout`` is not ``desired`` (empty when it is), with mig-parted's assert meaning.

    Equality is counts per profile name, placement ignored; stricter than mig-parted, a pending
    mode change and a GPU instance without a compute instance are mismatches too.
    """
    gpu = layout.gpu
    mode = gpu.mig_mode
    if mode is None:
        return (f"GPU {gpu.index} is not MIG-capable",) if desired.mig_enabled else ()
    want = _on_off(desired.mig_enabled)
    if mode.current != desired.mig_enabled:
        return (f"GPU {gpu.index}: MIG mode is {_on_off(mode.current)}, want {want}",)
    out: list[str] = []
    if mode.pending != desired.mig_enabled:
        out.append(f"GPU {gpu.index}: a MIG mode change is pending (want {want})")
    if mode_only or not desired.mig_enabled:
        return tuple(out)
    have = current_counts(layout)
    try:
        wanted = counts_of(resolve(desired, layout))
    except InvalidSpec as exc:
        return (*out, str(exc))
    if have != wanted:
        out.append(f"GPU {gpu.index}: has {_fmt_counts(have)}, want {_fmt_counts(wanted)}")
    out += [
        f"GPU {gpu.index}: GPU instance {gi.id} ({gi.profile_name}@{gi.placement}) "
        "has no compute instance"
        for gi in layout.instances
        if not gi.compute_instances
    ]
    return tuple(out)


def mig_parted_destroys(layout: GpuLayout, desired: Desired) -> int:
    """Instances mig-parted's apply would destroy for the same request (reference/mig.md §3.3).

    It clears a GPU whose counts per profile differ and every GPU whose mode changes; a GPU whose
    counts already match keeps everything, however its instances are placed.
    """
    mode = layout.gpu.mig_mode
    if mode is None or not mode.current:
        return 0
    if desired.mig_enabled and current_counts(layout) == counts_of(resolve(desired, layout)):
        return 0
    return len(layout.instances)


def _on_off(enabled: bool) -> str:
    return "enabled" if enabled else "disabled"


def _fmt_counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items()) or "no instances"
