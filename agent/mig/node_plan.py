"""A mig-parted config over a node's GPUs, pure: plan it, assert it, export, checkpoint targets.

Functions of the node's layouts, whether the agent's driver read them (agent/mig/service.py)
or the CLI took them from GetNode's answer (agent/cli/mig.py: a checkpoint's targets), so both
run the same code. A plan is the agent's alone: the CLI draws PlanMig's answer. Each GPU's own
plan is agent/mig/plan.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.errors import Busy, Conflict, DeviceLost, FieldViolation, InvalidSpec
from agent.gpu.nvml import NvmlError
from agent.gpu.types import GpuInfo, GpuLayout, Placement
from agent.mig.desired import Desired, current_counts
from agent.mig.plan import GpuPlan, mismatches, plan_gpu
from agent.mig.spec import (
    ALL,
    DeviceFilter,
    ExportedGpu,
    MigConfigEntry,
    MigSpec,
    export_document,
    select_gpus,
)
from agent.mig.state import GiState, GpuMigState, fetch


@dataclass(frozen=True, slots=True)
class NodePlan:
    """A dry run: one plan per selected GPU, and the GPUs left alone."""

    config: str
    gpus: tuple[GpuPlan, ...]
    #: not MIG-capable and selected by ``devices: all``: skipped, as mig-parted does.
    skipped: tuple[GpuInfo, ...] = ()
    unselected: tuple[GpuInfo, ...] = ()
    #: the lost GPUs the config selects (or may): not planned, and an apply fails on them
    lost: tuple[int, ...] = ()
    #: the GPUs the config selects (or may) that answer but cannot be read, each with the
    #: failing call: not planned, and an apply fails on them
    unread: tuple[tuple[int, str], ...] = ()

    @property
    def changes(self) -> tuple[GpuPlan, ...]:
        return tuple(p for p in self.gpus if p.steps)


@dataclass(frozen=True, slots=True)
class AssertResult:
    config: str
    applied: bool
    mismatches: tuple[str, ...]
    #: the lost GPUs the config selects (or may): their lines are among ``mismatches``
    lost: tuple[int, ...] = ()
    #: the GPUs it selects (or may) that answer but cannot be read, each with the failing
    #: call: their lines are among ``mismatches`` too
    unread: tuple[tuple[int, str], ...] = ()

    @property
    def only_lost(self) -> bool:
        """Every GPU that can be read holds the config; only lost or unread ones keep it from
        being applied."""
        gone = len(self.lost) + len(self.unread)
        return bool(gone) and len(self.mismatches) == gone


def desired_of(entry: MigConfigEntry) -> Desired:
    """What a config entry asks of each GPU it selects."""
    return Desired(entry.mig_enabled, entry.mig_devices, entry.path)


def plan_layouts(
    spec: MigSpec,
    config: str | None,
    layouts: Sequence[GpuLayout],
    *,
    force: bool = False,
    mode_only: bool = False,
    lost: Sequence[GpuInfo] = (),
    unread: Mapping[int, str] | None = None,
) -> NodePlan:
    """``lost`` holds the unread GPUs too (``unread``: index -> the failing call): each
    selected is in the plan's ``lost`` or, with its call, its ``unread``."""
    name, entries = spec.select(config)
    plan = _plan_node(name, entries, tuple(layouts), force, mode_only)
    gone, not_read = gone_selected(entries, lost, unread)
    return replace(plan, lost=gone, unread=not_read)


def gone_said(index: int, unread: Mapping[int, str] | None) -> str:
    """ "GPU N is lost", or, for a GPU not lost whose read fails, "GPU N cannot be read (<call>:
    <error>)": what a refusal says of a GPU that does not answer."""
    why = (unread or {}).get(index)
    return f"GPU {index} cannot be read ({why})" if why else f"GPU {index} is lost"


def lost_selected(entries: Sequence[MigConfigEntry], lost: Sequence[GpuInfo]) -> tuple[int, ...]:
    """The lost GPUs the entries select, or may (one lost before the agent started is only an
    index, so a UUID or a device filter cannot be matched against it)."""
    return tuple(g.index for g in lost if any(entry.may_select(g) for entry in entries))


def gone_selected(
    entries: Sequence[MigConfigEntry],
    lost: Sequence[GpuInfo],
    unread: Mapping[int, str] | None,
) -> tuple[tuple[int, ...], tuple[tuple[int, str], ...]]:
    """The GPUs the entries select (or may) that do not answer: the lost ones, and those that
    answer but cannot be read, each with its failing call. ``lost`` holds the unread GPUs too
    (``unread``: index -> the failing call)."""
    why = unread or {}
    gone = lost_selected(entries, lost)
    return tuple(i for i in gone if i not in why), tuple((i, why[i]) for i in gone if i in why)


