"""MigService on the simulated driver: refusals, busy instances, mode changes, lock, recovery."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import Busy, Conflict, InvalidSpec
from agent.mig.apply import SCOPE, Executor, restore
from agent.mig.spec import parse_spec
from agent.mig.state import fetch
from tests.unit.mig.simnode import SimNode, sim_node

pytestmark = pytest.mark.integration

REPO = Path(__file__).parents[2]

CONFIGS = parse_spec(
    """
version: v1
mig-configs:
  balanced:
    - {devices: all, mig-enabled: true, mig-devices: {1g.12gb: 2, 2g.24gb: 1, 3g.47gb: 1}}
  three-plus-four:
    - {devices: all, mig-enabled: true, mig-devices: {3g.47gb: 1, 1g.12gb: 4}}
  all-1g:
    - {devices: all, mig-enabled: true, mig-devices: {1g.12gb: 7}}
  seven:
    - {devices: all, mig-enabled: true, mig-devices: {7g.94gb: 1}}
  split:
    - {devices: all, mig-enabled: true, mig-devices: {4g.47gb: 1, 1c.3g.47gb: 3}}
  disabled:
    - {devices: all, mig-enabled: false}
"""
)


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    n = sim_node(tmp_path, "h100-nvl")
    yield n  # type: ignore[misc]
    n.close()


def gi_of(node: SimNode, gpu: int, profile: str) -> tuple[int, str]:
    """The id and label (``2g.24gb@0:2``) of the only ``profile`` instance on ``gpu``."""
    uuid = node.driver.gpus()[gpu].uuid
    (gi,) = [g for g in node.driver.layout(uuid).instances if g.profile_name == profile]
    return gi.id, f"{gi.profile_name}@{gi.placement}"


def test_an_apply_changes_only_what_must_change(node: SimNode) -> None:
    """balanced -> 3g + 4x1g: on each GPU only the 2g goes; a repeat changes nothing."""
    node.service.apply(CONFIGS, "balanced")
    before = node.states()
    result = node.service.apply(CONFIGS, "three-plus-four")
    assert [(g.kept, g.destroyed, g.created) for g in result.gpus] == [(3, 1, 2)] * 2
    after = node.states()
    for uuid in before:
        old = {gi.label for gi in before[uuid].instances}
        kept = old & {gi.label for gi in after[uuid].instances}
        assert kept == {label for label in old if not label.startswith("2g")}
    again = node.service.apply(CONFIGS, "three-plus-four")
    assert again.mutations == 0 and {g.status for g in again.gpus} == {"unchanged"}


def test_running_processes_block_and_name_the_pid_and_nothing_changes(node: SimNode) -> None:
    node.service.apply(CONFIGS, "balanced")
    gi, label = gi_of(node, 0, "2g.24gb")
    node.control.start_process(777, 0, used_memory_mib=512, gpu_instance=gi)
    before = node.states()
    with pytest.raises(Busy) as info:
        node.service.apply(CONFIGS, "three-plus-four")
    assert f"process 777 on {label} blocks destroy" in str(info.value)
    assert info.value.blockers == (f"GPU 0: process 777 on {label} blocks destroy",)
    assert node.states() == before


def test_busy_instances_that_can_stay_do_not_block(node: SimNode) -> None:
    node.service.apply(CONFIGS, "balanced")
    gi, label = gi_of(node, 0, "3g.47gb")
    node.control.start_process(778, 0, used_memory_mib=512, gpu_instance=gi)
    node.service.apply(CONFIGS, "three-plus-four")
    assert gi_of(node, 0, "3g.47gb") == (gi, label)  # still there, with its process


def test_force_tries_and_the_drivers_in_use_refusal_rolls_back(node: SimNode) -> None:
    node.service.apply(CONFIGS, "balanced")
    node.control.start_process(
        779, 1, used_memory_mib=512, gpu_instance=gi_of(node, 1, "2g.24gb")[0]
    )
    before = node.states()
    with pytest.raises(Busy, match="rolled back GPU 0, 1"):
        node.service.apply(CONFIGS, "three-plus-four", force=True)
    assert node.states() == before
    assert not node.store.journal_entries(SCOPE)


def test_a_layout_that_cannot_fit_is_refused_before_any_change(node: SimNode) -> None:
    bad = parse_spec(
        "version: v1\nmig-configs:\n  x: [{devices: all, mig-enabled: true, "
        "mig-devices: {4g.47gb: 1, 2g.24gb: 2}}]\n"
    )
    with pytest.raises(Conflict, match=r"2g.24gb does not fit next to 4g.47gb@0:4"):
        node.service.apply(bad, "x")
    assert not any(s.mig_enabled for s in node.states().values())


def test_profile_names_resolve_per_board(tmp_path: Path) -> None:
    """On a mixed node a 40GB-only name fails on the GPU that lacks it, naming its profiles."""
    mixed = sim_node(tmp_path, "mixed")
    spec = parse_spec(
        "version: v1\nmig-configs: {x: [{devices: [0, 5], mig-enabled: true, "
        "mig-devices: {1g.5gb: 7}}]}"
    )
    with pytest.raises(
        InvalidSpec, match=r"MIG profile 1g.5gb does not exist on GPU 0 .*1g.10gb, 1g.10gb\+me"
    ):
        mixed.service.plan(spec, "x")
    mixed.close()


def test_an_all_media_engine_layout_is_planned_as_the_driver_allows_it(tmp_path: Path) -> None:
    """RTX PRO 6000: +me.all beside non -me instances is refused before any change (the
    simulated driver, like nvml.h, would refuse the create midway); beside -me it applies."""
    rtx = sim_node(tmp_path, "rtx-pro-6000")
    try:
        configs = parse_spec(
            "version: v1\nmig-configs:\n"
            "  mixed: [{devices: [0], mig-enabled: true, "
            "mig-devices: {1g.24gb+me.all: 1, 1g.24gb: 2}}]\n"
            "  media: [{devices: [0], mig-enabled: true, "
            "mig-devices: {1g.24gb+me.all: 1, 1g.24gb-me: 3}}]\n"
        )
        with pytest.raises(Conflict, match=r"only -me instances may share its GPU"):
            rtx.service.apply(configs, "mixed")
        assert not any(s.mig_enabled for s in rtx.states().values())
        result = rtx.service.apply(configs, "media")
        assert [(g.gpu, g.status, g.created) for g in result.gpus] == [(0, "applied", 4)]
    finally:
        rtx.close()


def test_skip_reset_leaves_the_mode_pending_with_a_clear_message(node: SimNode) -> None:
    node.control.add_holder(0, "nv-hostengine")
    result = node.service.apply(CONFIGS, "seven", skip_reset=True)
    (pending,) = result.pending
    assert pending.gpu == 0 and "reset skipped (--skip-reset)" in pending.message
    check = node.service.check(CONFIGS, "seven")
    assert not check.applied and "MIG mode is disabled, want enabled" in check.mismatches[0]
    node.control.remove_holder(0, "nv-hostengine")
    node.service.apply(CONFIGS, "seven")  # the driver's own reset now succeeds
    assert node.service.check(CONFIGS, "seven").applied


def test_a_held_gpu_is_reset_through_the_injected_reset(tmp_path: Path) -> None:
    resets: list[int] = []
    holder = sim_node(tmp_path, "h100-nvl")

    def drain_and_reset(gpu: object) -> None:
        index = gpu.index  # type: ignore[attr-defined]
        resets.append(index)
        holder.control.remove_holder(index, "nvidia-persistenced")
        holder.control.reset_gpu(index)

    node = sim_node(tmp_path, "h100-nvl", reset=drain_and_reset)
    node.control.add_holder(1, "nvidia-persistenced")
    node.service.apply(CONFIGS, "seven")
    assert resets == [1]  # GPU 0 switched by itself; GPU 1 needed the reset
    assert node.service.check(CONFIGS, "seven").applied
    node.close()
    holder.close()


def test_a_failing_reset_rolls_back_the_mode(node: SimNode) -> None:
    node.control.add_holder(0, "nvidia-persistenced")  # the simulated reset refuses while held
    with pytest.raises(Busy, match=r"holder nvidia-persistenced.*rolled back"):
        node.service.apply(CONFIGS, "seven")
    assert node.service.check(CONFIGS, "disabled").applied


def test_passthrough_ampere_needs_a_reboot(tmp_path: Path) -> None:
    node = sim_node(tmp_path, "dgx-a100")
    node.control.set_passthrough_vm(True)
    spec = parse_spec(
        "version: v1\nmig-configs: {x: [{devices: [0], mig-enabled: true, mig-devices: {}}]}"
    )
    result = node.service.apply(spec, "x")
    assert "reboot" in result.pending[0].message
    node.control.reboot()
    assert node.service.check(spec, "x").mismatches == (
        "GPU 1 is not selected by any entry of x",
        "GPU 2 is not selected by any entry of x",
        "GPU 3 is not selected by any entry of x",
        "GPU 4 is not selected by any entry of x",
        "GPU 5 is not selected by any entry of x",
        "GPU 6 is not selected by any entry of x",
        "GPU 7 is not selected by any entry of x",
    )
    node.close()


def test_disabling_destroys_instances_first(node: SimNode) -> None:
    node.service.apply(CONFIGS, "split")
    assert node.service.check(CONFIGS, "split").applied
    node.service.apply(CONFIGS, "disabled")
    assert node.service.check(CONFIGS, "disabled").applied


def test_a_second_reconfiguration_is_refused_naming_the_running_one(
    node: SimNode, tmp_path: Path
) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from agent.mig.lock import PartitionLock\n"
            "with PartitionLock(Path(sys.argv[1])).hold('mig apply balanced (label watcher)'):\n"
            "    print('held', flush=True); sys.stdin.read()",
            str(tmp_path),
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(
            Busy, match=r"running on this node: mig apply balanced \(label watcher\) \(pid \d+\)"
        ):
            node.service.apply(CONFIGS, "balanced")
        assert node.service.plan(CONFIGS, "balanced").changes  # reads are never blocked
    finally:
        holder.communicate("")
    node.service.apply(CONFIGS, "balanced")  # released with its process


def test_recover_finishes_nothing_when_the_apply_had_completed(node: SimNode) -> None:
    node.service.apply(CONFIGS, "seven")
    gpu = node.driver.gpus()[0]
    state = fetch(node.driver.layout(gpu.uuid))
    node.store.journal_append(
        SCOPE, {"event": "begin", "operation": "mig apply seven", "gpus": [gpu.uuid]}
    )
    node.store.journal_append(
        SCOPE, {"event": "gpu", "uuid": gpu.uuid, "index": 0, "before": state.to_dict()}
    )
    node.store.journal_append(SCOPE, {"event": "done", "uuid": gpu.uuid})
    (outcome,) = node.service.recover()
    assert outcome.action == "completed" and not node.store.journal_entries(SCOPE)


def test_recover_leaves_a_live_applys_journal_alone(node: SimNode) -> None:
    node.store.journal_append(SCOPE, {"event": "begin", "operation": "x", "gpus": []})
    with node.service._lock.hold("mig apply x"):
        assert node.service.recover() == ()
    assert node.store.journal_entries(SCOPE)


@pytest.mark.parametrize("start", ["balanced", "split", "all-1g", "disabled"])
@pytest.mark.parametrize("then", ["three-plus-four", "seven", "disabled"])
def test_fetch_restore_fetch_round_trips(node: SimNode, start: str, then: str) -> None:
    """STYLE.md practice 5: a snapshot restored after another apply reads back identical."""
    node.service.apply(CONFIGS, start)
    snapshot = node.states()
    node.service.apply(CONFIGS, then)
    executor = Executor(node.driver, node.store, lambda gpu: node.control.reset_gpu(gpu.index))
    for gpu in node.driver.gpus():
        restore(executor, node.driver, gpu, snapshot[gpu.uuid], skip_reset=False)
    assert node.states() == snapshot
