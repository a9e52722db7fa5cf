"""Opaque NVML handles: fake addresses that encode what they point at.

Real handles are pointers into the library's tables. Ours are pynvml's own pointer types holding
``MAGIC | kind | gpu | serial``: nothing ever dereferences them, and decoding needs no table, so
handles stay valid across processes exactly as long as their object exists. GPU and compute
instances carry their node-unique serial, so a handle to a destroyed instance stays invalid even
after a new instance takes the same id (nvml.h: "the GPU instance handle would become invalid").
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

_MAGIC = 0x51A7


class Kind(IntEnum):
    DEVICE = 1
    MIG_DEVICE = 2
    GPU_INSTANCE = 3
    COMPUTE_INSTANCE = 4
    EVENT_SET = 5
    GPM_SAMPLE = 6


@dataclass(frozen=True, slots=True)
class Handle:
    kind: Kind
    gpu: int
    serial: int  # instance serial; a per-process id for event sets and samples; 0 for devices

    @property
    def address(self) -> int:
        return _MAGIC << 48 | int(self.kind) << 40 | self.gpu << 32 | self.serial


def address_of(value: Any) -> int | None:
    """The pointer value of a handle argument: a ctypes pointer, a c_void_p or a plain int."""
    if value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, ctypes._Pointer | ctypes.c_void_p):
        # The pointer's own bytes, as ``ctypes.cast(value, c_void_p).value`` reads them.
        address: int | None = ctypes.c_void_p.from_buffer_copy(value).value
        return address
    return None


_KINDS = {int(kind): kind for kind in Kind}


def decode(value: Any) -> Handle | None:
    address = address_of(value)
    if not address or address >> 48 != _MAGIC:
        return None
    return _decode(address)


@functools.lru_cache(maxsize=4096)
def _decode(address: int) -> Handle | None:
    """Handles are plain values: one address always decodes to the same (immutable) Handle."""
    kind = _KINDS.get((address >> 40) & 0xFF)
    if kind is None:
        return None
    return Handle(kind, (address >> 32) & 0xFF, address & 0xFFFFFFFF)


def pointer(ptr_type: Any, handle: Handle) -> Any:
    """A new pynvml handle object (e.g. ``c_nvmlDevice_t``) for ``handle``."""
    return ctypes.cast(ctypes.c_void_p(handle.address), ptr_type)
