"""The GPU layer: the only code that talks to NVML (real or simulated)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from agent.errors import DriverUnavailable
from agent.gpu.nvml import GpuDriver

__all__ = ["GpuDriver", "explain", "load_driver", "open_driver"]


#: What is wrong when NVML is missing inside a pod: the runtime did not inject the driver.
IN_POD_HINT = (
    " In a pod, the NVIDIA container runtime injects libnvidia-ml.so.1: the pod must run with "
    "runtimeClassName: nvidia (deploy/kubernetes sets it; check `kubectl get runtimeclass "
    "nvidia`), or, where nvidia is containerd's default runtime, be deployed with "
    "deploy/kubernetes/overlays/nvidia-default-runtime."
)


def load_driver(simulate: str | None, state_dir: Path, *, latency: bool = False) -> GpuDriver:
    """The driver facade over the real pynvml, or over the simulated node ``simulate`` whose
    state lives in ``state_dir`` (created from the preset if there is none); NVML is not
    initialised yet (`GpuDriver.open`, or `agent.gpu.attach.DriverLink` in a running agent)."""
    if simulate:
        from agent.gpu import sim

        return GpuDriver(sim.open_simulator(state_dir, simulate, latency=latency))
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise DriverUnavailable("the nvidia-ml-py package is not installed") from exc
    return GpuDriver(pynvml)


def explain(exc: DriverUnavailable, *, simulated: bool, env: Mapping[str, str] = os.environ) -> str:
    """What a missing NVML means here, in one line: in a pod (``KUBERNETES_SERVICE_HOST``
    set) the runtime class to check; on a machine, how to run the simulator instead (never a
    silent fall-back to it)."""
    cause = exc.__cause__ or exc
    if simulated:
        return f"cannot use NVML ({cause}): the simulated driver is not loaded"
    if env.get("KUBERNETES_SERVICE_HOST"):
        return f"cannot use NVML ({cause}): no NVIDIA driver in this container." + IN_POD_HINT
    return (
        f"cannot use NVML ({cause}): no NVIDIA driver on this machine. "
        "To run on a simulated node instead, pass --simulate PRESET "
        "(e.g. --simulate dgx-h100; list presets with `gpu-agent sim presets`)."
    )


def open_driver(
    simulate: str | None,
    state_dir: Path,
    *,
    latency: bool = False,
    env: Mapping[str, str] = os.environ,
) -> GpuDriver:
    """`load_driver`, opened: for one-shot tools (benchmarks, tests) that need the GPUs now.

    A machine without NVML gets DriverUnavailable saying what is wrong (`explain`).
    """
    driver = load_driver(simulate, state_dir, latency=latency)
    try:
        return driver.open()
    except DriverUnavailable as exc:
        raise DriverUnavailable(explain(exc, simulated=bool(simulate), env=env)) from exc
