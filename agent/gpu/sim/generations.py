"""Driver generations: which libnvidia-ml symbols a driver version exports.

A real ``libnvidia-ml.so.1`` grows versioned symbols release by release and, once, lost one; pynvml
looks each symbol up by name and raises ``NVMLError_FunctionNotFound`` when the installed driver
lacks it. The simulated library answers the same way for the node's driver version (``driver.py``
consults ``has_symbol``), so the agent's fallbacks can be exercised on every generation.

Pure data and lookups. Symbols not named here exist on every generation the simulator accepts
(R470 and later).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.errors import FieldViolation, InvalidSpec

Version = tuple[int, ...]

_VERSION_RE = re.compile(r"^[1-9]\d{2}\.\d{1,3}(\.\d{1,3})?$")

OLDEST = "470.256.02"  # the oldest driver the simulator models (R470: MIG UUIDs "MIG-<uuid>")


@dataclass(frozen=True, slots=True)
class Span:
    """A symbol exported from ``since`` on, except for releases in ``gaps`` (``[from, to)``)."""

    since: Version
    gaps: tuple[tuple[Version, Version], ...] = ()

    def covers(self, version: Version) -> bool:
        if version < self.since:
            return False
        return not any(lo <= version < hi for lo, hi in self.gaps)


# The running-process v3 calls: added with R510 (CUDA 11.6 NVML), dropped by the upstream 535.98
# driver and exported again from 535.104.05 (nvitop CHANGELOG: #89 "removal for process info v3
# APIs on the upstream 535.98 driver", #94 "upstream changes ... on 535.104.05 driver").
_PROCESSES_V3 = Span((510,), gaps=(((535, 98), (535, 104, 5)),))

SYMBOLS: dict[str, Span] = {
    "nvmlDeviceGetComputeRunningProcesses_v3": _PROCESSES_V3,
    "nvmlDeviceGetGraphicsRunningProcesses_v3": _PROCESSES_V3,
    "nvmlDeviceGetMPSComputeRunningProcesses_v3": _PROCESSES_V3,
    # nvmlMemory_v2 (reserved memory): first in R510 (nvitop version.py: "11.510.69 the first
    # version supports the nvmlMemory_v2 API").
    "nvmlDeviceGetMemoryInfo_v2": Span((510,)),
    # "Clocks throttle reasons" were renamed "clocks event reasons" in R535 (CUDA 12.2); the old
    # name stays exported, deprecated (pynvml's note on ...GetCurrentClocksThrottleReasons).
    "nvmlDeviceGetCurrentClocksEventReasons": Span((535,)),
    # The versioned temperature query: assumed from R555 (the nvidia-ml-py 12.555 bindings are the
    # first to wrap it; nvitop falls back to nvmlDeviceGetTemperature without it).
    "nvmlDeviceGetTemperatureV": Span((555,)),
    # GPU performance monitoring came with the CUDA 12.0 NVML (R525); Hopper+ only on top.
    "nvmlGpmQueryDeviceSupport": Span((525,)),
    "nvmlGpmSampleAlloc": Span((525,)),
    "nvmlGpmSampleFree": Span((525,)),
    "nvmlGpmSampleGet": Span((525,)),
    "nvmlGpmMigSampleGet": Span((525,)),
    "nvmlGpmMetricsGet": Span((525,)),
}

# nvmlSystemGetCudaDriverVersion per driver branch: the CUDA version each branch first shipped.
_CUDA_BY_BRANCH = (
    ((580,), 13000),
    ((575,), 12090),
    ((570,), 12080),
    ((560,), 12060),
    ((555,), 12050),
    ((550,), 12040),
    ((545,), 12030),
    ((535,), 12020),
    ((530,), 12010),
    ((525,), 12000),
    ((520,), 11080),
    ((515,), 11070),
    ((510,), 11060),
    ((495,), 11050),
    ((470,), 11040),
)


def parse(version: str) -> Version:
    """``"535.104.05"`` -> ``(535, 104, 5)``; anything else is InvalidSpec naming the field."""
    if not isinstance(version, str) or not _VERSION_RE.match(version):
        raise InvalidSpec(
            f"invalid driver version {version!r}: expected BRANCH.MINOR[.PATCH], e.g. 535.104.05",
            [FieldViolation("driver_version", "BRANCH.MINOR[.PATCH], e.g. 535.104.05")],
        )
    return tuple(int(part) for part in version.split("."))


def has_symbol(name: str, version: str) -> bool:
    """Whether a driver of ``version`` exports the C symbol ``name``."""
    span = SYMBOLS.get(name)
    return span is None or span.covers(parse(version))


def missing_symbols(version: str) -> tuple[str, ...]:
    """Every symbol of the table a driver of ``version`` lacks, sorted."""
    v = parse(version)
    return tuple(sorted(name for name, span in SYMBOLS.items() if not span.covers(v)))


def cuda_driver_version(version: str) -> int:
    """What nvmlSystemGetCudaDriverVersion reports with this driver (e.g. 12020 = CUDA 12.2)."""
    v = parse(version)
    return next(cuda for branch, cuda in _CUDA_BY_BRANCH if v >= branch)


def check_supported(version: str, minimums: dict[str, str]) -> None:
    """Refuse a driver older than the simulator models or than a GPU's MIG minimum (by model)."""
    v = parse(version)
    floor = [(f"the simulator models R470 and later ({OLDEST})", OLDEST)]
    needs = floor + [(f"{model} needs {m} or later for MIG", m) for model, m in minimums.items()]
    for why, minimum in needs:
        if v < parse(minimum):
            raise InvalidSpec(
                f"driver {version} is too old: {why}",
                [FieldViolation("driver_version", f">= {minimum}")],
            )
