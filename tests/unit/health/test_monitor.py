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
    assert marks[Target("GPU-a")].reason.startswith("healthy: the GPU was reset since XID 48")
    assert marks[Target("GPU-b")].state is State.FAILED  # a reset is no reboot
    now[0] += 1
    monitor.observe(replace(base, health=dbe))  # the count outlived the reset
    assert monitor.marks()[Target("GPU-a")].state is State.FAILED
