"""The C calling convention of libnvidia-ml, as pynvml drives it through ctypes.

pynvml declares no ``argtypes``, so a symbol receives whatever the wrapper passed: plain ints,
ctypes scalars (``c_uint(i)``), ``byref(...)`` objects, pointers, caller-allocated arrays and
string buffers. The helpers here read inputs and write outputs the way C would, and turn a
misuse that would be undefined behaviour in C into ``NVML_ERROR_INVALID_ARGUMENT``.

Symbols are registered with ``@symbol``; they raise ``NvmlReturn`` to return an error code and
return None for ``NVML_SUCCESS``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from agent.gpu.sim import handles
from agent.gpu.sim.handles import Handle

_CArg = type(ctypes.byref(ctypes.c_int()))


class NvmlReturn(Exception):
    """An NVML return code travelling from inside a symbol to its C boundary."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True, slots=True)
class Export:
    name: str
    impl: Callable[..., Any]
    needs_init: bool  # False for the few symbols NVML serves before nvmlInit
    returns_value: bool  # the C function returns data (nvmlErrorString), not nvmlReturn_t


REGISTRY: dict[str, Export] = {}


def symbol(
    name: str, *, needs_init: bool = True, returns_value: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(impl: Callable[..., Any]) -> Callable[..., Any]:
        REGISTRY[name] = Export(name, impl, needs_init, returns_value)
        return impl

    return register


Creator = Callable[[Any, Any, Any, tuple[int, int] | None], Handle]


def creators(plain: str, placed: str, create: Creator) -> None:
    """Register a create symbol and its ...WithPlacement twin, whose placement is required;
    ``create(drv, handle, profile_id, (start, size) or None)`` does the work of both and returns
    the new instance's handle. The output and the placement are read before it runs."""

    def anywhere(drv: Any, handle: Any, profile_id: Any, ref: Any) -> None:
        slot = handle_slot(ref)
        store_handle(slot, create(drv, handle, profile_id, None))

    def at(drv: Any, handle: Any, profile_id: Any, placement: Any, ref: Any) -> None:
        if placement is None:
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slot = handle_slot(ref)
        wanted = read_placement(placement)
        store_handle(slot, create(drv, handle, profile_id, wanted))

    symbol(plain)(anywhere)
    symbol(placed)(at)


def fail(code: int) -> NvmlReturn:
    return NvmlReturn(code)


def to_int(value: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, ctypes._SimpleCData) and isinstance(value.value, int):
        return int(value.value)
    raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)


def index_arg(value: Any, count: int) -> int:
    """An enumeration or index argument: INVALID_ARGUMENT outside ``0 .. count - 1`` (a
    constant past the enumeration's end; what the board lacks is the caller's NOT_SUPPORTED)."""
    n = to_int(value)
    if not 0 <= n < count:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return n


def to_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, ctypes.c_char_p) and value.value is not None:
        return value.value
    raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)


def target(ref: Any) -> Any:
    """The object an output or input pointer argument points at.

    ``byref(x)`` and ``pointer(x)`` are pointers; a bare Structure would reach C by value (the
    pynvml trap mig.md §2.2 warns about), so it is rejected like a garbage pointer.
    """
    if isinstance(ref, _CArg):
        return _pointee(ref)
    if isinstance(ref, ctypes._Pointer) and ref:
        return ref.contents
    raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)


def _pointee(ref: Any) -> Any:
    return ref._obj  # what byref() points at


def set_value(ref: Any, value: int) -> None:
    target(ref).value = value


def handle_slot(ref: Any) -> Any:
    """The caller's ``c_nvml*_t`` variable behind a by-reference handle output."""
    obj = target(ref)
    if not isinstance(obj, ctypes._Pointer | ctypes.c_void_p):
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return obj


def store_handle(slot: Any, handle: Handle) -> None:
    ctypes.c_void_p.from_buffer(slot).value = handle.address


def set_handle(ref: Any, handle: Handle) -> None:
    store_handle(handle_slot(ref), handle)


def decode(value: Any) -> Handle:
    handle = handles.decode(value)
    if handle is None:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return handle


def write_string(buffer: Any, length: Any, text: str) -> None:
    """Copy ``text`` and its NUL into a caller's ``char[length]``."""
    data = text.encode()
    if len(data) + 1 > to_int(length):
        raise fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    if not isinstance(buffer, ctypes.Array):
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    ctypes.memmove(buffer, data + b"\0", len(data) + 1)


class OutArray:
    """A caller-allocated array argument (an Array, ``byref`` of one, or a pointer).

    C cannot know an array's length and trusts the caller; ctypes objects can tell, so a too-small
    Array gets INSUFFICIENT_SIZE instead of a buffer overrun.
    """

    def __init__(self, arg: Any) -> None:
        obj = _pointee(arg) if isinstance(arg, _CArg) else arg
        self._items: Any
        self.capacity: int | None
        if isinstance(obj, ctypes.Array):
            self._items, self.capacity = obj, len(obj)
        elif isinstance(obj, ctypes._Pointer) and obj:
            self._items, self.capacity = obj, None
        elif isinstance(obj, ctypes.Structure):
            self._items, self.capacity = ctypes.pointer(obj), 1
        else:
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def require(self, count: int) -> None:
        if self.capacity is not None and self.capacity < count:
            raise fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)

    def __getitem__(self, index: int) -> Any:
        return self._items[index]

    def __setitem__(self, index: int, value: Any) -> None:
        self._items[index] = value


def read_placement(ref: Any) -> tuple[int, int]:
    """(start, size) of a ``c_nvml*Placement_t`` passed by reference."""
    p = target(ref)
    try:
        return int(p.start), int(p.size)
    except AttributeError:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None


def write_placements(found: list[tuple[int, int]], placements: Any, count_ref: Any) -> None:
    """Fill a caller's placement array (NULL only asks for the count) and the count."""
    count = target(count_ref)
    if placements is not None:
        out = OutArray(placements)
        out.require(len(found))
        for i, (start, size) in enumerate(found):
            out[i].start, out[i].size = start, size
    count.value = len(found)


def write_handles(found: list[Handle], ptr_type: Any, instances: Any, count_ref: Any) -> None:
    """Fill a caller's array of instance handles (``ptr_type`` each) and the count."""
    count = target(count_ref)
    out = OutArray(instances)
    out.require(len(found))
    for i, handle in enumerate(found):
        out[i] = handles.pointer(ptr_type, handle)
    count.value = len(found)


def start_for(wanted: tuple[int, int] | None, size: int, choose: Callable[[], int | None]) -> int:
    """Where a new instance of ``size`` slices starts: the caller's placement (its size must be
    the profile's), or the driver's own choice (INSUFFICIENT_RESOURCES when nothing fits)."""
    if wanted is None:
        start = choose()
        if start is None:
            raise fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        return start
    start, given = wanted
    if given != size:
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return start
