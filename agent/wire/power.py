"""PowerService on the wire: each GPU's power limits, the spec in force, and what changed."""

from __future__ import annotations

from collections.abc import Iterable

from agent._proto.gpuagent.v1 import power_pb2
from agent.gpu.types import PowerLimits
from agent.power import Change, GpuPower, LostTarget, PowerResult, PowerView

__all__ = [
    "power_changes_from",
    "power_changes_pb",
    "power_lost_pb",
    "power_result_from",
    "power_view_from",
    "power_view_pb",
]


def power_view_pb(view: PowerView) -> power_pb2.GetPowerResponse:
    gpus = []
    for g in view.gpus:
        lim = g.limits
        gpus.append(
            power_pb2.GpuPower(
                index=g.index,
                uuid=g.uuid,
                name=g.name,
                min_mw=lim.min_mw,
                max_mw=lim.max_mw,
                default_mw=lim.default_mw,
                current_mw=lim.current_mw,
                enforced_mw=lim.enforced_mw,
                desired_mw=view.desired_mw.get(g.uuid),
                baseline_mw=view.baseline_mw.get(g.uuid),
            )
        )
    return power_pb2.GetPowerResponse(gpus=gpus, spec_yaml=view.spec_text)


def power_changes_pb(changes: Iterable[Change]) -> list[power_pb2.PowerChange]:
    return [
        power_pb2.PowerChange(
            index=c.index,
            uuid=c.uuid,
            before_mw=c.before_mw,
            after_mw=c.after_mw,
            requested_mw=c.requested_mw,
        )
        for c in changes
    ]


def power_view_from(pb: power_pb2.GetPowerResponse) -> PowerView:
    """`power_view_pb` inverted: a GPU without a desired or baseline limit has no entry."""
    gpus = tuple(
        GpuPower(
            g.index,
            g.uuid,
            g.name,
            PowerLimits(g.min_mw, g.max_mw, g.default_mw, g.current_mw, g.enforced_mw),
        )
        for g in pb.gpus
    )
    return PowerView(
        gpus=gpus,
        desired_mw={g.uuid: g.desired_mw for g in pb.gpus if g.HasField("desired_mw")},
        baseline_mw={g.uuid: g.baseline_mw for g in pb.gpus if g.HasField("baseline_mw")},
        spec_text=pb.spec_yaml,
    )


def power_changes_from(changes: Iterable[power_pb2.PowerChange]) -> list[Change]:
    """An agent that did not say what it asked for is taken to hold what it asked for."""
    return [
        Change(
            c.index,
            c.uuid,
            c.before_mw,
            c.after_mw,
            c.requested_mw if c.HasField("requested_mw") else c.after_mw,
        )
        for c in changes
    ]


def power_lost_pb(lost: Iterable[LostTarget]) -> list[power_pb2.PowerLostGpu]:
    return [
        power_pb2.PowerLostGpu(index=g.index, uuid=g.uuid, unsure=g.unsure, unread=g.unread)
        for g in lost
    ]


def power_result_from(
    pb: power_pb2.ApplyPowerResponse | power_pb2.RestorePowerResponse,
) -> PowerResult:
    """An ApplyPower or RestorePower answer; one from an agent that did not name the lost GPUs
    it is for names none."""
    lost = [LostTarget(g.index, g.uuid, g.unsure) for g in pb.lost_gpus]
    unread = [LostTarget(g.index, g.uuid, g.unsure, g.unread) for g in pb.unread_gpus]
    return PowerResult(power_changes_from(pb.changes), lost, unread)
