"""What the agent sends, its clients read back as the records it was made from (agent/wire)."""

from __future__ import annotations

from pathlib import Path

from agent._proto.gpuagent.v1 import agent_pb2, mig_pb2, power_pb2
from agent.errors import Busy
from agent.gpu.types import PowerLimits
from agent.health.machine import Mark, State
from agent.mig.desired import Desired
from agent.mig.node_plan import AssertResult, NodePlan
from agent.mig.outcomes import ApplyResult as MigApplyResult
from agent.mig.outcomes import GpuOutcome
from agent.mig.plan import plan_gpu
from agent.operation import Operation
from agent.power import Change, GpuPower, LostTarget, PowerResult, PowerView
from agent.sharing import Advertised, ApplyResult, ReloadReport, parse
from agent.telemetry.snapshot import (
    Entity,
    EntitySample,
    GpuIdentity,
    GpuStatus,
    InstanceIdentity,
    PodRef,
    PodUsage,
    Snapshot,
)
from agent.wire.errors import error_record
from agent.wire.mig import (
    GpuReset,
    PlannedModeChange,
    apply_result_pb,
    assert_from,
    assert_pb,
    node_plan_pb,
    plan_from,
    reset_from,
)
from agent.wire.node import gpu_pb, health_mark_pb, node_from
from agent.wire.operations import message_dict, operation_from, operation_pb
from agent.wire.power import (
    power_changes_from,
    power_changes_pb,
    power_lost_pb,
    power_result_from,
    power_view_from,
    power_view_pb,
)
from agent.wire.sharing import sharing_change_from, sharing_change_pb
from agent.wire.telemetry import snapshot_pb, telemetry_from
from tests.unit.sharing.layouts import full_gpu, mig_gpu

_TS2 = """\
version: v1
sharing:
  timeSlicing:
    resources:
    - {name: nvidia.com/gpu, replicas: 2}
"""


def test_power_reads_back_as_its_view_and_changes() -> None:
    gpu = GpuPower(0, "GPU-0", "H100", PowerLimits(200_000, 700_000, 700_000, 500_000, 500_000))
    view = PowerView((gpu,), {"GPU-0": 500_000}, {}, "version: v1\n")
    assert power_view_from(power_view_pb(view)) == view
    # GPU 1: another writer on the host holds 450 W where 500 W was set
    changes = [
        Change(0, "GPU-0", 700_000, 500_000, 500_000),
        Change(1, "GPU-1", 700_000, 450_000, 500_000),
    ]
    assert power_changes_from(power_changes_pb(changes)) == changes
    # An agent that did not say what it set is taken to hold it.
    (old,) = power_changes_pb(changes[:1])
    old.ClearField("requested_mw")
    assert power_changes_from([old])[0].held
    lost = [LostTarget(3, "GPU-3"), LostTarget(5, "", "its model is unknown")]
    answer = power_pb2.ApplyPowerResponse(
        changes=power_changes_pb(changes), lost_gpus=power_lost_pb(lost)
    )
    assert power_result_from(answer) == PowerResult(changes, lost)


def test_a_sharing_change_reads_back_as_its_result() -> None:
    result = ApplyResult(
        action="set",
        changed=True,
        config_path=Path("/etc/plugin/config.yaml"),
        config=parse(_TS2),
        advertised=(Advertised("nvidia.com/gpu", 8, 2),),
        reload=ReloadReport("signal", True, "SIGHUP sent", 1_800_000_000.0, (42,)),
    )
    assert sharing_change_from(sharing_change_pb(result)) == result


def test_a_node_reads_back_with_its_layouts_marks_and_lost_gpus() -> None:
    whole, split = full_gpu(0), mig_gpu(1, "3g.40gb")
    gpus = [gpu_pb(whole), gpu_pb(split, lost=True, lost_detail="gone")]
    failed = Mark(State.FAILED, "XID 79", 1_800_000_000.0, "reboot-node", ("ml/train-0",))
    gpus[0].condition.CopyFrom(health_mark_pb(failed, failed.reason))
    gpus[1].instances[0].condition.CopyFrom(health_mark_pb(Mark(), ""))
    node = node_from(agent_pb2.Node(name="n", gpus=gpus))
    assert [g.layout.gpu for g in node.gpus] == [whole.gpu, split.gpu]
    assert node.gpus[1].layout.instances == split.instances
    assert [(g.lost, g.detail) for g in node.gpus] == [(False, ""), (True, "gone")]
    assert node.gpus[0].condition == failed
    assert node.gpus[1].condition is None  # not judged yet
    gi = split.instances[0].id
    assert node.gpus[1].instance_conditions == {gi: Mark(State.HEALTHY, "", 0.0, "none", ())}