def check_layouts(
    spec: MigSpec,
    config: str | None,
    layouts: Sequence[GpuLayout],
    *,
    mode_only: bool = False,
    lost: Sequence[GpuInfo] = (),
    unread: Mapping[int, str] | None = None,
) -> AssertResult:
    """mig-parted's ``assert``: every GPU selected and matching (counts; placement ignored).
    A ``lost`` GPU the config selects (or one too unknown to tell) cannot be read, so the
    config is not known to be applied: never "applied" for what was not checked. ``lost``
    holds the unread GPUs too, each said with its failing call (``unread``: index -> why)."""
    name, entries = spec.select(config)
    not_answering, not_read = gone_selected(entries, lost, unread)
    gone = sorted([*not_answering, *(i for i, _ in not_read)])
    problems = [f"{gone_said(i, unread)}: whether it holds {name} cannot be read" for i in gone]
    chosen = {s.gpu.uuid: s for s in select_gpus(entries, [lay.gpu for lay in layouts])}
    for layout in layouts:
        gpu = layout.gpu
        selection = chosen.get(gpu.uuid)
        if selection is None:
            if gpu.mig_capable:
                problems.append(f"GPU {gpu.index} is not selected by any entry of {name}")
            continue
        if not gpu.mig_capable and selection.entry.devices == ALL:
            continue
        problems += mismatches(layout, desired_of(selection.entry), mode_only=mode_only)
    return AssertResult(name, not problems, tuple(problems), not_answering, not_read)


def refuse_lost(
    lost: Sequence[GpuInfo], consequence: str, unread: Mapping[int, str] | None = None
) -> None:
    """A snapshot of the node (an export, a checkpoint) without its lost GPUs would describe
    another node (``devices: all`` would claim them): refused, as mig-parted's NVML error is.
    An unread GPU among them (``unread``: index -> its failing call) is named with its call."""
    if any(gpu.index in (unread or {}) for gpu in lost):
        said = "; ".join(gone_said(gpu.index, unread) for gpu in lost)
        raise NvmlError(
            f"{said}: its MIG state cannot be read, so {consequence} (try again once it answers)"
        )
    if lost:
        gpus = ", ".join(str(gpu.index) for gpu in lost)
        raise DeviceLost(
            f"GPU {gpus} lost: its MIG state cannot be read, so {consequence} "
            "(try again once it answers)"
        )


