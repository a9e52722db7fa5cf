"""XID events: one NVML event set over every GPU, waited on by one thread (reference §4, fact 7)."""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass
from typing import Any

from agent.errors import AgentError, DeviceLost
from agent.gpu.nvml import translate
from agent.gpu.readings import NodeReader, nvml_code

__all__ = ["XidEvent", "XidEvents"]

_ERR_TIMEOUT = 10  # NVML_ERROR_TIMEOUT: no event within the wait
_NO_ID = 0xFFFFFFFF  # the event names no GPU or compute instance


@dataclass(frozen=True, slots=True)
class XidEvent:
    gpu_index: int
    xid: int
    #: the GPU / compute instance the XID concerns, when NVML can attribute it
    gpu_instance_id: int | None
    compute_instance_id: int | None


def _address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class XidEvents:
    """XID events of every GPU through one NVML event set; used by one thread only.

    Registers the XID critical-error event on each physical GPU (MIG devices cannot register;
    the event carries the GI/CI ids). ``unsupported`` lists GPUs that cannot deliver XIDs;
    ``unreachable`` those of them that did not answer (lost, at start or between their handle
    and their registration): :meth:`register` adds one to the open set once it answers.
    """

    def __init__(self, reader: NodeReader) -> None:
        self._driver = reader.driver
        self._n = reader.driver.nvml
        self.unsupported: dict[int, str] = {}
        self.unreachable: frozenset[int] = frozenset()
        self._index_of: dict[int, int] = {}
        self._set = self._driver.call(self._n.nvmlEventSetCreate)
        for gpu in reader.gpus():
            self.register(gpu.index)

    def register(self, index: int) -> bool:
        """Register GPU ``index``'s XIDs into this set; whether it is registered now. Adding
        one GPU leaves the set, and the other GPUs' registrations, as they are: reopening the
        set would miss every GPU's XIDs until it is registered again."""
        n, call = self._n, self._driver.call
        self.unsupported.pop(index, None)
        self.unreachable -= {index}
        try:
            h = call(n.nvmlDeviceGetHandleByIndex, index)
        except AgentError as exc:  # not answering: no events from it; the others still
            return self._unreachable(index, exc)
        self._index_of[_address(h)] = index
        try:
            if not call(n.nvmlDeviceGetSupportedEventTypes, h) & n.nvmlEventTypeXidCriticalError:
                self.unsupported[index] = "the GPU does not report XID events"
                return False
            call(n.nvmlDeviceRegisterEvents, h, n.nvmlEventTypeXidCriticalError, self._set)
        except DeviceLost as exc:  # lost since its handle opened: tried again once it answers
            return self._unreachable(index, exc)
        except AgentError as exc:  # NOT_SUPPORTED and the like: lasting
            self.unsupported[index] = str(exc)
            return False
        return True

    def _unreachable(self, index: int, exc: AgentError) -> bool:
        self.unsupported[index] = str(exc)
        self.unreachable |= {index}
        return False

    def wait(self, timeout_ms: int) -> XidEvent | None:
        """The next XID, or None after ``timeout_ms`` without one. Raises DeviceLost and other
        domain errors when the event set breaks."""
        n = self._n
        try:
            data = n.nvmlEventSetWait(self._set, timeout_ms)
        except n.NVMLError as exc:
            if nvml_code(exc) == _ERR_TIMEOUT:
                return None
            raise translate(exc, "nvmlEventSetWait") from exc
        index = self._index_of.get(_address(data.device))
        if index is None:
            index = int(self._driver.call(n.nvmlDeviceGetIndex, data.device))
        return XidEvent(
            index,
            int(data.eventData),
            None if data.gpuInstanceId == _NO_ID else int(data.gpuInstanceId),
            None if data.computeInstanceId == _NO_ID else int(data.computeInstanceId),
        )

    def close(self) -> None:
        n = self._n
        with contextlib.suppress(n.NVMLError):  # a driver going away has nothing left to free
            n.nvmlEventSetFree(self._set)