def test_an_operation_reads_back_with_its_result_or_its_error() -> None:
    applied = MigApplyResult("all-1g", (GpuOutcome(0, "GPU-0", "applied", 0, 1, 7),), 8)
    done = Operation(
        "ab12",
        "mig.apply",
        "succeeded",
        None,
        {},
        {},
        message_dict(apply_result_pb(applied)),
        None,
        1.0,
        2.0,
        False,
    )
    view = operation_from(operation_pb(done))
    assert (view.name, view.state, view.done, view.error) == (
        "operations/ab12",
        "succeeded",
        True,
        None,
    )
    assert view.mig_result is not None and view.mig_result.mutations == 8
    assert [(g.gpu_index, g.status, g.created) for g in view.mig_result.gpus] == [(0, "applied", 7)]
    busy = Busy("GPU 0 is in use", ["pid 42"])
    failed = Operation(
        "cd34", "mig.apply", "failed", None, {}, {}, None, error_record(busy), 1.0, 2.0, False
    )
    error = operation_from(operation_pb(failed)).error
    assert (
        isinstance(error, Busy) and tuple(error.blockers) == ("pid 42",) and str(error) == str(busy)
    )


def test_an_apply_that_selected_no_gpu_reads_back_with_why_its_assert_fails() -> None:
    """`mig apply` warns with these lines from the apply's own result (no second call)."""
    applied = MigApplyResult("h100", (), 0, assert_mismatches=("GPU 0 is not selected",))
    result = message_dict(apply_result_pb(applied))
    done = Operation("ab12", "mig.apply", "succeeded", None, {}, {}, result, None, 1.0, 2.0, False)
    view = operation_from(operation_pb(done))
    assert view.mig_result is not None
    assert view.mig_result.assert_mismatches == ("GPU 0 is not selected",)


def test_an_assert_reads_back_with_its_lost_and_unread_gpus() -> None:
    """AssertMig as `mig assert` prints it: the verdict, every mismatch, the lost GPUs and
    those that cannot be read, each with its failing call."""
    unread = ((4, "nvmlDeviceGetMigMode: Unknown Error"),)
    said = ("GPU 3 is lost: …", "GPU 4 cannot be read (nvmlDeviceGetMigMode: …): …")
    result = AssertResult("all-1g", False, said, (3,), unread)
    answer = assert_pb(result)
    assert assert_from(answer) == result
    # A client from before unread_gpus reads lost_gpus alone: GPU 4 must not read as held.
    assert list(answer.lost_gpus) == [3, 4]


