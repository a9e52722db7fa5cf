"""An apply whose rollback failed, then a recovery that finished it: the apply's operation says
what is true now. It said "rolling back also failed ... the journal is kept" for as long as it
was kept, though the next agent start (or apply) had rolled the GPUs back."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from agent.cli.context import CliContext
from agent.cli.mig import mig
from agent.cli.operations import operations
from agent.gpu.sim import SimControl
from agent.mig.apply import SCOPE
from agent.state import StateStore
from tests.unit.mig.test_cli import CONFIG

pytestmark = pytest.mark.integration


def _gpu_agent(tmp_path: Path, *args: str) -> Result:
    """``gpu-agent --simulate dgx-a100 --state-dir TMP ARGS``, each an embedded agent's start."""
    group: click.Group = {"mig": mig, "operations": operations}[args[0]]
    config = tmp_path / "mig.yaml"
    if not config.exists():
        config.write_text(CONFIG)
    env = {"GPU_AGENT_SIMULATE_LATENCY": "false"}
    obj = CliContext(None, {"simulate": "dgx-a100", "state_dir": tmp_path}, env=env)
    try:
        argv = [a.replace("FILE", str(config)) for a in args[1:]]
        return CliRunner().invoke(group, argv, obj=obj)
    finally:
        obj.close()


def _failed_rollback(tmp_path: Path) -> str:
    """Apply "balanced", then "three-plus-four" whose second compute instance fails, and whose
    rollback fails too (recreating a compute instance at its placement): the failed apply's id."""
    assert _gpu_agent(tmp_path, "mig", "apply", "-f", "FILE", "-c", "balanced").exit_code == 0
    control = SimControl(tmp_path)
    control.inject_fault(
        "nvmlGpuInstanceCreateComputeInstance", "InsufficientResources", nth=2, count=1
    )
    control.inject_fault(
        "nvmlGpuInstanceCreateComputeInstanceWithPlacement", "InsufficientResources", nth=1
    )
    failed = _gpu_agent(tmp_path, "mig", "apply", "-f", "FILE", "-c", "three-plus-four")
    assert failed.exit_code != 0 and "rolling back also failed" in failed.output, failed.output
    control.clear_faults()
    store = StateStore(tmp_path / "agent.db")
    try:
        assert store.journal_entries(SCOPE)  # kept, for the recovery
        (op,) = [o for o in store.list_operations(kind="mig.apply") if o.state == "failed"]
    finally:
        store.close()
    assert op.error is not None and "rolling back also failed" in op.error["message"]
    return op.id


def _shown(tmp_path: Path, op_id: str) -> dict[str, object]:
    shown = _gpu_agent(tmp_path, "operations", "show", op_id, "-o", "json")
    assert shown.exit_code == 0, shown.output
    found: dict[str, object] = json.loads(shown.stdout)
    return found


@pytest.mark.parametrize(
    "recovery",
    [
        ("mig", "assert", "-f", "FILE", "-c", "balanced"),  # the next agent start recovers
        ("mig", "apply", "-f", "FILE", "-c", "balanced"),  # the next apply recovers first
    ],
    ids=["agent-start", "next-apply"],
)
def test_a_failed_rollback_finished_by_recovery_is_said_recovered_on_its_operation(
    tmp_path: Path, recovery: tuple[str, ...]
) -> None:
    op_id = _failed_rollback(tmp_path)  # every command after this starts an agent: recovers
    done = _gpu_agent(tmp_path, *recovery)
    assert done.exit_code == 0, done.output
    held = _gpu_agent(tmp_path, "mig", "assert", "-f", "FILE", "-c", "balanced")
    assert held.exit_code == 0, held.output  # the GPUs are back where the apply found them
    shown = json.dumps(_shown(tmp_path, op_id))
    assert "rolling back also failed" not in shown and "journal is kept" not in shown
    assert "RollbackFailed" not in shown
    assert "the agent's MIG recovery has since finished it: GPU 0 rolled-back" in shown, shown
    assert "Insufficient Resources" in shown  # why the apply failed, still said
    store = StateStore(tmp_path / "agent.db")
    try:
        op = store.get_operation(op_id)
        assert not store.journal_entries(SCOPE)
    finally:
        store.close()
    assert op.state == "failed"  # the apply itself was not applied
    assert op.error is not None
    (before,) = op.error["history"]  # what it said until then, kept
    assert before["type"] == "RollbackFailed"
    assert "rolling back also failed" in before["message"]
