"""The sampler against the simulated driver: injected activity comes out exactly, per GPU and per
MIG instance, physical fields once per GPU, unsupported fields reported, lost GPUs marked down."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from agent.gpu.readings import NodeReader
from agent.gpu.sim import sym_fields
from agent.gpu.xid_events import XidEvents
from agent.telemetry.exporter import MetricsExporter
from agent.telemetry.xid import XidWatcher
from dcgm.counters import load_counters, parse_counters
from dcgm.fields import BY_NAME, Level
from tests.unit.telemetry.simnode import GPM_WINDOW_S, entity, sim_node, two_ticks

MIB = 1024 * 1024
F = {name.removeprefix("DCGM_FI_"): field.id for name, field in BY_NAME.items()}


def test_gpu_activity_comes_out_as_injected(tmp_path: Path) -> None:
    node = sim_node(tmp_path)
    node.control.set_workload(
        0,
        sm_active=0.8,
        sm_occupancy=0.4,
        tensor_active=0.55,
        fp64_active=0.1,
        fp32_active=0.2,
        fp16_active=0.3,
        dram_active=0.25,
        pcie_tx_bytes_per_s=3.0e9,
        pcie_rx_bytes_per_s=1.5e9,
        nvlink_tx_bytes_per_s=2.0e10,
        nvlink_rx_bytes_per_s=1.0e10,
    )
    values = entity(two_ticks(node.sampler()), 0).values
    expected = {
        "PROF_GR_ENGINE_ACTIVE": 0.8,
        "PROF_SM_ACTIVE": 0.8,
        "PROF_SM_OCCUPANCY": 0.4,
        "PROF_PIPE_TENSOR_ACTIVE": 0.55,
        "PROF_PIPE_FP64_ACTIVE": 0.1,
        "PROF_PIPE_FP32_ACTIVE": 0.2,
        "PROF_PIPE_FP16_ACTIVE": 0.3,
        "PROF_DRAM_ACTIVE": 0.25,
        "PROF_PCIE_TX_BYTES": 3.0e9,  # bytes/s, from GPM's MiB/s
        "PROF_PCIE_RX_BYTES": 1.5e9,
        "PROF_NVLINK_TX_BYTES": 2.0e10,
        "PROF_NVLINK_RX_BYTES": 1.0e10,
        "DEV_GPU_UTIL": 80,  # percent
    }
    for name, value in expected.items():
        assert values[F[name]] == pytest.approx(value, rel=0.01), name


def test_first_window_reports_nothing_rather_than_zero(tmp_path: Path) -> None:
    node = sim_node(tmp_path)
    node.control.set_workload(0, tensor_active=0.5)
    first = node.sampler().tick()
    assert F["PROF_PIPE_TENSOR_ACTIVE"] not in entity(first, 0).values
    assert F["DEV_GPU_TEMP"] in entity(first, 0).values


def test_units_are_dcgm_exporters(tmp_path: Path) -> None:
    """W not mW, MiB not bytes, MHz, mJ: the values dcgm-exporter would print."""
    node = sim_node(tmp_path)
    node.control.set_workload(0, sm_active=1.0)
    node.control.start_process(100, 0, used_memory_mib=2048)
    sampler = node.sampler()
    two_ticks(sampler)
    time.sleep(0.2)
    values = entity(sampler.tick(), 0).values
    power_w = values[F["DEV_POWER_USAGE"]]
    assert 10 < power_w < 1000, "watts"
    assert values[F["DEV_FB_USED"]] == 2048
    assert values[F["DEV_FB_FREE"]] == pytest.approx(81559 - 2048, abs=1)  # H100 80GB in MiB
    assert 1000 <= values[F["DEV_SM_CLOCK"]] <= 2000, "MHz"
    energy = values[F["DEV_TOTAL_ENERGY_CONSUMPTION"]]
    later = entity(sampler.tick(), 0).values[F["DEV_TOTAL_ENERGY_CONSUMPTION"]]
    assert later >= energy > 0, "mJ counter, monotonic"


def _mig_node(tmp_path: Path):  # type: ignore[no-untyped-def]
    node = sim_node(tmp_path)
    big = node.create_instance(1, "3g.40gb", slot=0)
    small = node.create_instance(1, "1g.10gb", slot=6)
    node.control.set_workload(
        1, gpu_instance=big.id, sm_active=0.9, tensor_active=0.6, dram_active=0.5
    )
    node.control.set_workload(
        1, gpu_instance=small.id, sm_active=0.3, tensor_active=0.2, dram_active=0.1
    )
    node.control.set_workload(1, pcie_tx_bytes_per_s=4.0e9, nvlink_rx_bytes_per_s=8.0e9)
    node.control.start_process(
        200, 1, used_memory_mib=1024, gpu_instance=big.id, compute_instance=0
    )
    return node, big, small


def test_mig_instances_report_their_own_activity(tmp_path: Path) -> None:
    node, big, small = _mig_node(tmp_path)
    snapshot = two_ticks(node.sampler())
    big_values = entity(snapshot, 1, big.id).values
    small_values = entity(snapshot, 1, small.id).values
    assert big_values[F["PROF_PIPE_TENSOR_ACTIVE"]] == pytest.approx(0.6, rel=0.01)
    assert big_values[F["PROF_DRAM_ACTIVE"]] == pytest.approx(0.5, rel=0.01)
    assert small_values[F["PROF_PIPE_TENSOR_ACTIVE"]] == pytest.approx(0.2, rel=0.01)
    assert small_values[F["PROF_DRAM_ACTIVE"]] == pytest.approx(0.1, rel=0.01)
    assert big_values[F["DEV_FB_USED"]] == 1024
    assert small_values[F["DEV_FB_USED"]] == 0
    gpu = entity(snapshot, 1).values
    assert gpu[F["PROF_PCIE_TX_BYTES"]] == pytest.approx(4.0e9, rel=0.01)
    assert gpu[F["PROF_NVLINK_RX_BYTES"]] == pytest.approx(8.0e9, rel=0.01)
    # GPU-level tensor activity is the slice-weighted sum (3/7 * 0.6 + 1/7 * 0.2).
    assert gpu[F["PROF_PIPE_TENSOR_ACTIVE"]] == pytest.approx(3 / 7 * 0.6 + 1 / 7 * 0.2, rel=0.01)


def test_physical_fields_are_never_repeated_on_instances(tmp_path: Path) -> None:
    node, big, small = _mig_node(tmp_path)
    snapshot = two_ticks(node.sampler())
    physical = {f.id for f in BY_NAME.values() if f.level is Level.GPU}
    for gi in (big.id, small.id):
        assert not physical & set(entity(snapshot, 1, gi).values), gi
    assert F["DEV_POWER_USAGE"] in entity(snapshot, 1).values


def test_utilization_unsupported_with_mig_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node, _big, _small = _mig_node(tmp_path)
    sampler = node.sampler()
    with caplog.at_level(logging.WARNING, logger="agent.telemetry.support"):
        two_ticks(sampler)
        snapshot = sampler.tick()
    assert F["DEV_GPU_UTIL"] not in entity(snapshot, 1).values
    support = {(s.field_id, s.gpu.index): s.supported for s in snapshot.support}
    assert support[(F["DEV_GPU_UTIL"], 1)] is False
    assert support[(F["DEV_GPU_UTIL"], 0)] is True
    lines = [r.getMessage() for r in caplog.records if "DCGM_FI_DEV_GPU_UTIL" in r.getMessage()]
    assert len(lines) == 1 and "GPU 1" in lines[0]


def test_unsupported_warnings_are_not_logged_again_after_a_layout_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 20: the same "not supported" lines came back after every MIG layout change."""
    node, _big, small = _mig_node(tmp_path)
    sampler = node.sampler()
    with caplog.at_level(logging.WARNING, logger="agent.telemetry.support"):
        two_ticks(sampler)
        first = [r.getMessage() for r in caplog.records if r.name == "agent.telemetry.support"]
        caplog.clear()
        uuid = node.uuids[1]
        node.driver.destroy_compute_instance(uuid, small.id, 0)
        node.driver.destroy_gpu_instance(uuid, small.id)
        node.create_instance(1, "1g.10gb", slot=6)
        two_ticks(sampler)
        again = [r.getMessage() for r in caplog.records if r.name == "agent.telemetry.support"]
    assert any("not supported" in line for line in first)
    assert not [line for line in again if "not supported" in line], again
    snapshot = sampler.tick()
    support = {(s.field_id, s.gpu.index): s.supported for s in snapshot.support}
    assert support[(F["DEV_GPU_UTIL"], 1)] is False  # still known unsupported, just not re-logged


