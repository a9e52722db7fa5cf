"""What the agent sends, its clients read back as the records it was made from (agent/wire)."""

from __future__ import annotations

from pathlib import Path

from agent._proto.gpuagent.v1 import agent_pb2
from agent.errors import Busy
from agent.gpu.types import PowerLimits
from agent.health.machine import Mark, State
from agent.mig.service import ApplyResult as MigApplyResult
from agent.mig.service import GpuOutcome
from agent.power import Change, GpuPower, PowerView
from agent.sharing import Advertised, ApplyResult, ReloadReport, parse
from agent.state import Operation
from agent.wire.errors import error_record
from agent.wire.mig import apply_result_pb
from agent.wire.node import gpu_pb, health_mark_pb, node_from
from agent.wire.operations import message_dict, operation_from, operation_pb
from agent.wire.power import power_changes_from, power_changes_pb, power_view_from, power_view_pb
from agent.wire.sharing import sharing_change_from, sharing_change_pb
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
    changes = [Change(0, "GPU-0", 700_000, 500_000)]
    assert power_changes_from(power_changes_pb(changes)) == changes


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
