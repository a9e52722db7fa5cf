"""MigService on the wire: plans, advice and apply results as messages.

An apply's result is stored on its operation as this message's JSON, so a client reads a
finished apply as the operation's response.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent._proto.gpuagent.v1 import mig_pb2, operations_pb2
from agent.gpu.types import GpuLayout
from agent.mig.advice import GpuAdvice, moves_to_fit
from agent.mig.node_plan import AssertResult, NodePlan
from agent.mig.plan import GpuPlan, mig_parted_destroys
from agent.wire.node import memory_slices

if TYPE_CHECKING:  # the server's side only: clients load no MIG service
    from agent.mig.outcomes import ApplyResult, RecoveryOutcome

__all__ = [
    "AdvisedGpu",
    "AdvisedMove",
    "AdvisedPlacement",
    "AdvisedProfile",
    "GpuReset",
    "MigPlanView",
    "PlanBlocker",
    "PlanCollision",
    "PlannedGpu",
    "PlannedInstance",
    "PlannedModeChange",
    "advice_from",
    "apply_result_pb",
    "assert_from",
    "assert_pb",
    "gpu_advice_pb",
    "gpu_plan_pb",
    "node_plan_pb",
    "plan_from",
    "plan_status_of",
    "recovered_apply_pb",
    "reset_from",
]

_STATUS = {
    "unchanged": mig_pb2.MIG_PLAN_STATUS_UNCHANGED,
    "change": mig_pb2.MIG_PLAN_STATUS_CHANGE,
    "blocked": mig_pb2.MIG_PLAN_STATUS_BLOCKED,
    "infeasible": mig_pb2.MIG_PLAN_STATUS_INFEASIBLE,
}


_STATUS_FROM = {pb: status for status, pb in _STATUS.items()}


def plan_status_of(status: mig_pb2.MigPlanStatus) -> str:
    """A GPU plan's status as the domain names it (`GpuPlan.status`); "unknown" for a value
    this client does not know."""
    return _STATUS_FROM.get(status, "unknown")


#: What applies a pending MIG mode (`GpuMigPlan.mode_pending`).
REBOOT_APPLIES = "a reboot of this (passthrough) VM"
RESET_APPLIES = "a GPU reset"


def gpu_plan_pb(plan: GpuPlan, reboot: frozenset[str] = frozenset()) -> mig_pb2.GpuMigPlan:
    """``reboot``: the GPUs whose pending mode waits for a reboot of this VM, not a reset."""
    gpu = plan.layout.gpu
    pending = gpu.mig_mode is not None and gpu.mig_mode.is_pending
    why = plan.infeasible
    change = plan.mode_change
    return mig_pb2.GpuMigPlan(
        gpu_index=gpu.index,
        gpu_uuid=gpu.uuid,
        status=_STATUS[plan.status],
        steps=[str(s) for s in plan.steps],
        blockers=[
            mig_pb2.MigBlocker(pid=b.pid & 0xFFFFFFFF, instance=b.instance, change=b.change)
            for b in plan.blockers
        ],
        infeasible_reason=why.reason if why else "",
        keep=[f"{gi.profile_name}@{gi.placement}" for gi in plan.keep],
        destroy=[f"{gi.profile_name}@{gi.placement}" for gi in plan.destroy],
        create=[gi.label for gi in plan.create],
        deferred=plan.deferred,
        mode_pending=(REBOOT_APPLIES if gpu.uuid in reboot else RESET_APPLIES) if pending else "",
        entry=plan.desired.source,
        gpu_name=gpu.name,
        mode_change=None
        if change is None
        else mig_pb2.MigModeChange(enable=change.enable, reset_needed=change.activation),
        keep_gpu_instance_ids=[gi.id for gi in plan.keep],
        destroy_gpu_instance_ids=[gi.id for gi in plan.destroy],
        after=_after_pb(plan),
        memory_slices=plan.layout.total_memory_slices,
        # an infeasible layout has no counts mig-parted would compare
        mig_parted_would_destroy=0 if why else mig_parted_destroys(plan.layout, plan.desired),
        free_region="" if plan.free_region is None else str(plan.free_region),
        **_infeasible_pb(plan),
    )


def _after_pb(plan: GpuPlan) -> list[mig_pb2.MigPlannedInstance]:
    """The instances the plan leads to; none when MIG ends off or nothing is planned."""
    if plan.target is None or not plan.target.mig_enabled:
        return []
    kept = {gi.placement for gi in plan.keep}
    return [
        mig_pb2.MigPlannedInstance(
            profile=gi.profile_name,
            start=gi.placement.start,
            size=gi.placement.size,
            compute_instances=len(gi.cis),
            kept=gi.placement in kept,
        )
        for gi in plan.target.instances
    ]


def _infeasible_pb(plan: GpuPlan) -> dict[str, Any]:
    why = plan.infeasible
    if why is None:
        return {}
    return {
        "fits_instead": _counts_pb(why.fits_instead),
        "infeasible_profile": why.profile or "",
        "collisions": [
            mig_pb2.MigCollision(
                placement=str(c.placement), blocked_by=c.blocked_by, slices=c.slices
            )
            for c in why.collisions
        ],
    }


def gpu_advice_pb(advice: GpuAdvice, layout: GpuLayout) -> mig_pb2.GpuMigAdvice:
    """The advice as the API sends it, with the moves that fit each fragmented profile."""
    profiles = []
    for p in advice.profiles:
        found = moves_to_fit(layout, p.profile) if p.fragmented else None
        moves, start = found if found is not None else ((), None)
        profiles.append(
            mig_pb2.MigProfileAdvice(
                profile=p.profile,
                placements=[
                    mig_pb2.MigPlacementAdvice(
                        start=o.placement.start,
                        size=o.placement.size,
                        fits_after=_counts_pb(o.fits_after),
                        largest_after=o.largest_after or "",
                        recommended=o.placement == p.recommended,
                    )
                    for o in p.placements
                ],
                reason=p.reason,
                fragmented=p.fragmented,
                moves=[
                    mig_pb2.MigMove(
                        profile=m.profile,
                        gpu_instance_id=m.gpu_instance,
                        from_start=m.source.start,
                        to_start=m.target.start,
                        busy=m.busy,
                    )
                    for m in moves
                ],
                start_after_moves=None if start is None else start.start,
            )
        )
    return mig_pb2.GpuMigAdvice(
        gpu_index=advice.index,
        gpu_uuid=advice.uuid,
        model=advice.model,
        free_slices=advice.free_slices,
        memory_slices=advice.width,
        fits_now=_counts_pb(advice.fits_now),
        profiles=profiles,
        note=advice.note,
    )


def _counts_pb(counts: Sequence[tuple[str, int]]) -> list[mig_pb2.MigProfileCount]:
    return [mig_pb2.MigProfileCount(profile=name, count=n) for name, n in counts]


def node_plan_pb(plan: NodePlan, reboot: frozenset[str] = frozenset()) -> mig_pb2.PlanMigResponse:
    return mig_pb2.PlanMigResponse(
        config_name=plan.config,
        gpus=[gpu_plan_pb(p, reboot) for p in plan.gpus],
        unselected_gpus=[g.index for g in plan.unselected],
        skipped_gpus=[g.index for g in plan.skipped],
        **_gone_pb(plan.lost, plan.unread),
    )


def _gone_pb(lost: Sequence[int], unread: Sequence[tuple[int, str]]) -> dict[str, Any]:
    """``lost_gpus`` and ``unread_gpus`` of PlanMig's and AssertMig's answers. The unread are
    in ``lost_gpus`` too: a client from before ``unread_gpus`` must not read them as planned
    or held (`_gone_from` takes them out)."""
    return {
        "lost_gpus": sorted({*lost, *(i for i, _ in unread)}),
        "unread_gpus": [mig_pb2.MigUnreadGpu(index=i, unread=why) for i, why in unread],
    }


def _gone_from(
    response: mig_pb2.PlanMigResponse | mig_pb2.AssertMigResponse,
) -> tuple[tuple[int, ...], tuple[tuple[int, str], ...]]:
    """`_gone_pb` read back: the lost GPUs (those of an agent from before ``unread_gpus``
    include the unread), and the unread ones with their failing call."""
    unread = {g.index for g in response.unread_gpus}
    return (
        tuple(i for i in response.lost_gpus if i not in unread),
        tuple((g.index, g.unread) for g in response.unread_gpus),
    )


def apply_result_pb(result: ApplyResult) -> operations_pb2.OperationResponse:
    return operations_pb2.OperationResponse(
        mig_apply=operations_pb2.MigApplyResult(
            config_name=result.config,
            changed_gpu_uuids=[g.uuid for g in result.gpus if g.status != "unchanged"],
            changed=result.mutations > 0,
            gpus=[
                operations_pb2.MigGpuOutcome(
                    gpu_index=g.gpu,
                    gpu_uuid=g.uuid,
                    status=g.status,
                    kept=g.kept,
                    destroyed=g.destroyed,
                    created=g.created,
                    message=g.message,
                )
                for g in result.gpus
            ],
            mutations=result.mutations,
            recovered=[f"GPU {r.gpu}: {r.action} ({r.detail})" for r in result.recovered],
            device_plugin=result.device_plugin,
            assert_mismatches=result.assert_mismatches,
        )
    )


def recovered_apply_pb(outcomes: Sequence[RecoveryOutcome]) -> operations_pb2.OperationResponse:
    """The result of an apply the agent was killed in and finished on its next start."""
    return operations_pb2.OperationResponse(
        mig_apply=operations_pb2.MigApplyResult(
            changed_gpu_uuids=[o.uuid for o in outcomes],
            changed=True,
            recovered=[f"GPU {o.gpu}: {o.action} ({o.detail})" for o in outcomes],
        )
    )


# -- plans and resets, back into records, for clients --------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanBlocker:
    """A process that keeps a GPU's plan from being applied."""

    pid: int
    instance: str
    change: str