def test_a_field_refused_under_mig_is_read_again_once_mig_is_off(tmp_path: Path) -> None:
    """Support is probed again when a GPU's MIG layout changes (docs/metrics.md): GPU_UTIL,
    which NVML refuses on a MIG-enabled GPU, has a value and reads supported once MIG is
    turned off, with no agent restart."""
    node, big, small = _mig_node(tmp_path)
    sampler = node.sampler()
    two_ticks(sampler)
    uuid = node.uuids[1]
    node.control.stop_process(200)
    for gi in (big, small):
        node.driver.destroy_compute_instance(uuid, gi.id, 0)
        node.driver.destroy_gpu_instance(uuid, gi.id)
    node.driver.set_mig_mode(uuid, False)
    snapshot = two_ticks(sampler)
    assert F["DEV_GPU_UTIL"] in entity(snapshot, 1).values
    support = {(s.field_id, s.gpu.index): s.supported for s in snapshot.support}
    assert support[(F["DEV_GPU_UTIL"], 1)] is True


def test_recreated_instance_starts_a_new_gpm_window(tmp_path: Path) -> None:
    """A GI destroyed and re-created with the same id must not mix the two instances' counters."""
    node, _big, small = _mig_node(tmp_path)
    sampler = node.sampler()
    assert F["PROF_PIPE_TENSOR_ACTIVE"] in entity(two_ticks(sampler), 1, small.id).values
    uuid = node.uuids[1]
    node.driver.destroy_compute_instance(uuid, small.id, 0)
    node.driver.destroy_gpu_instance(uuid, small.id)
    again = node.create_instance(1, "1g.10gb", slot=6)
    assert again.id == small.id
    node.control.set_workload(1, gpu_instance=again.id, tensor_active=0.7)
    time.sleep(GPM_WINDOW_S)
    reseeded = sampler.tick()
    assert F["PROF_PIPE_TENSOR_ACTIVE"] not in entity(reseeded, 1, again.id).values
    time.sleep(GPM_WINDOW_S)
    fresh = sampler.tick()
    assert entity(fresh, 1, again.id).values[F["PROF_PIPE_TENSOR_ACTIVE"]] == pytest.approx(
        0.7, rel=0.01
    )