def export_layouts(
    layouts: Sequence[GpuLayout],
    label: str = "current",
    lost: Sequence[GpuInfo] = (),
    unread: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """The layouts as a mig-parted v1 config named ``label`` (mig-parted ``export``); refused
    while a GPU is lost or unread."""
    refuse_lost(lost, "an export would not describe it", unread)
    gpus = []
    for layout in layouts:
        mode = layout.gpu.mig_mode
        enabled = bool(mode and mode.current)
        counts = current_counts(layout) if enabled else {}
        gpus.append(
            ExportedGpu(layout.gpu.index, str(DeviceFilter.of(layout.gpu)), enabled, counts)
        )
    return export_document(gpus, label)


def checkpoint_holds(
    states: Sequence[GpuMigState],
    layouts: Sequence[GpuLayout],
    *,
    mode_only: bool = False,
    lost: Sequence[GpuInfo] = (),
    unread: Mapping[int, str] | None = None,
) -> bool:
    """Whether every listed GPU is in its checkpointed state (mode only: its mode)."""
    targets = checkpoint_targets(states, layouts, mode_only, lost, unread)
    return all(same for _, _, same in targets)


def checkpoint_targets(
    states: Sequence[GpuMigState],
    layouts: Sequence[GpuLayout],
    mode_only: bool,
    lost: Sequence[GpuInfo] = (),
    unread: Mapping[int, str] | None = None,
) -> list[tuple[GpuInfo, GpuMigState, bool]]:
    """Each state with its GPU, profile names filled in; True where it already holds.
    InvalidSpec when the checkpoint names a GPU or a profile this node lacks, or a ``lost``
    one (said so: not "not on this node")."""
    by_uuid = {layout.gpu.uuid: layout for layout in layouts}
    bad = [
        FieldViolation(f"MigState.Devices[{i}].UUID", _missing(s.uuid, lost, unread))
        for i, s in enumerate(states)
        if s.uuid not in by_uuid
    ]
    out = []
    for i, s in enumerate(states):
        layout = by_uuid.get(s.uuid)
        if layout is None:
            continue
        s = _profile_ids(s, layout)
        names = {p.id: p.name for p in layout.profiles}
        bad += _gi_problems(f"MigState.Devices[{i}].GpuInstances", s, layout)
        now = fetch(layout)
        target = GpuMigState(
            s.uuid,
            s.mig_enabled,
            tuple(
                GiState(gi.profile_id, names.get(gi.profile_id, ""), gi.placement, gi.cis)
                for gi in s.instances
            ),
        )
        if mode_only:
            same_mode = now.mig_enabled == s.mig_enabled
            target = GpuMigState(s.uuid, s.mig_enabled, now.instances if same_mode else ())
        mode = layout.gpu.mig_mode
        settled = mode is None or mode.pending == mode.current
        out.append((layout.gpu, target, settled and target.satisfied_by(now)))
    if bad:
        raise InvalidSpec(f"the checkpoint does not fit this node: {bad[0].description}", bad)
    return out


def _profile_ids(state: GpuMigState, layout: GpuLayout) -> GpuMigState:
    """The checkpoint's GPU instance profiles as this GPU's profile ids. mig-parted's
    ``ProfileID`` is the NVML profile constant (agent/mig/checkpoint.py); one no profile of
    this GPU has with the placement's size is taken as an id, as agents before this one wrote
    it (no constant and id of one board name profiles of the same size: reference/mig.md §1.2)."""
    by_constant = {p.constant: p for p in layout.profiles}

    def resolved(gi: GiState) -> GiState:
        p = by_constant.get(gi.profile_id)
        if p is None or p.memory_slices != gi.placement.size:
            return gi
        return GiState(p.id, gi.profile_name, gi.placement, gi.cis)

    return GpuMigState(state.uuid, state.mig_enabled, tuple(map(resolved, state.instances)))


def _gi_problems(field: str, state: GpuMigState, layout: GpuLayout) -> list[FieldViolation]:
    """What of a checkpointed GPU's instances its driver would refuse midway (an unknown
    profile, a placement the profile has not, two that overlap): refused before any change."""
    profiles = {p.id: p for p in layout.profiles}
    bad: list[str] = []
    placed: list[Placement] = []
    for gi in state.instances:
        profile = profiles.get(gi.profile_id)
        if profile is None:
            bad.append(f"GPU {state.uuid} has no GPU instance profile id {gi.profile_id}")
        elif gi.placement not in profile.placements:
            offered = ", ".join(str(p) for p in profile.placements)
            bad.append(
                f"GPU {state.uuid}: {profile.name} has no placement {gi.placement} "
                f"(its placements: {offered})"
            )
        elif any(gi.placement.overlaps(other) for other in placed):
            bad.append(f"GPU {state.uuid}: two GPU instances overlap at {gi.placement}")
        else:
            placed.append(gi.placement)
    return [FieldViolation(field, what) for what in bad]


def _missing(uuid: str, lost: Sequence[GpuInfo], unread: Mapping[int, str] | None) -> str:
    """Why a checkpointed GPU is not among those that answer: lost or unread, maybe lost, or
    absent."""
    known = next((g for g in lost if g.uuid == uuid), None)
    if known is not None:
        if known.index in (unread or {}):
            return f"{gone_said(known.index, unread)}: GPU {uuid} cannot be restored"
        return f"GPU {known.index} ({uuid}) is lost: it cannot be restored"
    unknown = [str(g.index) for g in lost if not g.uuid]
    if unknown:
        return (
            f"no GPU {uuid} among those that answer; GPU {', '.join(unknown)} is lost and its "
            "UUID cannot be read: it may be this one"
        )
    return f"no GPU {uuid} on this node"


def _plan_node(
    name: str,
    entries: tuple[MigConfigEntry, ...],
    layouts: tuple[GpuLayout, ...],
    force: bool,
    mode_only: bool = False,
) -> NodePlan:
    by_uuid = {layout.gpu.uuid: layout for layout in layouts}
    selections = select_gpus(entries, [layout.gpu for layout in layouts])
    plans: list[GpuPlan] = []
    skipped: list[GpuInfo] = []
    for selection in selections:
        if not selection.gpu.mig_capable and selection.entry.devices == ALL:
            skipped.append(selection.gpu)
            continue
        layout = by_uuid[selection.gpu.uuid]
        desired = desired_of(selection.entry)
        if mode_only:
            desired = _mode_only_desired(layout, desired)
        plans.append(plan_gpu(layout, desired, force=force))
    chosen = {s.gpu.uuid for s in selections}
    unselected = tuple(layout.gpu for layout in layouts if layout.gpu.uuid not in chosen)
    return NodePlan(name, tuple(plans), tuple(skipped), unselected)


def _mode_only_desired(layout: GpuLayout, desired: Desired) -> Desired:
    """The mode of ``desired`` and nothing else: a GPU already in that mode keeps its instances
    (a pending change is only cancelled); one switched gets no instances."""
    mode = layout.gpu.mig_mode
    keep = mode is not None and mode.current == desired.mig_enabled and desired.mig_enabled
    counts = tuple(current_counts(layout).items()) if keep else ()
    return Desired(desired.mig_enabled, counts, desired.source)


def refuse_unless_feasible(plan: NodePlan) -> None:
    """Raise before any change when some GPU cannot reach its layout."""
    infeasible = [p for p in plan.gpus if p.status == "infeasible"]
    if infeasible:
        raise Conflict(
            f"MIG config {plan.config} cannot be applied: "
            + "; ".join(
                f"GPU {p.layout.gpu.index} ({p.layout.gpu.name}): {p.problem}" for p in infeasible
            )
        )
    blockers = [
        f"GPU {p.layout.gpu.index}: {b}"
        for p in plan.gpus
        if p.status == "blocked"
        for b in p.blockers
    ]
    if blockers:
        raise Busy(
            f"MIG config {plan.config} needs changes that running processes block: "
            + "; ".join(blockers)
            + " (stop them, or pass --force to try anyway)",
            blockers,
        )
