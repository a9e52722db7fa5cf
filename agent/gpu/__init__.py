"""The GPU layer: the only code that talks to NVML (real or simulated)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from agent.errors import DriverUnavailable
from agent.gpu.nvml import GpuDriver

__all__ = ["GpuDriver", "open_driver"]


#: What is wrong when NVML is missing inside a pod: the runtime did not inject the driver.
IN_POD_HINT = (
    " In a pod, the NVIDIA container runtime injects libnvidia-ml.so.1: the pod must run with "
    "runtimeClassName: nvidia (deploy/kubernetes sets it; check `kubectl get runtimeclass "
    "nvidia`), or, where nvidia is containerd's default runtime, be deployed with "
    "deploy/kubernetes/overlays/nvidia-default-runtime."
)


def open_driver(
    simulate: str | None,
    state_dir: Path,
    *,
    latency: bool = False,
    env: Mapping[str, str] = os.environ,
) -> GpuDriver:
    """Open the real NVML, or the simulated node ``simulate`` whose state lives in ``state_dir``.

    Never falls back to the simulator on its own: a machine without NVML gets a clear error,
    which in a pod (``KUBERNETES_SERVICE_HOST`` set) names the runtime class to check.
    """
    if simulate:
        from agent.gpu import sim

        return GpuDriver(sim.open_simulator(state_dir, simulate, latency=latency)).open()
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise DriverUnavailable("the nvidia-ml-py package is not installed") from exc
    try:
        return GpuDriver(pynvml).open()
    except DriverUnavailable as exc:
        if env.get("KUBERNETES_SERVICE_HOST"):
            raise DriverUnavailable(
                f"cannot use NVML ({exc.__cause__}): no NVIDIA driver in this container."
                + IN_POD_HINT
            ) from exc
        raise DriverUnavailable(
            f"cannot use NVML ({exc.__cause__}): no NVIDIA driver on this machine. "
            "To run on a simulated node instead, pass --simulate PRESET "
            "(e.g. --simulate dgx-h100; list presets with `gpu-agent sim presets`)."
        ) from exc