def test_lost_gpu_is_marked_down_and_the_others_keep_reporting(tmp_path: Path) -> None:
    node = sim_node(tmp_path)
    sampler = node.sampler()
    two_ticks(sampler)
    node.control.mark_lost(2)
    snapshot = sampler.tick()
    up = {s.gpu.index: s.up for s in snapshot.gpus}
    assert up == {i: i != 2 for i in range(8)}
    assert {s.entity.gpu.index for s in snapshot.entities} == set(range(8)) - {2}
    # Whether a field can be read on a GPU nobody can read is not known: no series says 1.
    assert {row.gpu.index for row in snapshot.support} == set(range(8)) - {2}
    assert dict(node.stats.view().errors) == {"gpu_lost": 1}
    sampler.tick()
    assert dict(node.stats.view().errors) == {"gpu_lost": 1}, "counted once per loss"


def _field_answers(monkeypatch: pytest.MonkeyPatch, field: int, gpu: int, codes: list[int]) -> None:
    """Field ``field`` of GPU ``gpu`` answers the NVML return codes ``codes`` in its own
    ``nvmlReturn`` (the call as a whole succeeds, as nvml.h says), then as the board does."""
    board = sym_fields._FIELDS[field]

    def read(t, scope, totals):  # type: ignore[no-untyped-def]
        return codes.pop(0) if t.gpu.index == gpu and codes else board(t, scope, totals)

    monkeypatch.setitem(sym_fields._FIELDS, field, read)


