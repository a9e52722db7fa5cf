"""The MIG strategy the device plugin runs with, and whether it exposes this node's MIG devices.

The plugin takes ``migStrategy`` from its command line (``--mig-strategy``) or environment
(``MIG_STRATEGY``) when either is set, and from its config file only when neither is; with none of
them it is ``none`` (k8s-device-plugin ``api/config/v1/flags.go``, ``UpdateFromCLIFlags``;
reference/mig.md §5.1). The GPU Operator sets ``MIG_STRATEGY`` on the plugin's container, so there
the file's ``flags.migStrategy`` is ignored.

Pure: the doctor reads the plugin's ``/proc/PID/{cmdline,environ}`` and hands them in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.gpu.types import GpuLayout
from agent.sharing.advertise import (
    GPU_RESOURCE,
    mig_device_profiles,
    mig_enabled,
    single_strategy_problem,
)
from agent.sharing.schema import MIG_STRATEGIES

__all__ = ["ENV", "FLAG", "Strategy", "effective", "problem", "started_with"]

ENV = "MIG_STRATEGY"
FLAG = "mig-strategy"
DEFAULT = "none"


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
