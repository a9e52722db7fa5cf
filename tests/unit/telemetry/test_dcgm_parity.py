"""dcgm-exporter parity of what the counters CSV selects: per-GPU label fields, 1.x series
names, DCGM_EXP_XID_ERRORS_COUNT with its xid / window_size_in_ms labels, and rows the agent
cannot serve reported unsupported rather than 0."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.config import TelemetrySettings
from agent.gpu import open_driver
from agent.gpu.sim import SimControl
from agent.gpu.sim.abi import set_value
from agent.telemetry.service import build_telemetry
from dcgm.counters import parse_counters
from tests.unit.api.support import wait_for
from tests.unit.telemetry.simnode import sim_node

CSV = """\
dcgm_gpu_temp, gauge, GPU temperature (in C).
DCGM_FI_DEV_SERIAL, label, Device Serial Number
DCGM_FI_DEV_BRAND, label, Device Brand
DCGM_FI_DEV_VBIOS_VERSION, label, VBIOS version of the device
DCGM_EXP_XID_ERRORS_COUNT, counter, reported XIDs during last window
DCGM_EXP_GPU_HEALTH_STATUS, counter, DCGM reported health status
"""


def test_label_fields_legacy_names_and_the_xid_window(tmp_path: Path) -> None:
    state = tmp_path / "state"
    driver = open_driver("dgx-h100", state)
    csv = tmp_path / "c.csv"
    csv.write_text(CSV)
    settings = TelemetrySettings(kubelet_socket=tmp_path / "absent.sock", collectors=csv)
    service = build_telemetry(driver, settings, hostname="n", attribute_pods=False)
    service.xids.start()
    try:
        SimControl(state).raise_xid(2, 79)
        SimControl(state).raise_xid(2, 79)
        wait_for(lambda: sum(service.xids.state().recent.values()) == 2, "both XIDs counted", 10)
        service.sampler.tick()
        text = service.exporter.render("text/plain")[0].decode()
    finally:
        service.xids.stop()
        driver.close()
    temps = [line for line in text.splitlines() if line.startswith("dcgm_gpu_temp{")]
    assert len(temps) == 8  # the 1.x name, once per GPU
    serials = re.findall(r'DCGM_FI_DEV_SERIAL="([^"]+)"', temps[0])
    assert len(serials) == 1 and serials[0]
    assert 'DCGM_FI_DEV_BRAND="NVIDIA"' in temps[0]
    assert "DCGM_FI_DEV_VBIOS_VERSION" not in text.replace("# HELP", "")  # unknown: no label
    (xid,) = [line for line in text.splitlines() if line.startswith("DCGM_EXP_XID_ERRORS_COUNT{")]
    assert 'gpu="2"' in xid and 'xid="79"' in xid and 'window_size_in_ms="300000"' in xid
    assert xid.endswith(" 2.0")
    assert not any(line.startswith("DCGM_EXP_GPU_HEALTH_STATUS{") for line in text.splitlines())
    supported = re.findall(
        r'gpu_agent_field_supported\{[^}]*field="DCGM_EXP_GPU_HEALTH_STATUS"[^}]*\} (\S+)', text
    )
    assert supported and set(supported) == {"0.0"}


def test_clock_events_count_the_samples_with_each_reason_in_the_window(tmp_path: Path) -> None:
    """DCGM_EXP_CLOCK_EVENTS_COUNT{clock_event, window_size_in_ms}: per GPU, the samples within
    the window that had the reason set (the simulator reports gpu_idle while nothing runs)."""
    state = tmp_path / "state"
    driver = open_driver("dgx-h100", state)
    SimControl(state).set_workload(0, sm_active=0.5)
    csv = tmp_path / "c.csv"
    csv.write_text("DCGM_EXP_CLOCK_EVENTS_COUNT, counter, reported clock events\n")
    settings = TelemetrySettings(kubelet_socket=tmp_path / "absent.sock", collectors=csv)
    service = build_telemetry(driver, settings, hostname="n", attribute_pods=False)
    for _ in range(3):
        service.sampler.tick()
    text = service.exporter.render("text/plain")[0].decode()
    driver.close()
    rows = [line for line in text.splitlines() if line.startswith("DCGM_EXP_CLOCK_EVENTS_COUNT{")]
    gpus = {re.search(r'gpu="(\d+)"', line).group(1) for line in rows}  # type: ignore[union-attr]
    assert gpus == {str(i) for i in range(1, 8)}  # GPU 0 is busy: not idle
    assert all('clock_event="gpu_idle"' in r and 'window_size_in_ms="300000"' in r for r in rows)
    assert all(r.endswith(" 3.0") for r in rows)


def test_p2p_status_per_gpu_and_peer(tmp_path: Path) -> None:
    """DCGM_EXP_P2P_STATUS{peer_gpu, link_status}: read once from NVML. The simulator answers
    from the preset's NVLink topology: h100-nvl is one bridged pair."""
    state = tmp_path / "state"
    driver = open_driver("h100-nvl", state)
    csv = tmp_path / "c.csv"
    csv.write_text("DCGM_EXP_P2P_STATUS, counter, P2P NvLink status\n")
    settings = TelemetrySettings(kubelet_socket=tmp_path / "absent.sock", collectors=csv)
    service = build_telemetry(driver, settings, hostname="n", attribute_pods=False)
    service.sampler.tick()
    before = sum(driver.calls.values())
    service.sampler.tick()
    text = service.exporter.render("text/plain")[0].decode()
    p2p_calls = driver.calls["nvmlDeviceGetP2PStatus"]
    driver.close()
    rows = [line for line in text.splitlines() if line.startswith("DCGM_EXP_P2P_STATUS{")]
    got = {
        (re.search(r'gpu="(\d)"', r).group(1), re.search(r'peer_gpu="(\d)"', r).group(1))  # type: ignore[union-attr]
        for r in rows
    }
    assert got == {("0", "1"), ("1", "0")}
    assert all('link_status="OK"' in r and r.endswith(" 0.0") for r in rows)
    assert p2p_calls == 2 and before > 0  # not read again every tick (every 30 s)


