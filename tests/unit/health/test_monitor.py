"""The monitor on hand-made snapshots (agent/health/monitor.py): what a GPU that is replaced
leaves behind."""

from __future__ import annotations

from pathlib import Path

from agent.gpu.readings import GpuIdentity
from agent.gpu.xid_events import XidEvent
from agent.health.machine import Policy, State
from agent.health.metrics import HealthCollector
from agent.health.monitor import HealthChange, HealthMonitor
from agent.health.store import Target
from agent.telemetry.snapshot import GpuStatus, Snapshot


def _snapshot(*uuids: str) -> Snapshot:
    gpus = tuple(
        GpuStatus(GpuIdentity(i, uuid, "H100", f"0000:{i:02x}:00.0", i), up=True)
        for i, uuid in enumerate(uuids)
    )
    return Snapshot(0.0, "node", "550.90.07", "12.550", gpus, ())


def test_a_replaced_gpu_takes_its_mark_with_it_and_the_new_one_starts_healthy(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    monitor = HealthMonitor(Policy(hold_down_s=600), tmp_path, clock=lambda: now[0])
    changes: list[HealthChange] = []
    monitor.subscribe(changes.append)
    monitor.observe(_snapshot("GPU-a", "GPU-b"))
    monitor.record_xid(XidEvent(1, 79, None, None))
    monitor.observe(_snapshot("GPU-a", "GPU-b"))
    assert monitor.marks()[Target("GPU-b")].state is State.FAILED
    assert [(c.gpu_index, c.mark.state) for c in changes] == [(1, State.FAILED)]
    # the restarted agent (marks from the state dir) on a node whose GPU 1 was replaced
    now[0] += 10
    again = HealthMonitor(Policy(hold_down_s=600), tmp_path, clock=lambda: now[0])
    assert again.marks()[Target("GPU-b")].state is State.FAILED
    again.observe(_snapshot("GPU-a", "GPU-c"))
    assert set(again.marks()) == {Target("GPU-a"), Target("GPU-c")}
    assert again.marks()[Target("GPU-c")].state is State.HEALTHY


def test_a_gpu_lost_before_it_was_ever_read_is_shown_under_its_index(tmp_path: Path) -> None:
    """Its mark is keyed by its index alone; `doctor` said "GPU -1 failed" for it."""
    monitor = HealthMonitor(Policy(hold_down_s=600), tmp_path, clock=lambda: 1000.0)
    up = GpuStatus(GpuIdentity(0, "GPU-a", "H100", "0000:00:00.0", 0), up=True)
    lost = GpuStatus(GpuIdentity(5, "", "", "", 5), up=False, detail="GPU is lost")
    monitor.observe(Snapshot(0.0, "node", "550.90.07", "12.550", (up, lost), ()))
    shown = {index: mark.state for index, mark, _ in monitor.shown().values()}
    assert shown == {0: State.HEALTHY, 5: State.FAILED}
    # Its series says which GPU, and no made-up UUID.
    rows = {
        (s.labels["gpu"], s.labels["UUID"])
        for family in HealthCollector(monitor.shown).collect()
        for s in family.samples
    }
    assert rows == {("0", "GPU-a"), ("5", "")}


def test_a_reset_by_the_agent_ends_a_reset_gpu_mark_and_a_lasting_fault_fails_it_again(
    tmp_path: Path,
) -> None:
    """The agent's reset is the mark's action: the next snapshot clears the mark (its reads may
    predate the reset and are not held against it); a double-bit ECC count the reset did not
    clear fails the GPU again a tick later. A reboot-node mark is left to its hold-down."""
    from dataclasses import replace

    from agent.gpu.reading_calls import Reading
    from agent.telemetry.snapshot import HealthReadings

    now = [1000.0]
    monitor = HealthMonitor(Policy(hold_down_s=600), tmp_path, clock=lambda: now[0])
    base = _snapshot("GPU-a", "GPU-b")
    monitor.observe(base)
    monitor.record_xid(XidEvent(0, 48, None, None))  # reset-gpu
    monitor.record_xid(XidEvent(1, 79, None, None))  # reboot-node
    monitor.observe(base)
    assert {t.gpu_uuid: m.state for t, m in monitor.marks().items()} == {
        "GPU-a": State.FAILED,
        "GPU-b": State.FAILED,
    }
    dbe = (HealthReadings(base.gpus[0].gpu, {Reading.ECC_DBE_VOLATILE: 2.0}),)
    now[0] += 5
    monitor.gpu_reset("GPU-a")
    monitor.gpu_reset("GPU-b")
    now[0] += 1
    monitor.observe(replace(base, health=dbe))  # read before the reset: not held against it
    marks = monitor.marks()
    assert marks[Target("GPU-a")].state is State.HEALTHY
    assert marks[Target("GPU-a")].reason.startswith("the GPU was reset since XID 48")
    assert marks[Target("GPU-b")].state is State.FAILED  # a reset is no reboot
    now[0] += 1
    monitor.observe(replace(base, health=dbe))  # the count outlived the reset
    assert monitor.marks()[Target("GPU-a")].state is State.FAILED


def test_a_start_after_a_reboot_ends_reboot_and_reset_marks_of_the_gpus_that_answer(
    tmp_path: Path,
) -> None:
    """A reboot is a reboot-node mark's action, and resets every GPU: an agent started under a
    new boot id (the node rebooted since the marks were saved) clears those marks at its first
    snapshot, `the node was rebooted since <reason>`. A GPU still lost after the
    reboot keeps its mark; a degraded mark (clocks held down: no action) keeps its hold-down; a
    restart under the same boot id, or one where the boot id cannot be read, clears nothing."""
    from dataclasses import replace

    from agent.gpu.reading_calls import Reading
    from agent.telemetry.snapshot import HealthReadings

    now = [1000.0]
    before = HealthMonitor(
        Policy(hold_down_s=600, degrade_events=1),
        tmp_path,
        clock=lambda: now[0],
        boot_id=lambda: "boot-1",
    )
    base = _snapshot("GPU-a", "GPU-b", "GPU-c", "GPU-d")
    before.observe(base)
    before.record_xid(XidEvent(0, 48, None, None))  # reset-gpu
    before.record_xid(XidEvent(1, 79, None, None))  # reboot-node
    before.record_xid(XidEvent(2, 79, None, None))  # reboot-node, and still lost after
    held = (HealthReadings(base.gpus[3].gpu, {Reading.CLOCK_EVENT_REASONS: 64.0}),)  # hw_thermal
    before.observe(replace(base, health=held))
    assert [m.state for m in before.marks().values()] == [
        State.FAILED,
        State.FAILED,
        State.FAILED,
        State.DEGRADED,
    ]
    now[0] += 60
    same = HealthMonitor(
        Policy(hold_down_s=600), tmp_path, clock=lambda: now[0], boot_id=lambda: "boot-1"
    )
    same.observe(base)
    assert all(m.state is not State.HEALTHY for m in same.marks().values())
    unknown = HealthMonitor(
        Policy(hold_down_s=600), tmp_path, clock=lambda: now[0], boot_id=lambda: None
    )
    unknown.observe(base)
    assert all(m.state is not State.HEALTHY for m in unknown.marks().values())

    after = HealthMonitor(
        Policy(hold_down_s=600), tmp_path, clock=lambda: now[0], boot_id=lambda: "boot-2"
    )
    lost = replace(base.gpus[2], up=False, detail="GPU is lost")
    after.observe(replace(base, gpus=(base.gpus[0], base.gpus[1], lost, base.gpus[3])))
    marks = after.marks()
    a, b, c, d = (marks[Target(u)] for u in ("GPU-a", "GPU-b", "GPU-c", "GPU-d"))
    assert (a.state, b.state, c.state, d.state) == (
        State.HEALTHY,
        State.HEALTHY,
        State.FAILED,
        State.DEGRADED,
    )
    assert b.reason.startswith("the node was rebooted since XID 79"), b.reason
    assert a.reason.startswith("the node was rebooted since XID 48"), a.reason
    now[0] += 5
    again = HealthMonitor(
        Policy(hold_down_s=600), tmp_path, clock=lambda: now[0], boot_id=lambda: "boot-2"
    )  # the new boot was saved: once only
    again.record_xid(XidEvent(1, 79, None, None))
    again.observe(base)
    assert again.marks()[Target("GPU-b")].state is State.FAILED


def test_marks_saved_without_a_boot_id_get_one_at_the_first_snapshot(tmp_path: Path) -> None:
    """Marks from an agent before boot ids were kept, with nothing changing since: the first
    snapshot saves the boot id, so a reboot after it is seen at the next start."""
    import json

    from agent.health.machine import Mark
    from agent.health.store import MarkStore

    failed = Mark(State.FAILED, "XID 79 (GPU has fallen off the bus): needs reboot-node",
                  900.0, "reboot-node", bad_at=900.0)  # fmt: skip
    MarkStore(tmp_path).save({Target("GPU-a"): failed}, now=900.0)  # no boot id
    now = [1000.0]
    first = HealthMonitor(Policy(hold_down_s=600), tmp_path, clock=lambda: now[0],
                          boot_id=lambda: "boot-1")  # fmt: skip
    first.observe(_snapshot("GPU-a"))
    assert first.marks()[Target("GPU-a")].state is State.FAILED  # no evidence yet
    saved = json.loads((tmp_path / "health-marks.json").read_text())
    assert saved["boot_id"] == "boot-1"
    rebooted = HealthMonitor(Policy(hold_down_s=600), tmp_path, clock=lambda: now[0],
                             boot_id=lambda: "boot-2")  # fmt: skip
    rebooted.observe(_snapshot("GPU-a"))
    assert rebooted.marks()[Target("GPU-a")].state is State.HEALTHY


def test_while_the_driver_is_away_no_gpu_has_a_health_series_and_the_marks_are_kept(
    tmp_path: Path,
) -> None:
    monitor = HealthMonitor(Policy(), tmp_path, clock=lambda: 1000.0)
    monitor.observe(_snapshot("GPU-a"))
    away: list[str | None] = ["driver_not_loaded: the kernel module is not loaded"]
    collector = HealthCollector(monitor.shown, lambda: away[0])
    assert [s for f in collector.collect() for s in f.samples] == []
    assert monitor.marks()[Target("GPU-a")].state is State.HEALTHY  # kept for its return
    away[0] = None
    rows = {(s.labels["state"], s.value) for f in collector.collect() for s in f.samples}
    assert rows == {("healthy", 1.0), ("degraded", 0.0), ("failed", 0.0)}


def test_a_gpu_whose_layout_does_not_read_is_neither_judged_nor_cleared(tmp_path: Path) -> None:
    """The sampler said nothing of a GPU whose MIG-mode call failed (no health readings at
    all), so the monitor judged it healthy from the start, and a failed mark on it cleared
    after its hold-down though nothing of it was read. It is unread: no verdict, no clear."""
    from tests.unit.telemetry.simnode import sim_node

    node = sim_node(tmp_path / "never")
    uuid = node.uuids[0]
    node.control.inject_fault("nvmlDeviceGetMigMode", "UNKNOWN", gpu=0, count=1000)
    sampler, monitor = node.sampler(), HealthMonitor(Policy(), None)
    for _ in range(2):
        monitor.observe(sampler.tick())
    assert Target(uuid) not in monitor.marks()
    assert monitor.unjudged() == {0: "nvmlDeviceGetMigMode: Unknown Error"}

    node = sim_node(tmp_path / "failed")
    uuid = node.uuids[0]
    sampler, now = node.sampler(), [1000.0]
    monitor = HealthMonitor(Policy(hold_down_s=60), None, clock=lambda: now[0])
    monitor.observe(sampler.tick())
    monitor.record_xid(XidEvent(0, 79, None, None))
    monitor.observe(sampler.tick())
    node.control.inject_fault("nvmlDeviceGetMigMode", "UNKNOWN", gpu=0, count=1000)
    now[0] += 120  # past the hold-down, with nothing of it read
    monitor.observe(sampler.tick())
    assert monitor.marks()[Target(uuid)].state is State.FAILED
    assert monitor.unread() == {0: "nvmlDeviceGetMigMode: Unknown Error"}


def test_a_failing_marks_save_is_told_and_tried_again_every_save_period(tmp_path: Path) -> None:
    """A lost GPU refreshes its mark every tick: a save the disk refuses was tried (and logged
    at ERROR) every tick, and told to nobody; now every failure and the success after it are
    told (the state store shows them) and the save waits SAVE_EVERY_S before trying again."""
    import errno

    from agent.health.store import SAVE_EVERY_S

    now = [1000.0]
    told: list[int | None] = []
    monitor = HealthMonitor(
        Policy(hold_down_s=600),
        tmp_path,
        clock=lambda: now[0],
        saved=lambda path, error: told.append(None if error is None else error.errno),
    )
    up = GpuStatus(GpuIdentity(0, "GPU-a", "H100", "0000:00:00.0", 0), up=True)
    lost = GpuStatus(GpuIdentity(0, "GPU-a", "H100", "0000:00:00.0", 0), up=False, detail="lost")
    monitor.observe(Snapshot(0.0, "node", "550.90.07", "12.550", (up,), ()))
    tries: list[float] = []
    real_save = monitor._store.save  # type: ignore[union-attr]

    def full(*args: object) -> None:
        tries.append(now[0])
        raise OSError(errno.ENOSPC, "No space left on device")

    monitor._store.save = full  # type: ignore[method-assign,union-attr]
    for _ in range(12):  # one snapshot a second
        now[0] += 1
        monitor.observe(Snapshot(0.0, "node", "550.90.07", "12.550", (lost,), ()))
    assert len(tries) <= 1 + 12 / SAVE_EVERY_S, tries  # the change at once, then every 5 s
    assert told == [errno.ENOSPC] * len(tries)
    monitor._store.save = real_save  # type: ignore[method-assign,union-attr]
    now[0] += SAVE_EVERY_S
    monitor.observe(Snapshot(0.0, "node", "550.90.07", "12.550", (lost,), ()))
    assert told[-1] is None
    again = HealthMonitor(Policy(hold_down_s=600), tmp_path, clock=lambda: now[0])
    assert again.marks()[Target("GPU-a")].state is State.FAILED