@pytest.mark.parametrize("failing", ["field", "call"])
def test_a_failed_nvlink_link_count_is_asked_again_not_taken_for_no_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """One transient error on the link count (its field's return code, or the call's) made the
    GPU "have no NVLink links" for the agent's life: its NVLink bandwidth never came back."""
    bandwidth = F["DEV_NVLINK_BANDWIDTH_TOTAL"]
    node = sim_node(tmp_path)
    if failing == "field":
        link_count = pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT
        _field_answers(monkeypatch, link_count, 0, [pynvml.NVML_ERROR_UNKNOWN])
    else:  # the GPU's first field-values call of the tick asks the link count
        node.control.inject_fault("nvmlDeviceGetFieldValues", "UNKNOWN", gpu=0)
    node.control.set_workload(0, nvlink_tx_bytes_per_s=2e10, nvlink_rx_bytes_per_s=1e10)
    sampler = node.sampler()
    first = sampler.tick()
    assert bandwidth not in entity(first, 0).values
    assert [r.supported for r in first.support if r.field_id == bandwidth and r.gpu.index == 0] == [
        True
    ]
    assert dict(node.stats.view().errors).get("nvml", 0) >= 1
    snapshot = first
    for _ in range(2):
        time.sleep(GPM_WINDOW_S)
        snapshot = sampler.tick()
    mb_per_s = 3e10 / 1_024_000  # DCGM's "MB/s"
    # Back, and the workload's rate: within a quarter, since the ticks here are timed by a
    # loaded machine (rates' accuracy: test_gpu_activity_comes_out_as_injected).
    assert entity(snapshot, 0).values[bandwidth] == pytest.approx(mb_per_s, rel=0.25)


@pytest.mark.parametrize(
    "field", [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, pynvml.NVML_FI_DEV_MEMORY_TEMP]
)
def test_a_field_answering_gpu_is_lost_marks_the_gpu_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: int
) -> None:
    _field_answers(monkeypatch, field, 3, [pynvml.NVML_ERROR_GPU_IS_LOST])
    node = sim_node(tmp_path)
    snapshot = node.sampler().tick()
    assert {s.gpu.index: s.up for s in snapshot.gpus} == {i: i != 3 for i in range(8)}
    assert dict(node.stats.view().errors) == {"gpu_lost": 1}


def test_ampere_without_dcgm_marks_profiling_unsupported_and_keeps_nvml_fields(
    tmp_path: Path,
) -> None:
    node = sim_node(tmp_path, "dgx-a100")
    node.control.set_workload(
        0, sm_active=0.5, pcie_tx_bytes_per_s=2_048_000, pcie_rx_bytes_per_s=1_024_000
    )
    counters = parse_counters(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, t\n"
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT, gauge, tx\n"
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT, gauge, rx\n"
        "DCGM_FI_DEV_GPU_UTIL, gauge, u\n"
    )
    snapshot = two_ticks(node.sampler(counters))
    values = entity(snapshot, 0).values
    assert F["PROF_PIPE_TENSOR_ACTIVE"] not in values
    assert values[F["DEV_PCIE_TX_THROUGHPUT"]] == 2000  # KB/s, as DCGM reports it
    assert values[F["DEV_PCIE_RX_THROUGHPUT"]] == 1000
    assert values[F["DEV_GPU_UTIL"]] == 50
    support = {(s.field_id, s.gpu.index): s.supported for s in snapshot.support}
    assert support[(F["PROF_PIPE_TENSOR_ACTIVE"], 0)] is False