@dataclass(frozen=True, slots=True)
class PlannedModeChange:
    """The MIG mode change a plan makes (`GpuMigPlan.mode_change`)."""

    enable: bool
    #: the current mode differs (a GPU reset unless the driver switches at once); False when
    #: only a pending opposite change is cancelled
    reset_needed: bool


@dataclass(frozen=True, slots=True)
class PlannedInstance:
    """One GPU instance of the layout a plan leads to."""

    profile: str
    start: int
    size: int
    compute_instances: int
    #: it exists now and stays (False: the apply creates it)
    kept: bool


@dataclass(frozen=True, slots=True)
class PlanCollision:
    """A placement an infeasible profile could take, and the planned instances holding it."""

    placement: str
    blocked_by: tuple[str, ...]
    slices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PlannedGpu:
    """`gpu_plan_pb` read back: what applying the config would do to one GPU."""

    gpu_index: int
    gpu_uuid: str
    #: unchanged, change, blocked, infeasible (`GpuPlan.status`); unknown for a status this
    #: client does not know
    status: str
    steps: tuple[str, ...]
    blockers: tuple[PlanBlocker, ...]
    infeasible_reason: str
    keep: tuple[str, ...]
    destroy: tuple[str, ...]
    create: tuple[str, ...]
    deferred: bool
    #: the MIG mode change it already waits for, and what applies it ("": none)
    mode_pending: str = ""
    #: the config entry that selects it ("mig-configs.x[0]")
    entry: str = ""
    gpu_name: str = ""
    mode_change: PlannedModeChange | None = None
    #: what would fit instead, when infeasible
    fits_instead: tuple[tuple[str, int], ...] = ()
    #: the GPU-instance ids of ``keep`` and ``destroy``, in their order
    keep_ids: tuple[int, ...] = ()
    destroy_ids: tuple[int, ...] = ()
    #: the instances after the apply (none when MIG ends off or nothing is planned)
    after: tuple[PlannedInstance, ...] = ()
    memory_slices: int = 0
    mig_parted_would_destroy: int = 0
    #: the largest free region left ("start:size"; "" when none)
    free_region: str = ""
    infeasible_profile: str = ""
    collisions: tuple[PlanCollision, ...] = ()


