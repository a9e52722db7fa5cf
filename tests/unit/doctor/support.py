"""Crafted facts for the doctor's checks: a config under a temp dir, a driver link that says
what a test wants, and a Kubernetes API stand-in that answers what the checks ask."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from agent.config import AgentConfig, load_config
from agent.doctor.facts import Facts
from agent.dra.mode import Allocation, AllocationMode
from agent.gpu.attach import DriverLink, DriverState


def config(root: Path, **changes: Any) -> AgentConfig:
    base = load_config(None, {}, {"state_dir": root / "state"})
    prewarm = dataclasses.replace(base.prewarm, cache_dir=root / "cache")
    return dataclasses.replace(
        base, prewarm=prewarm, socket_path=root / "run" / "agent.sock", **changes
    )


def detached(cause: str, reason: str) -> DriverLink:
    state = DriverState(False, cause, reason, time.time())
    return cast(DriverLink, SimpleNamespace(state=state, is_attached=False, driver=None))


def facts(
    root: Path, *, driver: DriverLink | None = None, kube: Any = None, **changes: Any
) -> Facts:
    cfg = config(root)
    made = Facts(
        config=cfg,
        driver=driver or detached("library_not_found", "cannot use NVML"),
        kube=kube,
        allocation=lambda: Allocation(AllocationMode.DEVICE_PLUGIN, "set in config"),
        snapshot=lambda: None,
        xids=lambda: {},
        marks=lambda: {},
        state_read_only=lambda: None,
        socket_path=cfg.socket_path,
        env={},
    )
    return dataclasses.replace(made, **changes)


def volume(total_gib: float, free_gib: float) -> Any:
    """An os.statvfs answer for a volume of that size and free space (4 KiB blocks)."""
    block = 4096
    gib = 1024**3 // block
    values = [
        block,
        block,
        int(total_gib * gib),
        int(free_gib * gib),
        int(free_gib * gib),
        0,
        0,
        0,
        0,
        255,
    ]
    return lambda _path: os.statvfs_result(values)
