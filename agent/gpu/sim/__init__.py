"""The simulated NVML driver: a drop-in for pynvml on a node without GPUs.

* ``open_simulator(state_dir, preset)`` -> ``SimNvml``, a module object with pynvml's surface
  (constants, structs, exception classes are pynvml's own) whose NVML calls reach the simulated
  node stored under ``<state_dir>/sim``;
* ``install_as_pynvml(...)`` puts that module in ``sys.modules["pynvml"]`` so third-party code
  (nvitop) runs unmodified;
* ``SimControl(state_dir)`` changes the node from outside NVML: workloads, processes, holder
  daemons, faults, XIDs, lost GPUs, resets and reboots.

Layout: ``state``/``store`` (the node and its file), ``layout``/``lifecycle``/``activity`` (driver
rules), ``abi``/``handles``/``driver``/``memory`` and ``sym_*`` (the C library pynvml calls),
``generations`` (which symbols a driver version exports), ``surface`` (the pynvml module),
``faults``, ``latency``, ``control``. The GPU models themselves are product data in
``agent.gpu.models``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from agent.errors import Conflict
from agent.gpu.sim import lifecycle
from agent.gpu.sim.control import SimControl, missing_node
from agent.gpu.sim.presets import get_preset
from agent.gpu.sim.state import new_node
from agent.gpu.sim.store import StateStore
from agent.gpu.sim.surface import SimNvml

__all__ = ["SimControl", "SimNvml", "install_as_pynvml", "open_simulator"]


def open_simulator(state_dir: Path, preset: str | None = None, *, latency: bool = False) -> SimNvml:
    """Open the simulated node in ``state_dir``, creating it from ``preset`` if there is none.

    An existing node is never replaced: a different ``preset`` raises Conflict. Without a node
    and without a preset there is nothing to open (InvalidSpec).
    """
    store = StateStore(Path(state_dir))
    wanted = get_preset(preset) if preset is not None else None
    if store.exists():
        stored = store.read().preset
    elif wanted is None:
        raise missing_node(Path(state_dir))
    else:
        fresh = new_node(wanted)
        lifecycle.boot(fresh, time.monotonic())
        stored = store.create(fresh).preset
    if wanted is not None and stored != wanted.name:
        raise Conflict(
            f"{state_dir} already holds a simulated {stored!r} node; refusing to replace it with "
            f"{wanted.name!r} (use another state dir, or delete {store.root} to start over)"
        )
    return SimNvml(store, latency=latency)


def install_as_pynvml(
    state_dir: Path, preset: str | None = None, *, latency: bool = False
) -> SimNvml:
    """Make ``import pynvml`` return the simulator from now on; returns the module."""
    module = open_simulator(state_dir, preset, latency=latency)
    sys.modules["pynvml"] = module
    return module
