"""A ``mig.apply`` operation whose rollback failed at a restart, then finished by a later MIG
recovery (the GPU answered again): the operation says so, not that the rollback still failed."""

from __future__ import annotations

from pathlib import Path

from agent.api.mig import interrupted_apply, recovered_rollbacks
from agent.mig.outcomes import RecoveryOutcome
from agent.state import StateStore
from agent.wire.operations import operation_from, operation_pb


def _interrupted(store: StateStore, outcomes: list[RecoveryOutcome]) -> str:
    op = store.create_operation("mig.apply", request_id=None, request={})
    store.update_operation(op.id, state="running")
    store.update_operation(op.id, **interrupted_apply(outcomes))
    return op.id


def test_a_rollback_that_failed_at_a_restart_is_said_finished_once_recovery_finishes_it(
    tmp_path: Path,
) -> None:
    lost = RecoveryOutcome(0, "GPU-0", "failed", "the GPU does not answer")
    undone = RecoveryOutcome(1, "GPU-1", "rolled-back", "mig apply x interrupted; restored")
    with StateStore(tmp_path / "agent.db") as store:
        cut_short = _interrupted(store, [lost, undone])
        plain = _interrupted(store, [undone])  # rolled back at the restart: nothing to restate
        said = store.get_operation(cut_short).error
        assert said is not None and "rolling it back on restart failed" in said["message"]
        later = RecoveryOutcome(0, "GPU-0", "rolled-back", "mig apply x interrupted; restored")
        assert recovered_rollbacks(store, [later]) == [cut_short]
        op = store.get_operation(cut_short)
        assert op.state == "failed" and op.error is not None
        now = op.error["message"]
        assert "rolling it back on restart failed" not in now and "journal is kept" not in now
        assert op.error["history"][0]["message"] == said["message"]
        view = operation_from(operation_pb(op))
        assert view.error is not None
        assert "the agent's MIG recovery has since finished it: GPU 0 rolled-back" in str(
            view.error
        )
        assert store.get_operation(plain).error == interrupted_apply([undone])["error"]
        assert recovered_rollbacks(store, [later]) == []  # said once
