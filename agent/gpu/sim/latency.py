"""How long each simulated NVML call blocks when the latency model is on (``latency=True``).

Figures come from reference/telemetry.md §4 ("Cost of NVML calls"); the rest are labelled
estimates. Off by default so unit tests run at memory speed; ``serve`` and benchmarks turn it on.
"""

from __future__ import annotations

# telemetry.md §4: in-process NVML reads ~0.09 ms each (OpenKraken PR #3).
DEFAULT_S = 90e-6

SECONDS: dict[str, float] = {
    # telemetry.md §4: samples a byte counter over a 20 ms window, blocking ~20 ms per call.
    "nvmlDeviceGetPcieThroughput": 20e-3,
    # telemetry.md §4: ~2 700 calls/s on a K40m, ~0.37 ms each (gpustat #76, pynvml PR #18).
    "nvmlDeviceGetPowerUsage": 370e-6,
    "nvmlDeviceGetTotalEnergyConsumption": 370e-6,
    # estimate: with persistence mode on, init does not wait for the driver to set up the GPUs
    # (§4 gives "seconds" only for the case without persistence mode).
    "nvmlInitWithFlags": 50e-3,
    "nvmlInit_v2": 50e-3,
    # estimate: process lists walk driver client tables (§4: "heaviest per-GPU work").
    "nvmlDeviceGetComputeRunningProcesses_v3": 200e-6,
    "nvmlDeviceGetGraphicsRunningProcesses_v3": 200e-6,
    # estimate: GPM samples read a block of hardware counters.
    "nvmlGpmSampleGet": 200e-6,
    "nvmlGpmMigSampleGet": 200e-6,
    # estimate: MIG reconfiguration goes through the resource manager.
    "nvmlDeviceCreateGpuInstance": 100e-3,
    "nvmlDeviceCreateGpuInstanceWithPlacement": 100e-3,
    "nvmlGpuInstanceDestroy": 100e-3,
    "nvmlGpuInstanceCreateComputeInstance": 50e-3,
    "nvmlGpuInstanceCreateComputeInstanceWithPlacement": 50e-3,
    "nvmlComputeInstanceDestroy": 50e-3,
    # estimate: a MIG mode change includes the driver's own GPU reset.
    "nvmlDeviceSetMigMode": 1.0,
    # blocks by design until an event or its timeout; no extra cost modelled.
    "nvmlEventSetWait_v2": 0.0,
}


def seconds(symbol: str) -> float:
    return SECONDS.get(symbol, DEFAULT_S)
