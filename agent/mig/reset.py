"""GPU resets for MIG mode changes left pending. NVML has none (reference/mig.md §1.8), so a reset
is a callable the composition root chooses: a command on real nodes, the simulator's reset in
simulated mode, an operator's drain-and-reset tooling when configured.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

from agent.errors import Busy, FieldViolation, InvalidSpec
from agent.gpu.types import GpuInfo

ResetFn = Callable[[GpuInfo], None]
"""Reset one GPU so that its pending MIG mode takes effect; raises an AgentError if it cannot."""

_TIMEOUT_S = 120.0


def command_reset(template: str, *, timeout_s: float = _TIMEOUT_S) -> ResetFn:
    """A reset that runs ``template`` with ``{bus_id}`` replaced (default ``nvidia-smi -r -i``)."""
    if "{bus_id}" not in template:
        raise InvalidSpec(
            f"MIG reset command {template!r} must contain {{bus_id}}",
            [FieldViolation("mig.reset_command", "must contain {bus_id}")],
        )

    def reset(gpu: GpuInfo) -> None:
        argv = shlex.split(template.format(bus_id=gpu.pci_bus_id))
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Busy(f"GPU {gpu.index} reset `{shlex.join(argv)}` failed: {exc}") from exc
        if done.returncode != 0:
            output = (done.stderr or done.stdout).strip().splitlines()
            raise Busy(
                f"GPU {gpu.index} reset `{shlex.join(argv)}` exited {done.returncode}: "
                f"{output[-1] if output else 'no output'} (stop the processes and daemons "
                "holding the GPU, e.g. nvidia-persistenced, DCGM)"
            )

    return reset


def simulated_reset(state_dir: Path) -> ResetFn:
    """The simulated node's ``nvidia-smi -r``: Busy while processes or daemons hold the GPU."""

    def reset(gpu: GpuInfo) -> None:
        from agent.gpu.sim import SimControl

        SimControl(state_dir).reset_gpu(gpu.index)

    return reset
