"""Recovery of a MIG apply cut short, when one of its GPUs is lost by the time it runs.

NVML answers GPU_IS_LOST for a GPU that fell off the bus, and gives no UUID for one lost before
the process started (reference/mig.md §2.4); a reboot brings it back without its GPU
instances (§1.8). Recovery must restore the GPUs that answer, keep the journal for the lost one,
and never stop the agent's start over it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.api.restart import recover_at_start
from agent.mig.apply import SCOPE, ProgressEvent, Suspended
from agent.mig.state import fetch
from tests.unit.mig.simnode import WHOLE_THEN_SEVENTHS, Killed, SimNode, sim_node

pytestmark = pytest.mark.integration


def _cut_short_on_gpu_1(tmp_path: Path, stop: BaseException) -> dict[str, object]:
    """Apply "before", then "after" stopped at GPU 1's first create (GPU 0 is done by then);
    returns every GPU's state under "before"."""
    node = sim_node(tmp_path, "h100-nvl")
    node.service.apply(WHOLE_THEN_SEVENTHS, "before")
    before = {u: s for u, s in node.states().items()}

    def progress(event: ProgressEvent) -> None:
        if event.phase == "apply" and event.gpu == 1 and event.action == "create-gi":
            raise stop

    with pytest.raises(type(stop)):
        node.service.apply(WHOLE_THEN_SEVENTHS, "after", progress=progress)
    node.close()
    return dict(before)


def _restarted_with_gpu_0_lost(tmp_path: Path) -> SimNode:
    lost = sim_node(tmp_path, "h100-nvl")
    lost.control.mark_lost(0)
    lost.close()
    return sim_node(tmp_path, "h100-nvl")  # a new process: GPU 0 lost before it started


def _after_reboot_all_back(tmp_path: Path, before: dict[str, object]) -> None:
    node = sim_node(tmp_path, "h100-nvl")
    node.control.reboot()  # the lost GPU answers again, every GPU without instances
    outcomes = node.service.recover()
    assert {o.action for o in outcomes} == {"rolled-back"}
    assert node.states() == before
    assert node.store.journal_entries(SCOPE) == []
    node.close()


def test_a_gpu_lost_before_the_restart_leaves_the_others_recovered_and_the_agent_starting(
    tmp_path: Path,
) -> None:
    """A killed apply, then GPU 0 lost before the restart: before the fix the recovery raised
    NotFound for GPU 0 (its UUID no longer listed), so the agent's start, and every embedded
    CLI command, failed. Now GPU 1 is restored, GPU 0 is reported failed by its journalled
    index with the journal kept, and restored once a reboot brings it back."""
    before = _cut_short_on_gpu_1(tmp_path, Killed())
    node = _restarted_with_gpu_0_lost(tmp_path)
    gpus = {g.index: g.uuid for g in node.driver.gpus()}
    outcomes = {o.gpu: o for o in node.service.recover()}
    assert outcomes[1].action == "rolled-back"
    assert fetch(node.driver.layout(gpus[1])) == before[gpus[1]]
    assert outcomes[0].action == "failed"
    assert "does not answer" in outcomes[0].detail
    assert node.store.journal_entries(SCOPE)  # GPU 0 still needs its rollback
    recover_at_start(node.store, node.service, attached=True)  # the agent's start goes on
    node.close()
    _after_reboot_all_back(tmp_path, before)


def test_a_sigtermed_apply_with_a_gpu_lost_is_rolled_back_not_resumed(tmp_path: Path) -> None:
    """A SIGTERM-suspended apply is finished after the restart (docs/mig.md), but not with one
    of its GPUs lost: before the fix the resume raised NotFound looking GPU 0 up. Now it is
    undone like a failed apply: GPU 1 at once, GPU 0 once it answers; never resumed later."""
    before = _cut_short_on_gpu_1(tmp_path, Suspended("SIGTERM"))
    node = _restarted_with_gpu_0_lost(tmp_path)
    outcomes = {o.gpu: o.action for o in node.service.recover()}
    assert outcomes == {1: "rolled-back", 0: "failed"}
    node.close()
    _after_reboot_all_back(tmp_path, before)


def test_a_full_state_dir_does_not_stop_the_undo_of_a_suspended_apply_with_a_gpu_lost(
    tmp_path: Path,
) -> None:
    """Recovery decides to undo a suspended apply one of whose GPUs is lost, and journals that
    decision first; with the state dir full the append raised, and the start failed with GPU
    1 left half-done. The undo goes on unjournalled (the snapshots it returns to are kept)."""
    from agent.mig.lock import PartitionLock
    from agent.mig.reset import simulated_reset
    from agent.mig.service import MigService
    from tests.integration.test_mig_state_full import FillsUp

    before = _cut_short_on_gpu_1(tmp_path, Suspended("SIGTERM"))
    node = _restarted_with_gpu_0_lost(tmp_path)
    full = FillsUp(node.store, writes=0)
    lock, reset = PartitionLock(tmp_path), simulated_reset(tmp_path)
    outcomes = {o.gpu: o.action for o in MigService(node.driver, full, lock, reset).recover()}
    assert outcomes == {1: "rolled-back", 0: "failed"}
    gpu_1 = next(g.uuid for g in node.driver.gpus() if g.index == 1)
    assert fetch(node.driver.layout(gpu_1)) == before[gpu_1]
    node.close()
