"""Fleets of simulated GPU layouts for the coordinator's pure tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from agent.coordinator.planning.planner import NodeLayouts
from agent.gpu.types import GpuLayout
from tests.unit.mig.layouts import Instance, make_layout

H100 = "H100-SXM5-80GB"
A100_80 = "A100-SXM4-80GB"
A100_40 = "A100-SXM4-40GB"
A30 = "A30"
H200 = "H200-SXM-141GB"


def gpu(
    node: str,
    index: int,
    model: str = H100,
    instances: Sequence[Instance] = (),
    *,
    busy: Sequence[tuple[int, int]] = (),
    gpu_processes: Sequence[int] = (),
    mig: tuple[bool, bool] | None = (True, True),
) -> GpuLayout:
    """A GPU with a fleet-unique UUID (make_layout's UUIDs repeat across nodes)."""
    layout = make_layout(
        model, instances, busy=busy, gpu_processes=gpu_processes, mig=mig, index=index
    )
    info = dataclasses.replace(layout.gpu, uuid=f"GPU-{node}-{index}")
    # The driver reports no profiles while MIG is off; the planner must cope.
    profiles = layout.profiles if mig is not None and mig[0] else ()
    return GpuLayout(info, profiles, layout.instances, layout.processes)


def node(name: str, *gpus: GpuLayout) -> NodeLayouts:
    return NodeLayouts(name, tuple(gpus))


def empty_node(name: str, model: str = H100, count: int = 8, mig_on: bool = False) -> NodeLayouts:
    mig = (True, True) if mig_on else (False, False)
    return node(name, *(gpu(name, i, model, mig=mig) for i in range(count)))