@pytest.mark.parametrize(
    "noticed_by", ["the 30 s re-read", "a MIG layout change", "the peer answering again"]
)
def test_a_p2p_status_that_changes_is_exported_as_it_is_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, noticed_by: str
) -> None:
    """Read once at start, the status said OK for the agent's life, whatever NVML answered
    later (a bridge's links that failed, or did not retrain after a GPU reset)."""
    node = sim_node(tmp_path, "h100-nvl")  # one bridged pair: GPUs 0 and 1
    exports = node.driver.nvml.module.nvmlLib._exports
    board = exports["nvmlDeviceGetP2PStatus"]
    down = [False]

    def links_down(device1: Any, device2: Any, index: Any, ref: Any) -> Any:
        ret = board(device1, device2, index, ref)
        if down[0]:
            set_value(ref, pynvml.NVML_P2P_STATUS_NOT_SUPPORTED)
        return ret

    monkeypatch.setitem(exports, "nvmlDeviceGetP2PStatus", links_down)
    now = [0.0]
    counters = parse_counters("DCGM_EXP_P2P_STATUS, counter, P2P NvLink status\n")
    sampler = node.sampler(counters, clock=lambda: now[0])
    assert {(p.gpu.index, p.peer, p.status) for p in sampler.tick().p2p} == {(0, 1, 0), (1, 0, 0)}
    down[0] = True
    if noticed_by == "a MIG layout change":
        node.create_instance(0, "1g.12gb")
        now[0] += 1.0
    elif noticed_by == "the peer answering again":  # e.g. its reads failing while it resets
        node.control.inject_fault("nvmlDeviceGetMigMode", "UNKNOWN", gpu=1)
        now[0] += 1.0
        assert not sampler.tick().p2p, "a link to a peer that does not answer is not known"
        now[0] += 1.0
    else:
        now[0] += 31.0
    got = {(p.gpu.index, p.peer, p.status) for p in sampler.tick().p2p}
    not_supported = pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
    assert got == {(0, 1, not_supported), (1, 0, not_supported)}