def test_xids_are_counted_per_code_and_the_last_one_is_kept(tmp_path: Path) -> None:
    node = sim_node(tmp_path)
    reader = NodeReader(node.driver)
    watcher = XidWatcher(lambda: XidEvents(reader), node.stats, wait_ms=50)
    watcher.start()
    try:
        sampler = node.sampler(xids=watcher)
        node.control.raise_xid(3, 31)
        node.control.raise_xid(3, 31)
        node.control.raise_xid(3, 13)
        deadline = time.monotonic() + 5
        while sum(watcher.state().counts.values()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        snapshot = sampler.tick()
    finally:
        watcher.stop()
    counts = {(x.entity.gpu.index, x.xid): x.count for x in snapshot.xids}
    assert counts == {(3, 31): 2, (3, 13): 1}
    assert entity(snapshot, 3).values[F["DEV_XID_ERRORS"]] == 13
    assert entity(snapshot, 0).values[F["DEV_XID_ERRORS"]] == 0


def test_an_xid_series_keeps_the_time_of_its_first_xid(tmp_path: Path) -> None:
    """`gpu_agent_xid_errors_first_seen_timestamp_seconds` is when the series' first XID came
    (Unix time), not its latest: the rules count the series whole only inside their window."""
    from agent.gpu.xid_events import XidEvent
    from agent.telemetry.stats import TelemetryStats

    now = [1_700_000_000.0]
    watcher = XidWatcher(lambda: XidEvents(None), TelemetryStats(), wall=lambda: now[0])
    watcher.record(XidEvent(3, 31, None, None))
    now[0] += 600
    watcher.record(XidEvent(3, 31, None, None))
    watcher.record(XidEvent(3, 13, None, None))
    state = watcher.state()
    assert state.counts == {(3, None, 31): 2, (3, None, 13): 1}
    assert state.first_seen == {(3, None, 31): 1_700_000_000.0, (3, None, 13): 1_700_000_600.0}


def test_a_gpu_lost_when_xid_events_were_registered_is_watched_once_it_answers(
    tmp_path: Path,
) -> None:
    """GPU 3 did not answer when the event set opened (lost, or held in a reset): it could not
    be registered. Once a tick finds it answering, the watcher registers it into the set, so its
    XIDs reach the counters and the health marks; until then it is named unwatched (doctor,
    status' xid-events) rather than silently missing from both."""
    node = sim_node(tmp_path)
    node.control.mark_lost(3)
    watcher = XidWatcher(lambda: XidEvents(NodeReader(node.driver)), node.stats, wait_ms=20)
    watcher.start()
    try:
        sampler = node.sampler(xids=watcher)
        assert 3 in watcher.state().unsupported
        node.control.reboot()  # the only way back from "lost" the simulator has
        first = sampler.tick()  # answers, not registered yet: no value, and not "unsupported"
        assert F["DEV_XID_ERRORS"] not in entity(first, 3).values
        deadline = time.monotonic() + 5
        while 3 in watcher.state().unsupported and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watcher.state().unsupported == {}
        support = {(s.field_id, s.gpu.index): s.supported for s in sampler.tick().support}
        assert support[(F["DEV_XID_ERRORS"], 3)] is True
        node.control.raise_xid(3, 31)
        while not watcher.state().counts and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watcher.state().counts == {(3, None, 31): 1}
    finally:
        watcher.stop()


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_returning_gpu_joins_the_open_event_set_and_the_others_keep_theirs(
    tmp_path: Path,
) -> None:
    """GPU 3, lost at start, answers again: it is registered into the set the others' XIDs
    come through. Reopening the whole set instead dropped every GPU's registration for the
    time it took, so an XID of any GPU raised meanwhile was never counted."""
    node = sim_node(tmp_path)
    node.control.mark_lost(3)
    watcher = XidWatcher(lambda: XidEvents(NodeReader(node.driver)), node.stats, wait_ms=20)
    watcher.start()
    try:
        sampler = node.sampler(xids=watcher)
        node.control.raise_xid(0, 13)
        _until(lambda: watcher.state().counts == {(0, None, 13): 1}, "GPU 0's XID")
        node.control.reboot()  # the only way back from "lost" the simulator has
        sampler.tick()
        _until(lambda: watcher.state().unsupported == {}, "GPU 3 registered")
        assert (node.driver.calls["nvmlEventSetCreate"], node.driver.calls["nvmlEventSetFree"]) == (
            1,
            0,
        ), "the event set was reopened"
        node.control.raise_xid(0, 31)
        node.control.raise_xid(3, 31)
        want = {(0, None, 13): 1, (0, None, 31): 1, (3, None, 31): 1}
        _until(lambda: watcher.state().counts == want, "both GPUs' XIDs")
    finally:
        watcher.stop()


def test_a_registration_refused_as_gpu_lost_is_tried_again_once_the_gpu_answers(
    tmp_path: Path,
) -> None:
    """GPU 3's handle opened but nvmlDeviceRegisterEvents said GPU_IS_LOST (it fell off the bus
    in between, or was held in a reset): it was taken for a GPU without XIDs and never tried
    again. A tick that finds it answering registers it; NOT_SUPPORTED on GPU 5 lasts."""
    node = sim_node(tmp_path)
    node.control.inject_fault("nvmlDeviceRegisterEvents", "GpuIsLost", gpu=3)
    node.control.inject_fault("nvmlDeviceRegisterEvents", "NotSupported", gpu=5, count=1000)
    watcher = XidWatcher(lambda: XidEvents(NodeReader(node.driver)), node.stats, wait_ms=20)
    watcher.start()
    try:
        first = watcher.state()
        assert set(first.unsupported) == {3, 5} and first.unreachable == {3}
        sampler = node.sampler(xids=watcher)
        sampler.tick()
        _until(lambda: 3 not in watcher.state().unsupported, "GPU 3 registered")
        sampler.tick()
        assert set(watcher.state().unsupported) == {5} and watcher.state().unreachable == set()
        node.control.raise_xid(3, 79)
        _until(lambda: watcher.state().counts == {(3, None, 79): 1}, "GPU 3's XID")
        assert node.driver.calls["nvmlDeviceRegisterEvents"] == 9  # 8 GPUs, and GPU 3 again
    finally:
        watcher.stop()


def test_a_destroyed_instances_xids_end_with_it_and_never_reach_the_gpus_row(
    tmp_path: Path,
) -> None:
    """Two XIDs on a MIG instance, then the instance is destroyed (a re-layout): its series
    ends. Folded into the GPU's series they would show as two new XIDs on the GPU, and
    `increase(gpu_agent_xid_errors_total[5m])` alerts would fire for nothing new; an instance
    made later with the same id starts from 0. `doctor` still counts them for the GPU."""
    node = sim_node(tmp_path)
    gi = node.create_instance(0, "1g.10gb")
    watcher = XidWatcher(lambda: XidEvents(NodeReader(node.driver)), node.stats, wait_ms=20)
    watcher.start()
    try:
        sampler = node.sampler(xids=watcher)
        node.control.raise_xid(0, 13)
        node.control.raise_xid(0, 13, gpu_instance=gi.id)
        node.control.raise_xid(0, 13, gpu_instance=gi.id)
        deadline = time.monotonic() + 5
        while sum(watcher.state().counts.values()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)

        def rows() -> dict[tuple[int | None, int], int]:
            snapshot = sampler.tick()
            return {
                (x.entity.instance.gpu_instance_id if x.entity.instance else None, x.xid): x.count
                for x in snapshot.xids
            }

        assert rows() == {(None, 13): 1, (gi.id, 13): 2}
        uuid = node.uuids[0]
        for ci in node.driver.layout(uuid).instances[0].compute_instances:
            node.driver.destroy_compute_instance(uuid, gi.id, ci.id)
        node.driver.destroy_gpu_instance(uuid, gi.id)
        assert rows() == {(None, 13): 1}
        # What WatchEvents diffs (the instance's key goes) and what doctor sums per GPU
        assert watcher.state().counts == {(0, None, 13): 1}
        assert watcher.state().totals() == {(0, None, 13): 3}
        again = node.create_instance(0, "1g.10gb")
        assert again.id == gi.id
        assert rows() == {(None, 13): 1}
    finally:
        watcher.stop()


def test_idle_seconds_grow_while_idle_and_reset_when_busy(tmp_path: Path) -> None:
    node = sim_node(tmp_path)
    clock = [100.0]
    sampler = node.sampler(clock=lambda: clock[0])
    assert entity(sampler.tick(), 0).idle_seconds == 0
    clock[0] += 30
    assert entity(sampler.tick(), 0).idle_seconds == 30
    node.control.set_workload(0, sm_active=0.5)
    clock[0] += 10
    assert entity(sampler.tick(), 0).idle_seconds == 0
    node.control.clear_workload(0)
    clock[0] += 5
    assert entity(sampler.tick(), 0).idle_seconds == 5


def test_idle_seconds_are_unknown_not_counted_on_while_no_utilisation_can_be_read(
    tmp_path: Path,
) -> None:
    """An Ampere GPU put in MIG mode has no NVML utilisation and no GPM: nothing says whether it
    is busy, so `gpu_agent_idle_seconds` must go absent, not keep growing from the last reading
    into a 24 h reclaim alert on a GPU whose instances run flat out."""
    node = sim_node(tmp_path, "dgx-a100")
    clock = [100.0]
    sampler = node.sampler(clock=lambda: clock[0])
    assert entity(sampler.tick(), 0).idle_seconds == 0
    big = node.create_instance(0, "3g.20gb")
    node.control.set_workload(0, gpu_instance=big.id, sm_active=0.9)
    clock[0] += 3600
    snapshot = sampler.tick()
    assert entity(snapshot, 0).idle_seconds is None
    assert entity(snapshot, 0, big.id).idle_seconds is None


def test_time_whose_utilisation_could_not_be_read_is_not_counted_idle(tmp_path: Path) -> None:
    """Utilisation unreadable for an hour while the GPU was in fact busy: at the next idle
    reading the whole gap was added to the idle seconds, so the reclaim annotation and the day
    alert saw an hour idle on a GPU that ran flat out. An unread tick ends the idle run: counting
    starts again at the next reading."""
    node = sim_node(tmp_path)
    clock = [100.0]
    sampler = node.sampler(clock=lambda: clock[0])
    sampler.tick()
    clock[0] += 60
    assert entity(sampler.tick(), 0).idle_seconds == 60
    node.control.set_workload(0, sm_active=0.9)
    node.control.inject_fault("nvmlDeviceGetUtilizationRates", "UNKNOWN", gpu=0, count=100)
    node.control.inject_fault("nvmlGpmSampleGet", "UNKNOWN", gpu=0, count=100)
    for _ in range(3):
        clock[0] += 1200
        assert entity(sampler.tick(), 0).idle_seconds is None
    node.control.clear_faults()
    node.control.set_workload(0, sm_active=0.0)
    clock[0] += 1
    snapshot = sampler.tick()
    assert entity(snapshot, 0).idle_seconds == 0
    assert snapshot.gpu_idle_seconds()[node.uuids[0]] == 0
    assert entity(snapshot, 1).idle_seconds == 3661  # a GPU read all along counts on
    clock[0] += 30
    assert entity(sampler.tick(), 0).idle_seconds == 30


def test_a_scrape_never_calls_nvml(tmp_path: Path) -> None:
    """Rendering works with NVML shut down: it only reads the published snapshot."""
    node = sim_node(tmp_path)
    node.control.set_workload(0, tensor_active=0.5)
    sampler = node.sampler()
    two_ticks(sampler)
    exporter = MetricsExporter(load_counters(), "dcgm", sampler.latest, node.stats)
    node.driver.close()
    body, _ = exporter.render("text/plain")
    assert b"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{" in body


def test_one_gpus_nvml_failure_does_not_silence_the_others(tmp_path: Path) -> None:
    node = sim_node(tmp_path)
    sampler = node.sampler()
    sampler.tick()
    node.control.inject_fault("nvmlDeviceGetMigMode", "UNKNOWN", gpu=4)
    snapshot = sampler.tick()
    assert {s.entity.gpu.index for s in snapshot.entities} == set(range(8)) - {4}
    assert all(s.up for s in snapshot.gpus), "an unknown error is not a lost GPU"
    assert dict(node.stats.view().errors) == {"nvml": 1}
    assert {s.entity.gpu.index for s in sampler.tick().entities} == set(range(8))


def _idle_sampler(node, mono: list[float], wall: list[float]):  # type: ignore[no-untyped-def]
    from agent.telemetry.sampler import SamplerOptions

    options = SamplerOptions(hostname="n", proc_root=node.control.proc_root)
    return node.sampler(options=options, clock=lambda: mono[0], wall_clock=lambda: wall[0])


def test_after_an_agent_restart_idle_counts_from_the_start_never_over_the_downtime(
    tmp_path: Path,
) -> None:
    """A restart carried on from the saved last-busy time: the downtime counted as idle, so a
    GPU busy while no agent watched read as idle for the whole gap, and the day-long reclaim
    alert could fire on it. What happened meanwhile is unknown: the new agent counts from its
    own first reading (the alert fires a day after the restart at the earliest)."""
    node = sim_node(tmp_path)
    mono, wall = [100.0], [1_000_000.0]
    first = _idle_sampler(node, mono, wall)
    first.tick()
    mono[0] += 3600
    wall[0] += 3600
    assert entity(first.tick(), 0).idle_seconds == 3600
    first.stop()
    # The new process: another monotonic clock; 120 s of downtime, the GPU maybe used in it.
    mono[0], wall[0] = 5.0, wall[0] + 120
    second = _idle_sampler(node, mono, wall)
    assert entity(second.tick(), 0).idle_seconds == 0
    mono[0] += 60
    wall[0] += 60
    assert entity(second.tick(), 0).idle_seconds == 60
    # ... and the series' HELP, what Grafana shows of it, says so.
    body, _ = MetricsExporter(load_counters(), "dcgm", second.latest, node.stats).render("")
    (help_line,) = [h for h in body.decode().splitlines() if h.startswith("# HELP gpu_agent_idle")]
    assert "kept across agent restarts" not in help_line
    assert "counted from when this agent first read the GPU" in help_line
    node.control.set_workload(0, sm_active=0.5)
    mono[0] += 1
    wall[0] += 1
    assert entity(second.tick(), 0).idle_seconds == 0  # busy resets as before
    assert not list(tmp_path.rglob("telemetry-idle.json"))  # nothing saved to carry over


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
def test_a_clock_step_neither_adds_nor_removes_idle_seconds(tmp_path: Path, step_s: float) -> None:
    """The wall clock stepped an hour while the agent ran: idle seconds count on as before."""
    node = sim_node(tmp_path)
    mono, wall = [100.0], [1_000_000.0]
    sampler = _idle_sampler(node, mono, wall)
    sampler.tick()  # GPU 0 idle from here
    mono[0] += 30
    wall[0] += 30 + step_s
    assert entity(sampler.tick(), 0).idle_seconds == 30


def test_fresh_waits_for_a_snapshot_taken_after_the_call(tmp_path: Path) -> None:
    """After a change the agent made (a MIG apply), GetNode must not serve a snapshot taken while
    the change ran: fresh() wakes the sampler and returns once a later snapshot is out."""
    from agent.telemetry.sampler import SamplerOptions

    node = sim_node(tmp_path)
    options = SamplerOptions(interval_s=3600, hostname="n", proc_root=node.control.proc_root)
    sampler = node.sampler(options=options)
    assert not sampler.fresh(timeout_s=0.1)  # no thread: nothing to wait for
    sampler.start()
    try:
        first = sampler.latest()
        uuid = node.uuids[0]
        node.driver.set_mig_mode(uuid, True)
        assert sampler.fresh(timeout_s=10)
        latest = sampler.latest()
        assert latest is not first and latest is not None
        (layout,) = [lay for lay in latest.layouts if lay.gpu.uuid == uuid]
        assert layout.gpu.mig_mode is not None and layout.gpu.mig_mode.current
    finally:
        sampler.stop()


def test_a_burst_of_wake_ups_does_not_postpone_the_next_interval(tmp_path: Path) -> None:
    """Twenty changes in a row wake the sampler twenty times; the periodic tick after them
    still comes one interval on (it came twenty intervals later: GetNode served a snapshot
    without a newly started process for 25 s)."""
    from agent.telemetry.sampler import SamplerOptions

    node = sim_node(tmp_path)
    interval = 1.0
    options = SamplerOptions(interval_s=interval, hostname="n", proc_root=node.control.proc_root)
    sampler = node.sampler(options=options)
    sampler.start()
    try:
        for _ in range(20):
            assert sampler.fresh(timeout_s=10)  # one woken tick each
        after_burst = sampler.latest()
        assert after_burst is not None
        # With no more wake-ups, a periodic tick within two intervals (not twenty).
        deadline = time.monotonic() + 15
        while sampler.latest() is after_burst and time.monotonic() < deadline:
            time.sleep(0.01)
        latest = sampler.latest()
        assert latest is not None and latest is not after_burst
        assert latest.taken_mono - after_burst.taken_mono < 2 * interval
    finally:
        sampler.stop()
