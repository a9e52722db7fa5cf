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


#: a GPU that needs a reset answers UNKNOWN to its MIG mode read: listed, not lost, unread
UNREAD = "nvmlDeviceGetMigMode"


def _restarted_with_gpu_0_unread(tmp_path: Path, *, seen: bool = True) -> SimNode:
    """``seen``: the agent read GPU 0 before it turned unread (a driver attaching again, the
    allocation mode come to allow MIG), or not (unread before the process started: NVML then
    gives no UUID for it)."""
    node = sim_node(tmp_path, "h100-nvl")
    if seen:
        node.driver.gpus()
    node.control.inject_fault(UNREAD, "Unknown", gpu=0, count=10**6)
    return node


@pytest.mark.parametrize("seen", [True, False], ids=["turned-unread", "unread-at-start"])
@pytest.mark.parametrize("stop", [Killed(), Suspended("SIGTERM")], ids=["killed", "sigterm"])
def test_a_gpu_unread_at_recovery_is_not_answering_the_others_recovered_journal_kept(
    tmp_path: Path, stop: BaseException, seen: bool
) -> None:
    """An apply cut short, then GPU 0 listed but failing its MIG mode read (UNKNOWN: not lost,
    a GPU waiting for a reset). Before the fix the recovery raised the read's NvmlError ("GPU 0
    cannot be read") once the agent had seen the GPU, failing the recovery; one unread from
    the start was "does not answer" without why. Now it is a GPU that does not answer, as a
    lost one: failed by its journalled index naming the call, the others restored, the
    journal kept; restored once it reads again."""
    before = _cut_short_on_gpu_1(tmp_path, stop)
    node = _restarted_with_gpu_0_unread(tmp_path, seen=seen)
    gpus = {g.index: g.uuid for g in node.driver.gpus()}
    outcomes = {o.gpu: o for o in node.service.recover()}
    assert {g: o.action for g, o in outcomes.items()} == {0: "failed", 1: "rolled-back"}
    assert fetch(node.driver.layout(gpus[1])) == before[gpus[1]]
    detail = outcomes[0].detail
    assert detail.startswith("the GPU does not answer (GPU 0 cannot be read: "), detail
    assert UNREAD in detail and detail.endswith("its layout is restored once it does")
    assert node.store.journal_entries(SCOPE)  # GPU 0 still needs its rollback
    recover_at_start(node.store, node.service, attached=True)  # the agent's start goes on
    node.control.clear_faults()  # reset: it reads again
    again = {o.gpu: o.action for o in node.service.recover()}
    assert again == {0: "rolled-back", 1: "untouched"}
    assert node.states() == before
    assert node.store.journal_entries(SCOPE) == []
    node.close()


def test_a_journal_left_alone_by_the_mode_names_an_unread_gpu_by_its_journalled_index(
    tmp_path: Path,
) -> None:
    """A mode that refuses MIG changes leaves the journal alone, naming each GPU by its index
    now: an unread one raised NvmlError (the ModeFollower's recovery, or the start's, failed);
    now it is named by the journal's index, untouched."""
    from agent.dra.mode import Allocation, AllocationMode
    from agent.mig.lock import PartitionLock
    from agent.mig.reset import simulated_reset
    from agent.mig.service import MigService

    _cut_short_on_gpu_1(tmp_path, Killed())
    node = _restarted_with_gpu_0_unread(tmp_path, seen=True)
    unknown = Allocation(AllocationMode.UNKNOWN, "the API server has not answered")
    lock, reset = PartitionLock(tmp_path), simulated_reset(tmp_path)
    service = MigService(node.driver, node.store, lock, reset, allocation=lambda: unknown)
    outcomes = {o.gpu: o.action for o in service.recover()}
    assert outcomes == {0: "untouched", 1: "untouched"}
    assert node.store.journal_entries(SCOPE)
    node.close()
