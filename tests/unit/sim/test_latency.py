"""The latency model: off by default, NVML-like call costs when on (telemetry.md §4)."""

from __future__ import annotations

import time
from pathlib import Path

import pynvml

from agent.gpu.sim import open_simulator


def _pcie_call_seconds(state_dir: Path, *, latency: bool) -> float:
    nvml = open_simulator(state_dir, "dgx-h100", latency=latency)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    started = time.perf_counter()
    nvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
    elapsed = time.perf_counter() - started
    nvml.nvmlShutdown()
    return elapsed


def test_pcie_throughput_blocks_for_its_sampling_window(tmp_path: Path) -> None:
    assert _pcie_call_seconds(tmp_path, latency=True) >= 0.020


def test_no_modelled_latency_by_default(tmp_path: Path) -> None:
    assert _pcie_call_seconds(tmp_path, latency=False) < 0.010