def test_p2p_status_to_a_lost_peer_is_absent_not_the_ok_read_at_start(tmp_path: Path) -> None:
    """Read once, the status says OK; once the peer falls off the bus the link is not OK any
    more, and what it is cannot be read: GPU 0's row for peer 1 goes, as GPU 1's own rows do."""
    state = tmp_path / "state"
    driver = open_driver("h100-nvl", state)
    csv = tmp_path / "c.csv"
    csv.write_text("DCGM_EXP_P2P_STATUS, counter, P2P NvLink status\n")
    settings = TelemetrySettings(kubelet_socket=tmp_path / "absent.sock", collectors=csv)
    service = build_telemetry(driver, settings, hostname="n", attribute_pods=False)
    service.sampler.tick()
    SimControl(state).mark_lost(1)
    service.sampler.tick()
    text = service.exporter.render("text/plain")[0].decode()
    driver.close()
    assert "gpu_agent_gpu_up{" in text and not [
        line for line in text.splitlines() if line.startswith("DCGM_EXP_P2P_STATUS{")
    ]


def test_p2p_status_without_the_call_is_unsupported_not_ok(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    driver = open_driver("h100-nvl", state)
    # A driver library without the symbol: pynvml raises FunctionNotFound.
    monkeypatch.delitem(driver.nvml.module.nvmlLib._exports, "nvmlDeviceGetP2PStatus")
    csv = tmp_path / "c.csv"
    csv.write_text("DCGM_EXP_P2P_STATUS, counter, P2P NvLink status\n")
    settings = TelemetrySettings(kubelet_socket=tmp_path / "absent.sock", collectors=csv)
    service = build_telemetry(driver, settings, hostname="n", attribute_pods=False)
    service.sampler.tick()
    text = service.exporter.render("text/plain")[0].decode()
    driver.close()
    assert not any(line.startswith("DCGM_EXP_P2P_STATUS{") for line in text.splitlines())
    assert re.search(
        r'gpu_agent_field_supported\{[^}]*field="DCGM_EXP_P2P_STATUS"[^}]*\} 0.0', text
    )


def test_a_csv_naming_fields_the_agent_cannot_read_starts_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The rows that used to stop the agent: served where the agent reads the field, otherwise
    logged once at start and exposed as unserved, never a refusal."""
    state = tmp_path / "state"
    driver = open_driver("dgx-h100", state)
    csv = tmp_path / "c.csv"
    csv.write_text(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS, gauge, clock event reasons\n"
        "DCGM_FI_DEV_FB_USED_PERCENT, gauge, framebuffer used\n"
        "DCGM_FI_DEV_NVSWITCH_LINK_CRC_ERRORS, counter, switch CRC\n"
    )
    settings = TelemetrySettings(kubelet_socket=tmp_path / "absent.sock", collectors=csv)
    with caplog.at_level("WARNING", logger="agent.telemetry.service"):
        service = build_telemetry(driver, settings, hostname="n", attribute_pods=False)
    try:
        service.sampler.tick()
        service.sampler.tick()
        text = service.exporter.render("text/plain")[0].decode()
    finally:
        driver.close()
    reasons = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_CLOCKS_EVENT")]
    # An idle GPU: clocks held down for nvmlClocksEventReasonGpuIdle (0x1) only.
    assert len(reasons) == 8 and all(line.endswith(" 1.0") for line in reasons)
    unserved = [m for m in caplog.messages if "is not served" in m]
    assert len(unserved) == 2
    assert "DCGM_FI_DEV_FB_USED_PERCENT" in unserved[0] and "no NVML reading" in unserved[0]
    assert "DCGM_FI_DEV_NVSWITCH_LINK_CRC_ERRORS" in unserved[1] and "NVSwitch" in unserved[1]
    assert (
        'gpu_agent_dcgm_field_unserved{field="DCGM_FI_DEV_FB_USED_PERCENT",'
        'reason="gpu-agent has no NVML reading for it yet"} 1.0'
    ) in text
