"""The state file's codec: ``dumps`` writes exactly the JSON of ``dataclasses.asdict``, and
``loads`` reads it back to an equal node."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from agent.gpu.sim import state
from agent.gpu.sim.presets import PRESETS
from agent.gpu.sim.state import (
    Activity,
    ComputeInstance,
    Fault,
    GpuInstance,
    NodeState,
    Process,
    XidEvent,
)


def _asdict_json(node: NodeState) -> str:
    """The encoder the state file was first written with."""
    return json.dumps({"format": state.FORMAT, **asdict(node)}, sort_keys=True)


def _busy(preset: str) -> NodeState:
    """A node with one of everything the state holds, None and non-default values included."""
    node = state.new_node(PRESETS[preset])
    gpu = node.gpus[0]
    gpu.mig_current = gpu.mig_pending = True
    gpu.holders = ["nvidia-persistenced"]
    gpu.power_limit_mw = 350_000
    gpu.ecc = {"sbe_volatile": 3, "dbe_aggregate": 1}
    gpu.remap = {"correctable": 2, "pending": 1}
    gpu.clock_event_reasons = 0x8
    gpu.workload = {"pcie_tx_bytes_per_s": 1.5e9}
    gpu.activity = Activity(rates={"sm_active": 0.25}, totals={"sm_active": 12.5}, since=7.25)
    gi = GpuInstance(
        id=1,
        profile_id=9,
        start=0,
        size=4,
        serial=node.take_serial(),
        workload={"sm_active": 0.5},
        activity=Activity(since=3.0),
    )
    gi.compute_instances.append(
        ComputeInstance(
            id=0, profile_id=2, start=0, size=2, serial=node.take_serial(), uuid="MIG-x"
        )
    )
    gpu.gpu_instances.append(gi)
    node.gpus[-1].lost = True
    node.processes = [
        Process(4242, 0, 1, 0, 1024, "python", "/kubepods/pod1"),
        Process(4243, 0, None, None, 10, "nvidia-smi", None),
    ]
    node.faults = [Fault("nvmlGpuInstanceDestroy", 19, skip=1, remaining=2, gpu=None)]
    node.events = [XidEvent(seq=1, gpu=0, xid=79), XidEvent(seq=2, gpu=0, xid=31, gpu_instance=1)]
    node.driver_absent, node.driver_absent_until = True, 1.5e9
    node.boot_id = 3
    return node


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_dumps_writes_the_asdict_json_and_loads_reads_it_back(preset: str) -> None:
    for node in (state.new_node(PRESETS[preset]), _busy(preset)):
        text = state.dumps(node)
        assert text == _asdict_json(node)
        assert state.loads(text) == node
        assert state.dumps(state.loads(text)) == text


def test_dumps_rejects_what_is_not_state() -> None:
    node = state.new_node(PRESETS[sorted(PRESETS)[0]])
    node.gpus[0].holders = [object()]  # type: ignore[list-item]
    with pytest.raises(TypeError):
        state.dumps(node)