@dataclass(frozen=True, slots=True)
class MigPlanView:
    """`node_plan_pb` read back: PlanMig's answer."""

    config_name: str
    gpus: tuple[PlannedGpu, ...]
    unselected_gpus: tuple[int, ...]
    skipped_gpus: tuple[int, ...]
    #: the lost GPUs the config selects, or may: not planned; an apply fails on them
    lost_gpus: tuple[int, ...] = ()
    #: (index, the failing call) of the GPUs it selects, or may, that answer but cannot be
    #: read: not planned; an apply fails on them (an agent from before put them in lost_gpus)
    unread_gpus: tuple[tuple[int, str], ...] = ()


def plan_from(response: mig_pb2.PlanMigResponse) -> MigPlanView:
    lost, unread = _gone_from(response)
    return MigPlanView(
        config_name=response.config_name,
        gpus=tuple(_planned_gpu(g) for g in response.gpus),
        unselected_gpus=tuple(response.unselected_gpus),
        skipped_gpus=tuple(response.skipped_gpus),
        lost_gpus=lost,
        unread_gpus=unread,
    )


def _planned_gpu(g: mig_pb2.GpuMigPlan) -> PlannedGpu:
    change = g.mode_change if g.HasField("mode_change") else None
    return PlannedGpu(
        gpu_index=g.gpu_index,
        gpu_uuid=g.gpu_uuid,
        status=plan_status_of(g.status),
        steps=tuple(g.steps),
        blockers=tuple(PlanBlocker(b.pid, b.instance, b.change) for b in g.blockers),
        infeasible_reason=g.infeasible_reason,
        keep=tuple(g.keep),
        destroy=tuple(g.destroy),
        create=tuple(g.create),
        deferred=g.deferred,
        mode_pending=g.mode_pending,
        entry=g.entry,
        gpu_name=g.gpu_name,
        mode_change=None
        if change is None
        else PlannedModeChange(change.enable, change.reset_needed),
        fits_instead=tuple((c.profile, c.count) for c in g.fits_instead),
        keep_ids=tuple(g.keep_gpu_instance_ids),
        destroy_ids=tuple(g.destroy_gpu_instance_ids),
        after=tuple(
            PlannedInstance(
                i.profile,
                memory_slices(i.start, "after.start"),
                memory_slices(i.size, "after.size"),
                i.compute_instances,
                i.kept,
            )
            for i in g.after
        ),
        memory_slices=memory_slices(g.memory_slices, "memory_slices"),
        mig_parted_would_destroy=g.mig_parted_would_destroy,
        free_region=g.free_region,
        infeasible_profile=g.infeasible_profile,
        collisions=tuple(
            PlanCollision(c.placement, tuple(c.blocked_by), tuple(c.slices)) for c in g.collisions
        ),
    )


