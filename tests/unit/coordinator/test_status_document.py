"""The JSON form of fleet status names every field of every record (so -o json and the
coordinator's /fleet/status lose nothing the records hold)."""

from __future__ import annotations

import dataclasses

from agent.coordinator.fleet.status import GpuStatus, NodeStatus, _gpu_record, _node_record


def test_records_carry_every_dataclass_field() -> None:
    gpu = GpuStatus(0, "GPU-1", "H100", "on", "7777777.", {"7g.80gb": 1}, {}, {})
    node = NodeStatus("n", "a:1", "ok", "", "1x H100", "none", 2, 0, (gpu,))
    assert set(_gpu_record(gpu)) == {f.name for f in dataclasses.fields(GpuStatus)}
    assert _node_record(node)["gpus"] == [dataclasses.asdict(gpu)]
    assert set(_node_record(node)) == {f.name for f in dataclasses.fields(NodeStatus)} | {"idle"}
