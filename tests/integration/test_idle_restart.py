"""Idle seconds across an agent restart (docs/operations.md, GpuAgentGpuIdleReclaimable): the
time no agent watched is unknown, never idle."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.gpu.sim import SimControl
from tests.unit.api.support import InProcessAgent, agent_config, wait_for

pytestmark = pytest.mark.integration


def _idle_of_gpu0(agent: InProcessAgent) -> float | None:
    snapshot = agent.node.services.telemetry.latest()
    if snapshot is None:
        return None
    for sample in snapshot.entities:
        if sample.entity.gpu.index == 0 and sample.entity.instance is None:
            return sample.idle_seconds
    return None


def test_a_gpu_used_while_the_agent_was_down_does_not_read_idle_over_the_downtime(
    tmp_path: Path,
) -> None:
    """The restarted agent carried on from the saved last-busy time, counting its downtime as
    idle: a GPU used only while the agent was down (an upgrade) read idle all along, and the
    day-long reclaim alert could fire on it. It counts from its own first reading now."""
    root = tmp_path / "agent"
    config = agent_config(root, telemetry={"interval_s": 0.2})
    with InProcessAgent(root, config) as agent:
        control = SimControl(root / "state")
        wait_for(lambda: (_idle_of_gpu0(agent) or 0) >= 1.0, "GPU 0 idle a second", 10)
    control.set_workload(0, sm_active=0.9)  # used while no agent watches ...
    time.sleep(3)
    control.clear_workload(0)  # ... and idle again before the next one starts
    started = time.monotonic()
    with InProcessAgent(root, config) as agent:
        idle = wait_for(lambda: _idle_of_gpu0(agent), "GPU 0's idle seconds", 10)
        assert idle <= time.monotonic() - started, f"{idle} s idle counts the downtime"
