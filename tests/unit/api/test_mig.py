"""MIG plans become messages: status, steps, blockers and instances, per GPU of the simulator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent._proto.gpuagent.v1 import mig_pb2
from agent.api.mig import _spec
from agent.errors import InvalidSpec
from agent.gpu import GpuDriver, open_driver
from agent.gpu.sim import SimControl
from agent.mig.desired import Desired
from agent.mig.plan import plan_gpu
from agent.wire.mig import gpu_plan_pb


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[GpuDriver]:
    gpu = open_driver("dgx-a100", tmp_path)
    yield gpu
    gpu.close()


def test_a_mode_switch_comes_first_in_the_plan(driver: GpuDriver) -> None:
    layout = driver.layout(driver.gpus()[0].uuid)
    plan = gpu_plan_pb(plan_gpu(layout, Desired(True, (("1g.5gb", 7),))))
    assert plan.status == mig_pb2.MIG_PLAN_STATUS_CHANGE
    assert plan.gpu_index == 0 and plan.gpu_uuid == layout.gpu.uuid
    assert plan.steps[0] == "set MIG mode enabled"
    assert len(plan.create) == 7 or plan.deferred


def test_instances_to_create_are_named_with_their_placements(driver: GpuDriver) -> None:
    uuid = driver.gpus()[1].uuid
    driver.set_mig_mode(uuid, True)
    plan = gpu_plan_pb(plan_gpu(driver.layout(uuid), Desired(True, (("3g.20gb", 2),))))
    assert plan.status == mig_pb2.MIG_PLAN_STATUS_CHANGE
    assert sorted(plan.create) == ["3g.20gb@0:4", "3g.20gb@4:4"]
    assert not plan.destroy and not plan.keep


def test_running_processes_block_a_mode_change_and_are_named(
    driver: GpuDriver, tmp_path: Path
) -> None:
    SimControl(tmp_path).start_process(4242, 2, used_memory_mib=1024)
    layout = driver.layout(driver.gpus()[2].uuid)
    plan = gpu_plan_pb(plan_gpu(layout, Desired(True, (("1g.5gb", 7),))))
    assert plan.status == mig_pb2.MIG_PLAN_STATUS_BLOCKED
    assert [(b.pid, b.change) for b in plan.blockers] == [(4242, "MIG mode change")]


def test_a_config_is_required_bounded_and_parsed() -> None:
    with pytest.raises(InvalidSpec) as empty:
        _spec("  ", "")
    assert empty.value.violations[0].field == "config_yaml"
    with pytest.raises(InvalidSpec):
        _spec("version: v1\nmig-configs: {a: []}\n", "x" * 300)
    with pytest.raises(InvalidSpec):
        _spec("version: v2\n", "")
    spec, name = _spec(
        "version: v1\nmig-configs:\n  a:\n  - devices: all\n    mig-enabled: false\n", ""
    )
    assert spec.names == ("a",) and name is None