def test_a_mig_plan_reads_back_gpu_by_gpu_with_its_steps_and_instances() -> None:
    """PlanMig as both clients read it (`plan_from`): each GPU's status, steps, the instances
    kept, destroyed and created, and the GPUs left out; a status from a newer agent is
    "unknown", not an error."""
    split, whole, other = mig_gpu(0, "3g.40gb", "3g.40gb"), full_gpu(1), full_gpu(2)
    plans = (
        plan_gpu(split, Desired(True, (("3g.40gb", 1), ("1g.10gb", 4)))),
        plan_gpu(whole, Desired(True, (("7g.80gb", 1),))),
        plan_gpu(whole, Desired(True, (("7g.80gb", 2),))),
    )
    unread = ((4, "nvmlDeviceGetMigMode: Unknown Error"),)
    plan = NodePlan("mixed", plans, unselected=(other.gpu,), lost=(3,), unread=unread)
    answer = node_plan_pb(plan)
    view = plan_from(answer)
    assert (view.config_name, view.unselected_gpus, view.skipped_gpus) == ("mixed", (2,), ())
    assert (view.lost_gpus, view.unread_gpus) == ((3,), unread)
    # A client from before unread_gpus reads lost_gpus alone: GPU 4 must not read as planned.
    assert list(answer.lost_gpus) == [3, 4]
    for domain, read in zip(plans, view.gpus, strict=True):
        assert (read.gpu_index, read.gpu_uuid) == (domain.layout.gpu.index, domain.layout.gpu.uuid)
        assert read.status == domain.status
        assert read.steps == tuple(str(s) for s in domain.steps)
        assert read.create == tuple(gi.label for gi in domain.create)
        assert read.keep == tuple(f"{gi.profile_name}@{gi.placement}" for gi in domain.keep)
        assert read.destroy == tuple(f"{gi.profile_name}@{gi.placement}" for gi in domain.destroy)
        assert read.deferred == domain.deferred
        # what `mig plan` draws of the agent's plan: entry, ids, the layout after, the mode
        assert (read.entry, read.gpu_name) == (domain.desired.source, domain.layout.gpu.name)
        assert read.keep_ids == tuple(gi.id for gi in domain.keep)
        assert read.destroy_ids == tuple(gi.id for gi in domain.destroy)
        assert read.memory_slices == domain.layout.total_memory_slices
        after = () if domain.target is None else domain.target.instances
        assert [(i.profile, i.start, i.size) for i in read.after] == [
            (gi.profile_name, gi.placement.start, gi.placement.size) for gi in after
        ]
        change = domain.mode_change
        assert read.mode_change == (
            None if change is None else PlannedModeChange(change.enable, change.activation)
        )
    assert [p.status for p in view.gpus] == ["change", "change", "infeasible"]
    assert [i.kept for i in view.gpus[0].after].count(True) == 1
    assert view.gpus[0].mig_parted_would_destroy == 2  # its counts differ: mig-parted clears it
    why = plans[2].infeasible
    assert why is not None and view.gpus[2].fits_instead == why.fits_instead
    assert view.gpus[2].infeasible_profile == (why.profile or "")
    assert [c.placement for c in view.gpus[2].collisions] == [
        str(c.placement) for c in why.collisions
    ]
    one, two = (f"{gi.profile_name}@{gi.placement}" for gi in split.instances)
    assert {view.gpus[0].keep, view.gpus[0].destroy} == {(one,), (two,)}
    assert view.gpus[2].infeasible_reason == plans[2].infeasible.reason  # type: ignore[union-attr]
    newer = mig_pb2.PlanMigResponse(gpus=[mig_pb2.GpuMigPlan(gpu_index=0, status=99)])  # type: ignore[arg-type]
    assert plan_from(newer).gpus[0].status == "unknown"


def test_a_telemetry_snapshot_reads_back_per_entity_and_withholds_pods_when_asked() -> None:
    """GetTelemetrySnapshot as the coordinator reads it (`telemetry_from`): values by field id,
    the MIG instance of a sample, the pod on it, idle time and per-container use; an unknown
    value stays unknown (None), never 0."""
    gpu = GpuIdentity(0, "GPU-0", "NVIDIA H100 80GB HBM3", "00000000:18:00.0", 0)
    mig = Entity(gpu, InstanceIdentity(7, "3g.40gb"))
    pod = PodRef("ml", "train-0", "main")
    snapshot = Snapshot(
        taken_at=1_800_000_000.5,
        hostname="node-a",
        driver_version="570.86.15",
        nvml_version="12.570.86.15",
        gpus=(GpuStatus(gpu, True),),
        entities=(
            EntitySample(Entity(gpu), {150: 41.0, 1004: 0.25}, None, 12.0),
            EntitySample(mig, {1004: 0.5}, pod, None),
        ),
        pods=(PodUsage(mig, pod, 2.0e9, None),),
    )
    view = telemetry_from(snapshot_pb(snapshot))
    assert (view.taken_at, view.hostname, view.driver_version) == (
        1_800_000_000.5,
        "node-a",
        "570.86.15",
    )
    whole, part = view.samples
    assert (whole.entity.gpu_instance_id, whole.entity.profile) == (None, "")
    assert dict(whole.values) == {150: 41.0, 1004: 0.25} and whole.idle_seconds == 12.0
    assert (part.entity.gpu_instance_id, part.entity.profile, part.pod) == (7, "3g.40gb", pod)
    assert part.idle_seconds is None
    (use,) = view.pods
    assert (use.pod, use.memory_used_bytes, use.sm_utilization) == (pod, 2.0e9, None)
    assert not view.pods_hidden
    only = telemetry_from(snapshot_pb(snapshot, {1004}, pods=False))
    assert [dict(s.values) for s in only.samples] == [{1004: 0.25}, {1004: 0.5}]
    assert only.pods_hidden and only.pods == () and only.samples[1].pod is None


def test_a_reset_reads_back_as_the_gpu_and_whether_it_was_reset() -> None:
    assert reset_from(mig_pb2.ResetGpuResponse(gpu_uuid="GPU-0", reset=True)) == GpuReset(
        "GPU-0", True
    )
    assert not reset_from(mig_pb2.ResetGpuResponse(gpu_uuid="GPU-0")).reset
