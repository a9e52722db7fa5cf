"""The one NVML gateway: every NVML function the agent calls goes through :class:`Gateway`.

It wraps the pynvml-compatible module (the real ``pynvml`` or ``agent.gpu.sim``) and

* counts the calls (``GpuDriver.calls``: the NVML budget is measured, not guessed);
* falls back through a function's versions when the driver lacks the newest one, as nvitop's
  libnvml does: ``nvmlDeviceGetComputeRunningProcesses`` tries ``_v3``, then ``_v2``, then the
  unversioned v1 symbol, on ``FunctionNotFound``, and remembers the first that worked (R450/R470
  and 535.98+ lack ``_v3``).

It changes when a driver's symbols do; what the calls mean to the agent, and how their errors
translate, is :mod:`agent.gpu.nvml`'s.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# NVML return codes (nvml.h) the gateway tells apart; pynvml exposes the same names.
_SUCCESS = 0
_ERR_FUNCTION_NOT_FOUND = 13

_NO_ID = 0xFFFFFFFF  # NVML's "not in a MIG instance" GI/CI id in process records


class _ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t (nvml.h before R510): no GI/CI ids."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def _processes_v1(n: Any, symbol: str) -> Callable[[Any], list[Any]]:
    """pynvml has no wrapper for the v1 process list; the same two-call protocol by hand."""

    def call(handle: Any) -> list[Any]:
        fn = n._nvmlGetFunctionPointer(symbol)
        count = ctypes.c_uint(0)
        ret = fn(handle, ctypes.byref(count), None)
        if ret == _SUCCESS:
            return []
        if ret != n.NVML_ERROR_INSUFFICIENT_SIZE:
            raise n.NVMLError(ret)
        count.value = count.value * 2 + 5  # room for processes started in between
        array = (_ProcessInfoV1 * count.value)()
        ret = fn(handle, ctypes.byref(count), array)
        if ret != _SUCCESS:
            raise n.NVMLError(ret)
        not_available = n.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
        return [
            _V1Process(
                int(array[i].pid),
                None if array[i].usedGpuMemory == not_available else int(array[i].usedGpuMemory),
            )
            for i in range(count.value)
        ]

    return call


@dataclass(frozen=True, slots=True)
class _V1Process:
    pid: int
    usedGpuMemory: int | None  # pynvml's attribute names
    gpuInstanceId: int = _NO_ID
    computeInstanceId: int = _NO_ID


Variant = Callable[[Any], Callable[..., Any]]

#: A function the agent calls by its plain name -> its versions, newest first. The plain pynvml
#: wrapper is hard-wired to one version (the process lists to ``_v3``), so each variant names
#: the exact versioned call.
_VERSIONS: dict[str, tuple[Variant, ...]] = {
    "nvmlDeviceGetComputeRunningProcesses": (
        lambda n: n.nvmlDeviceGetComputeRunningProcesses_v3,
        lambda n: n.nvmlDeviceGetComputeRunningProcesses_v2,
        lambda n: _processes_v1(n, "nvmlDeviceGetComputeRunningProcesses"),
    ),
    "nvmlDeviceGetGraphicsRunningProcesses": (
        lambda n: n.nvmlDeviceGetGraphicsRunningProcesses_v3,
        lambda n: n.nvmlDeviceGetGraphicsRunningProcesses_v2,
        lambda n: _processes_v1(n, "nvmlDeviceGetGraphicsRunningProcesses"),
    ),
    # v2 (R515+) separates reserved memory; v1 has no ``reserved`` (readings report it unknown).
    "nvmlDeviceGetMemoryInfo": (
        lambda n: functools.partial(n.nvmlDeviceGetMemoryInfo, version=n.nvmlMemory_v2),
        lambda n: n.nvmlDeviceGetMemoryInfo,
    ),
    "nvmlEventSetWait": (lambda n: n.nvmlEventSetWait_v2, lambda n: n.nvmlEventSetWait),
    # Renamed in R535; the old name stays for older drivers.
    "nvmlDeviceGetCurrentClocksEventReasons": (
        lambda n: n.nvmlDeviceGetCurrentClocksEventReasons,
        lambda n: n.nvmlDeviceGetCurrentClocksThrottleReasons,
    ),
}


class Gateway:
    """The pynvml module as the agent sees it: every ``nvml*`` function counted, and the
    versioned ones resolved to the newest the driver has. Constants, structs and exception
    classes pass through unchanged, so read paths use it exactly like ``pynvml``."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        #: plain name -> index of the version that worked (absent: not called yet)
        self._chosen: dict[str, int] = {}

    @property
    def module(self) -> Any:
        return self._module

    def versions_in_use(self) -> dict[str, int]:
        """Plain name -> how many versions back the driver made us fall (0 = the newest)."""
        return dict(self._chosen)

    def __getattr__(self, name: str) -> Any:
        # Once per name: the answer is kept as an attribute, which later lookups find directly.
        value = getattr(self._module, name)
        if name.startswith("nvml") and callable(value) and not isinstance(value, type):
            value = self._versioned(name) if name in _VERSIONS else self._counted(name, value)
        setattr(self, name, value)
        return value

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1

    def _counted(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._count(name)
            return fn(*args, **kwargs)

        call.__name__ = name
        return call

    def _versioned(self, name: str) -> Callable[..., Any]:
        variants = _VERSIONS[name]
        not_found = self._module.NVMLError_FunctionNotFound

        def call(*args: Any) -> Any:
            start = self._chosen.get(name, 0)
            for i in range(start, len(variants)):
                self._count(name)
                try:
                    result = variants[i](self._module)(*args)
                except not_found:
                    if i + 1 == len(variants):
                        raise
                except AttributeError as exc:  # a binding too old to know that version
                    if i + 1 == len(variants):
                        raise self._module.NVMLError(_ERR_FUNCTION_NOT_FOUND) from exc
                else:
                    self._chosen[name] = i
                    return result
                # This driver lacks that version: never ask for it again.
                self._chosen[name] = i + 1
            raise AssertionError("unreachable")  # pragma: no cover

        call.__name__ = name
        return call
