"""The probes answer through a long start: a ``gpu-agent serve`` process whose start is held in
its MIG recovery (the simulator holds an NVML call the recovery makes, ``SimControl.hold``)
answers /healthz 200, /readyz 503 naming the recovery's step and /metrics 503 all that time,
then /readyz 200 once it serves. Before, nothing listened until the start ended: the
DaemonSet's startup probe (60 s) killed a pod recovering a mode change on eight GPUs, whose
next start recovered again (a crash loop on the node that needed the recovery).

A SIGTERM during that recovery is honoured at the next step of the start, never within a MIG
step: the recovery runs to its end (no journal left), and the agent stops without serving.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.gpu.sim import SimControl
from agent.mig.apply import SCOPE
from agent.state import StateStore
from tests.integration.test_mig_rollback_recovered import _failed_rollback
from tests.unit.api.support import START_S, AgentProcess, agent_config, http_get, wait_for

pytestmark = pytest.mark.integration

_LISTENING = re.compile(r"probes and metrics listening on \S*:(\d+)")
_SERVING = re.compile(r"agent serving: metrics \S*:(\d+)")
#: What the start's recovery calls to put GPU 0's instances back (the rollback's re-creation).
_HELD = "nvmlDeviceCreateGpuInstanceWithPlacement"


def _held_in_recovery(tmp_path: Path) -> tuple[AgentProcess, SimControl, int, int]:
    """A node whose last apply's rollback failed (the journal the start must finish), its
    recovery's instance creation held, and an agent started on it: (the agent, the node's
    control, the log offset of this start, the metrics port once the probes listen)."""
    root = tmp_path / "agent"
    root.mkdir()
    (root / "state").mkdir()
    _failed_rollback(root / "state")
    control = SimControl(root / "state")
    control.hold(_HELD)
    agent = AgentProcess(root, agent_config(root), preset="dgx-a100")
    offset = agent.spawn()
    listening = wait_for(
        lambda: _LISTENING.search(agent.output_since(offset)), "the probes to listen", START_S
    )
    return agent, control, offset, int(listening.group(1))


def _recovering(port: int) -> tuple[int, str] | None:
    """/readyz's answer once it names the held step of the recovery (the steps before it,
    destroying what the failed rollback left, pass first: a poll may see one of them)."""
    answer = http_get(port, "/readyz")
    return answer if "recovering MIG: GPU 0: create GPU instance" in answer[1] else None


def _journal_left(state_dir: Path) -> bool:
    store = StateStore(state_dir / "agent.db")
    try:
        return bool(store.journal_entries(SCOPE))
    finally:
        store.close()


def test_a_start_held_in_mig_recovery_answers_healthz_and_says_the_step_on_readyz(
    tmp_path: Path,
) -> None:
    agent, control, offset, port = _held_in_recovery(tmp_path)
    try:
        status, body = wait_for(lambda: _recovering(port), "/readyz to name the MIG step", 60)
        assert status == 503
        assert body.startswith("starting: recovering MIG: GPU 0: create GPU instance"), body
        assert http_get(port, "/healthz") == (200, "ok\n")
        status, body = http_get(port, "/metrics")
        assert status == 503 and "/metrics serves once the API does" in body, body
        # Held: the start cannot have moved on, and says the same step.
        assert http_get(port, "/readyz")[0] == 503
        assert _SERVING.search(agent.output_since(offset)) is None

        control.release(_HELD)
        serving = wait_for(lambda: _SERVING.search(agent.output_since(offset)), "serving", 60)
        assert int(serving.group(1)) == port  # the one listener, bound once
        assert http_get(port, "/readyz") == (200, "ready\n")
        status, metrics = http_get(port, "/metrics")
        assert status == 200 and "gpu_agent_driver_ready" in metrics
        assert "MIG recovery of GPU 0: rolled-back" in agent.output()
        assert agent.terminate() == 0
    finally:
        agent.stop()
    assert not _journal_left(agent.state_dir)


def test_sigterm_during_a_held_mig_recovery_finishes_the_recovery_then_stops_without_serving(
    tmp_path: Path,
) -> None:
    agent, control, offset, port = _held_in_recovery(tmp_path)
    try:
        wait_for(lambda: _recovering(port), "/readyz to name the MIG step", 60)
        assert agent.proc is not None
        agent.proc.terminate()  # SIGTERM, mid-recovery: the step in progress is not cut
        control.release(_HELD)
        assert agent.proc.wait(60) == 0
        said = agent.log.read_bytes()[offset:].decode(errors="replace")
        assert "MIG recovery of GPU 0: rolled-back" in said, said
        assert "stopping during the start, before reading the GPUs" in said, said
        assert _SERVING.search(said) is None
    finally:
        agent.stop()
    assert not _journal_left(agent.state_dir)
