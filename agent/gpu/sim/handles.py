"""Opaque NVML handles: fake addresses that encode what they point at.

Real handles are pointers into the library's tables. Ours are pynvml's own pointer types holding
``MAGIC | kind | gpu | serial``: nothing ever dereferences them, and decoding needs no table, so
handles stay valid across processes exactly as long as their object exists. GPU and compute
instances carry their node-unique serial, so a handle to a destroyed instance stays invalid even
after a new instance takes the same id (nvml.h: "the GPU instance handle would become invalid").
"""

from __future__ import annotations

import ctypes
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
        return ctypes.cast(value, ctypes.c_void_p).value
    return None


def decode(value: Any) -> Handle | None:
    address = address_of(value)
    if not address or address >> 48 != _MAGIC:
        return None
    try:
        kind = Kind((address >> 40) & 0xFF)
    except ValueError:
        return None
    return Handle(kind, (address >> 32) & 0xFF, address & 0xFFFFFFFF)


def pointer(ptr_type: Any, handle: Handle) -> Any:
    """A new pynvml handle object (e.g. ``c_nvmlDevice_t``) for ``handle``."""
    return ctypes.cast(ctypes.c_void_p(handle.address), ptr_type)
