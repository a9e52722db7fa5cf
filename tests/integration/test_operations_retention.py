"""The agent bounds its state database: done operations and request-id records are pruned by
age and count at start and while it runs (a real agent on a simulated node)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.state import StateStore
from tests.unit.api.support import InProcessAgent, agent_config, wait_for

pytestmark = pytest.mark.integration

DAY = 24 * 3600.0


def _done(store: StateStore, kind: str, request_id: str) -> str:
    op = store.create_operation(kind, request_id=request_id, request={})
    return store.update_operation(op.id, state="succeeded", result={"response": ""}).id


def test_old_and_surplus_operations_are_pruned_at_start_and_periodically(
    tmp_path: Path,
) -> None:
    db = tmp_path / "state" / "agent.db"
    two_days_ago = time.time() - 2 * DAY
    with StateStore(db, clock=lambda: two_days_ago) as past:
        stale = _done(past, "prewarm", "stale")
        stale_call = _done(past, "call:SetSharing", "stale-call")
    with StateStore(db) as now:
        fresh = [_done(now, "mig.apply", f"fresh-{n}") for n in range(3)]
    retention = {"max_age_s": DAY, "max_count": 2}
    # An hour between periodic prunes: only the one at start can have run here.
    config = agent_config(tmp_path, operations={**retention, "prune_interval_s": 3600})
    with InProcessAgent(tmp_path, config) as agent:
        store = agent.node.services.state
        ids = {op.id for op in store.list_operations(limit=100)}
        # Older than a day, and the oldest of three mig.apply.
        assert stale not in ids and stale_call not in ids and fresh[0] not in ids
        assert {fresh[1], fresh[2]} <= ids

    config = agent_config(tmp_path, operations={**retention, "prune_interval_s": 1})
    with InProcessAgent(tmp_path, config) as agent:
        store = agent.node.services.state
        with StateStore(db, clock=lambda: two_days_ago) as past:
            later = _done(past, "prewarm", "later")  # written while the agent runs

        def pruned() -> bool:
            return later not in {op.id for op in store.list_operations(limit=100)}

        assert wait_for(pruned, "the periodic prune", 30)