@dataclass(frozen=True, slots=True)
class GpuReset:
    """ResetGpu's answer: the GPU, and whether it was reset (False for a validate-only call)."""

    gpu_uuid: str
    reset: bool


def reset_from(response: mig_pb2.ResetGpuResponse) -> GpuReset:
    return GpuReset(response.gpu_uuid, response.reset)


def assert_pb(result: AssertResult) -> mig_pb2.AssertMigResponse:
    return mig_pb2.AssertMigResponse(
        matches=result.applied,
        mismatches=result.mismatches,
        config_name=result.config,
        **_gone_pb(result.lost, result.unread),
    )


def assert_from(response: mig_pb2.AssertMigResponse) -> AssertResult:
    return AssertResult(
        response.config_name,
        response.matches,
        tuple(response.mismatches),
        *_gone_from(response),
    )


# -- advice, back into records, for clients -------------------------------------------------------

Counts = tuple[tuple[str, int], ...]  # (profile, how many more instances fit)


@dataclass(frozen=True, slots=True)
class AdvisedPlacement:
    start: int
    size: int
    #: what would still fit after an instance here
    fits_after: Counts
    #: the largest profile still placeable after it ("" when none)
    largest_after: str
    recommended: bool


@dataclass(frozen=True, slots=True)
class AdvisedMove:
    """An existing instance that, moved, would make room for a fragmented profile."""

    profile: str
    gpu_instance_id: int
    from_start: int
    to_start: int
    busy: bool


@dataclass(frozen=True, slots=True)
class AdvisedProfile:
    profile: str
    placements: tuple[AdvisedPlacement, ...]
    reason: str
    fragmented: bool
    moves: tuple[AdvisedMove, ...]
    #: where the profile would fit once ``moves`` are made; None without moves
    start_after_moves: int | None


@dataclass(frozen=True, slots=True)
class AdvisedGpu:
    """`gpu_advice_pb` read back: one GPU's placement advice."""

    gpu_index: int
    gpu_uuid: str
    model: str
    free_slices: tuple[int, ...]
    memory_slices: int
    fits_now: Counts
    profiles: tuple[AdvisedProfile, ...]
    #: why there is no placement advice (e.g. MIG off), "" when there is
    note: str


def advice_from(response: mig_pb2.AdviseMigResponse) -> tuple[AdvisedGpu, ...]:
    return tuple(_gpu_advice_from(g) for g in response.gpus)


def _counts_from(counts: Sequence[mig_pb2.MigProfileCount]) -> Counts:
    return tuple((c.profile, c.count) for c in counts)


def _gpu_advice_from(g: mig_pb2.GpuMigAdvice) -> AdvisedGpu:
    return AdvisedGpu(
        gpu_index=g.gpu_index,
        gpu_uuid=g.gpu_uuid,
        model=g.model,
        free_slices=tuple(g.free_slices),
        memory_slices=g.memory_slices,
        fits_now=_counts_from(g.fits_now),
        profiles=tuple(
            AdvisedProfile(
                profile=p.profile,
                placements=tuple(
                    AdvisedPlacement(
                        o.start, o.size, _counts_from(o.fits_after), o.largest_after, o.recommended
                    )
                    for o in p.placements
                ),
                reason=p.reason,
                fragmented=p.fragmented,
                moves=tuple(
                    AdvisedMove(m.profile, m.gpu_instance_id, m.from_start, m.to_start, m.busy)
                    for m in p.moves
                ),
                start_after_moves=(
                    p.start_after_moves if p.HasField("start_after_moves") else None
                ),
            )
            for p in g.profiles
        ),
        note=g.note,
    )
