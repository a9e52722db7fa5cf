"""An agent's answer is a peer's: the CLI and the coordinator draw one cell per memory slice,
so a 30-byte answer claiming 2**31 slices made `mig plan` (and `fleet status`, which draws the
same count from GetNode's profiles) allocate until the process died. A count of slices past
any GPU's is refused, naming the field, before anything is built from it."""

from __future__ import annotations

import pytest

from agent._proto.gpuagent.v1 import agent_pb2, mig_pb2
from agent.errors import InvalidSpec
from agent.wire.mig import plan_from
from agent.wire.node import MAX_MEMORY_SLICES, node_from


def _plan(memory_slices: int, size: int) -> mig_pb2.PlanMigResponse:
    gpu = mig_pb2.GpuMigPlan(gpu_index=0, memory_slices=memory_slices)
    gpu.after.add(profile="1g.10gb", start=0, size=size)
    return mig_pb2.PlanMigResponse(config_name="c", gpus=[gpu])


@pytest.mark.parametrize(
    ("slices", "size", "field"),
    [(2**31, 1, "memory_slices"), (8, 2**32 - 1, "after.size")],
)
def test_a_plan_claiming_more_slices_than_a_gpu_has_is_refused_naming_the_field(
    slices: int, size: int, field: str
) -> None:
    with pytest.raises(InvalidSpec) as caught:
        plan_from(_plan(slices, size))
    assert [v.field for v in caught.value.violations] == [field]
    assert plan_from(_plan(8, 1)).gpus[0].memory_slices == 8  # a real GPU's answer


def test_a_node_whose_profiles_claim_more_slices_than_a_gpu_has_is_refused() -> None:
    node = agent_pb2.Node(name="a")
    gpu = node.gpus.add(index=0, uuid="GPU-0")
    gpu.mig_profiles.add(id=19, name="1g.10gb", memory_slices=MAX_MEMORY_SLICES + 1)
    with pytest.raises(InvalidSpec) as caught:
        node_from(node)
    assert [v.field for v in caught.value.violations] == ["mig_profiles.memory_slices"]
