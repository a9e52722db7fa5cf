"""The MIG strategy the device plugin runs with, and whether it exposes this node's MIG devices.

The plugin takes ``migStrategy`` from its command line (``--mig-strategy``) or environment
(``MIG_STRATEGY``) when either is set, and from its config file only when neither is; with none of
them it is ``none`` (k8s-device-plugin ``api/config/v1/flags.go``, ``UpdateFromCLIFlags``;
reference/mig.md §5.1). The GPU Operator sets ``MIG_STRATEGY`` on the plugin's container, so there
the file's ``flags.migStrategy`` is ignored.

Pure but for `read_started_with`, the one reader of the running plugin's ``/proc/PID/cmdline``
and ``environ`` (the doctor's check and the sharing service both use it). It keeps the strategy
and nothing else of them: the environment may hold secrets (docs/security.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from agent.gpu.types import GpuLayout
from agent.sharing.advertise import (
    GPU_RESOURCE,
    mig_device_profiles,
    mig_enabled,
    single_strategy_problem,
)
from agent.sharing.schema import MIG_STRATEGIES, MigStrategy, PluginConfig

__all__ = [
    "ENV",
    "FLAG",
    "Strategy",
    "effective",
    "override_problem",
    "problem",
    "read_started_with",
    "run_with",
    "started_with",
    "unknown_and_matters",
]

ENV = "MIG_STRATEGY"
FLAG = "mig-strategy"
DEFAULT = "none"
#: Most bytes read of a process's command line or environment (the kernel allows 2 MiB).
PROC_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Strategy:
    """A MIG strategy and where it comes from, in words (``the plugin's MIG_STRATEGY``)."""

    value: str
    source: str
    #: True when it is the plugin's own setting, which the config file cannot change
    overrides_file: bool = False


def started_with(argv: Sequence[str], environ: Mapping[str, str]) -> Strategy | None:
    """The strategy the plugin's command line or environment sets, or None when neither does.

    Go's flag parsing (urfave/cli) takes ``--mig-strategy X``, ``--mig-strategy=X`` and the
    one-dash spellings, the last one given winning, and stops at ``--``; a flag on the command
    line wins over the environment variable.
    """
    found: Strategy | None = None
    args = list(argv[1:])
    for i, arg in enumerate(args):
        if arg == "--":
            break
        name, eq, value = arg.partition("=")
        if name not in (f"-{FLAG}", f"--{FLAG}"):
            continue
        if not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        found = Strategy(value, f"the plugin's {name} flag", overrides_file=True)
    if found is None and ENV in environ:
        found = Strategy(environ[ENV], f"the plugin's {ENV} environment variable", True)
    return found


def effective(file_value: str | None, started: Strategy | None) -> Strategy:
    """What the plugin runs with: its own setting, else the file's, else its default."""
    if started is not None:
        return started
    if file_value is not None:
        return Strategy(file_value, "the config file's flags.migStrategy")
    return Strategy(DEFAULT, "the plugin's default")


def problem(strategy: str, layouts: Sequence[GpuLayout]) -> str | None:
    """Why the plugin, run with ``strategy``, does not expose this node's MIG devices; None when
    it does (or when no GPU has MIG enabled, which every strategy serves)."""
    if strategy not in MIG_STRATEGIES:
        return (
            f"migStrategy {strategy!r} is none of {', '.join(MIG_STRATEGIES)}: the plugin "
            "refuses to start"
        )
    enabled = [layout for layout in layouts if mig_enabled(layout)]
    if strategy == "none" and enabled:
        devices = sum(len(mig_device_profiles(layout)) for layout in enabled)
        gpus = ", ".join(str(layout.gpu.index) for layout in enabled)
        return (
            f"MIG is enabled on GPU(s) {gpus} but migStrategy is none: the plugin advertises "
            f"them whole as {GPU_RESOURCE} and none of their {devices} MIG device(s)"
        )
    if strategy == "single":
        why = single_strategy_problem(layouts)
        if why is not None:
            return f"migStrategy single, but {why}: the plugin advertises {GPU_RESOURCE} 0 here"
    return None


def unknown_and_matters(
    config: PluginConfig, started: Strategy | None, seen: bool, layouts: Sequence[GpuLayout]
) -> str | None:
    """Why what the plugin advertises is not known for want of its strategy, or None.

    It is unknown when the file sets none and the plugin's own flag and environment were not
    read (its process not visible: the agent needs hostPID), for the GPU Operator sets
    MIG_STRATEGY there. It matters only with MIG enabled: every strategy advertises MIG-disabled
    GPUs alike, as nvidia.com/gpu."""
    if config.flags.mig_strategy is not None or started is not None or seen:
        return None
    enabled = [layout.gpu.index for layout in layouts if mig_enabled(layout)]
    if not enabled:
        return None
    return (
        f"the plugin's migStrategy is not known and MIG is enabled on GPU(s) "
        f"{', '.join(map(str, enabled))}, which each strategy advertises differently: the file "
        f"sets none and the plugin's process is not visible (its --{FLAG} or {ENV} decides; "
        "run the agent with hostPID: true, or set flags.migStrategy)"
    )


def run_with(config: PluginConfig, started: Strategy | None) -> PluginConfig | None:
    """``config`` as the plugin runs it: with the strategy its own flag or environment sets laid
    over the file's; None when that strategy is one the plugin refuses (it does not start)."""
    if started is None or started.value == config.flags.mig_strategy:
        return config
    if started.value not in MIG_STRATEGIES:
        return None
    flags = dataclasses.replace(config.flags, mig_strategy=cast(MigStrategy, started.value))
    return dataclasses.replace(config, flags=flags)


def override_problem(config: PluginConfig, started: Strategy | None) -> str | None:
    """What the plugin's own setting does to the file's ``flags.migStrategy``, when it differs."""
    if started is None or started.value == config.mig_strategy:
        return None
    written = config.flags.mig_strategy
    said = f"the file's {written}" if written is not None else "the file, which sets none"
    return (
        f"migStrategy {started.value!r} from {started.source} overrides {said}: change it "
        "there (GPU Operator: the ClusterPolicy's mig.strategy)"
    )


def read_started_with(proc: Path, pid: int) -> tuple[Strategy | None, str]:
    """The strategy process ``pid`` was started with, read from ``proc``/PID, and a caveat when
    its environment cannot be read (then MIG_STRATEGY is unknown, not absent)."""
    argv = _proc_strings(proc / str(pid) / "cmdline")
    environ = _proc_strings(proc / str(pid) / "environ")
    env = {k: v for k, _, v in (e.partition("=") for e in environ or ()) if k == ENV}
    started = started_with(argv or [], env)
    if started is None and environ is None:
        return None, f"the environment of pid {pid} is not readable: {ENV} unknown"
    return started, ""


def _proc_strings(path: Path) -> list[str] | None:
    """A NUL-separated /proc file (cmdline, environ), bounded; None when it cannot be read."""
    try:
        with path.open("rb") as f:
            data = f.read(PROC_BYTES)
    except OSError:
        return None
    return [part.decode("utf-8", "replace") for part in data.split(b"\0") if part]
