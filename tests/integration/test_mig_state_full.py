"""A MIG apply whose state dir fills up midway (docs/mig.md, "Crash safety").

The store refuses a write on a full or read-only state dir with StateUnavailable
(tests/unit/test_state_disk.py). An apply then stops before its next mutation, as no mutation
is made without its journal record; what it already changed is rolled back all the same: the
snapshot it returns to was journalled before the first change.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.dra.mode import Allocation, AllocationMode
from agent.dra.republish import Expected
from agent.errors import Conflict, StateUnavailable
from agent.mig.apply import SCOPE, ProgressEvent
from agent.mig.lock import PartitionLock
from agent.mig.reset import simulated_reset
from agent.mig.service import MigService
from agent.state import StateStore
from tests.unit.mig.simnode import WHOLE_THEN_SEVENTHS, Killed, sim_node

pytestmark = pytest.mark.integration


class FillsUp:
    """The state store, full after ``writes`` more journal records: every later append and
    clear is refused as the store refuses them on a full disk."""

    def __init__(self, store: StateStore, writes: int) -> None:
        self._store, self._left = store, writes

    def journal_append(self, scope: str, entry: dict[str, Any]) -> int:
        self._left -= 1
        if self._left < 0:
            raise StateUnavailable("the state dir /var/lib/gpu-agent is full")
        return self._store.journal_append(scope, entry)

    def fill(self) -> None:
        self._left = -1

    def journal_clear(self, scope: str) -> None:
        if self._left < 0:
            raise StateUnavailable("the state dir /var/lib/gpu-agent is full")
        self._store.journal_clear(scope)

    def journal_entries(self, scope: str) -> list[tuple[int, dict[str, Any]]]:
        return self._store.journal_entries(scope)


def test_a_state_dir_full_midway_rolls_the_gpu_back_instead_of_leaving_it_half_done(
    tmp_path: Path,
) -> None:
    """Before the fix the rollback began by journalling its marker, which the full state dir
    refused: the apply raised with GPU 0 half-done (its 7g instance gone, one 1g.12gb of the
    seven created). Now the GPU is back at its old layout, the error says so, and the journal
    left (its clear was refused too) is found at the GPUs' snapshots by the next recovery."""
    node = sim_node(tmp_path, "h100-nvl")
    node.service.apply(WHOLE_THEN_SEVENTHS, "before")
    before = node.states()
    full = FillsUp(node.store, writes=5)  # begin, GPU 0's snapshot, three of its steps
    service = MigService(node.driver, full, PartitionLock(tmp_path), simulated_reset(tmp_path))
    with pytest.raises(StateUnavailable, match="is full; rolled back GPU 0"):
        service.apply(WHOLE_THEN_SEVENTHS, "after")
    assert node.states() == before
    assert node.store.journal_entries(SCOPE)  # the clear was refused: the journal stays
    outcomes = node.service.recover()  # space again, e.g. at the next start
    assert {o.action for o in outcomes} == {"untouched"}
    assert node.states() == before
    assert node.store.journal_entries(SCOPE) == []
    node.close()


class FailsToRepublish:
    """A DRA driver that does not republish; the state dir fills up as it is asked."""

    def __init__(self, full: FillsUp) -> None:
        self._full = full

    def check(self) -> None:
        """Its plugin pod is found and may be restarted: the apply goes ahead."""

    def republish(self, expected: Expected, progress: Callable[[str], None]) -> None:
        self._full.fill()
        raise Conflict("the DRA driver did not republish the new layout")

    def restart(self) -> tuple[str, ...]:
        return ()


def test_a_finished_apply_is_not_rolled_back_unjournalled_where_the_journal_says_done(
    tmp_path: Path,
) -> None:
    """Every GPU of the apply journalled done, then the DRA republish fails and the state dir
    is full: a rollback whose marker cannot be written would leave a journal that says the
    apply completed while a crash midway left GPUs half-undone. So it is not started: the
    GPUs keep the applied layout the journal describes, and the restart reports it completed."""
    node = sim_node(tmp_path, "h100-nvl")
    node.service.apply(WHOLE_THEN_SEVENTHS, "before")
    full = FillsUp(node.store, writes=1000)
    service = MigService(
        node.driver,
        full,
        PartitionLock(tmp_path),
        simulated_reset(tmp_path),
        allocation=lambda: Allocation(AllocationMode.DRA, "test", "gpu.nvidia.com"),
        republish=FailsToRepublish(full),
    )

    def progress(event: ProgressEvent) -> None:
        if event.phase == "rollback":
            raise Killed  # a crash in the rollback, were one started

    with pytest.raises(StateUnavailable):
        service.apply(WHOLE_THEN_SEVENTHS, "after", progress=progress)
    after = node.states()
    assert all(len(s.instances) == 7 for s in after.values())  # the applied layout, whole
    outcomes = node.service.recover()  # the restart, with space again
    assert {o.action for o in outcomes} == {"completed"}
    assert node.states() == after
    node.close()
