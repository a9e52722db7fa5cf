"""``SimNvml``: the pynvml module itself, re-bound to the simulated driver.

Rather than imitate pynvml's Python functions, the simulator runs them: every function of the
installed pynvml is copied with its globals pointed at this module's namespace, whose ``nvmlLib``
is the simulated library (``driver.py``) instead of ``libnvidia-ml.so.1``. Argument handling,
struct versions, return conventions (lists, ``c_uint`` objects, friendly objects) and
``NVMLError`` raising are pynvml's own code, and constants, structs and exception classes are
pynvml's own objects. A function whose C symbol the simulator lacks fails inside pynvml with
``NVMLError_FunctionNotFound``, as with a driver that lacks the symbol.

On top, each public ``nvml*`` function first waits while it is held (``SimControl.hold``), then
consults the injected faults (``faults.py``).
"""

from __future__ import annotations

import functools
import threading
import time
import types
from collections.abc import Callable
from typing import Any, TypeGuard

import pynvml

# The sym_* modules register themselves on import (abi.REGISTRY), before a driver binds them;
# importing them here keeps that import explicit, and the driver free of them.
from agent.gpu.sim import (  # noqa: F401
    faults,
    handles,
    sym_compute,
    sym_device,
    sym_events,
    sym_fields,
    sym_gpm,
    sym_mig,
    sym_power,
    sym_telemetry,
    sym_topology,
)
from agent.gpu.sim.driver import SimDriver
from agent.gpu.sim.handles import Kind
from agent.gpu.sim.state import NodeState
from agent.gpu.sim.store import StateMissing, StateStore

#: How often a held call (`SimControl.hold`) looks whether it was released.
_HOLD_POLL_S = 0.02
_DEVICE_KINDS = (Kind.DEVICE, Kind.MIG_DEVICE, Kind.GPU_INSTANCE, Kind.COMPUTE_INSTANCE)
# Helpers that never reach the library stay pynvml's own objects.
_LIBRARY_FREE = frozenset(
    {"nvmlExceptionClass", "nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct"}
)


class SimNvml(types.ModuleType):
    """A module object with pynvml's full surface whose NVML calls reach the simulated node."""

    def __init__(self, store: StateStore, *, latency: bool = False) -> None:
        super().__init__("pynvml", pynvml.__doc__)
        _bind_pynvml(self.__dict__, SimDriver(store, latency=latency))
        _cache_error_texts()

    def __getattr__(self, name: str) -> Any:
        # Reached only for names pynvml lacks too; declared so type checkers accept nvml* calls.
        raise AttributeError(f"module 'pynvml' has no attribute {name!r}")


def _bind_pynvml(ns: dict[str, Any], driver: SimDriver) -> None:
    real = vars(pynvml)
    ns.update(real)
    lock = threading.Lock()

    def load_library() -> None:
        # Replaces pynvml's _LoadNvmlLibrary: "dlopen" the simulated library, never the real one.
        # With the driver absent there is no libnvidia-ml.so.1 to load (a GPU Operator node
        # before its driver container); once loaded it stays loaded, as pynvml keeps it.
        with lock:
            if ns["nvmlLib"] is None:
                if driver.module_unloaded():
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
                ns["nvmlLib"] = driver.library

    # pynvml's module-level library state, fresh for this simulated library.
    ns.update(
        nvmlLib=None,
        _nvmlLib_refcount=0,
        _nvmlGetFunctionPointer_cache={},
        libLoadLock=threading.Lock(),
    )
    memo: dict[int, types.FunctionType] = {}
    for name, value in real.items():
        if _is_pynvml_function(value) and name not in _LIBRARY_FREE:
            ns[name] = _rebind(value, ns, memo)
    ns["_LoadNvmlLibrary"] = load_library
    for name, value in list(ns.items()):
        if name.startswith("nvml") and _is_bound_here(value, ns):
            ns[name] = _with_faults(name, value, driver)


def _cache_error_texts() -> None:
    """Give pynvml's exceptions the driver's texts for the codes its own table lacks.

    ``NVMLError.__str__`` (pynvml's class, shared with the real module) asks the *real* module's
    ``nvmlErrorString`` for such codes; with no real library loaded that fails and the error
    reads "NVML Error with code 19". A process on a real driver caches the driver's answer in
    the same dict on first use, so filling it with the same texts changes nothing else.
    """
    for code, text in sym_device.ERROR_TEXT.items():
        # Only codes that are errors: tools that read the table (nvitop) map each key to its
        # exception class, and SUCCESS has none.
        if code in pynvml.NVMLError._valClassMapping:
            pynvml.NVMLError._errcode_to_string.setdefault(code, text)


def _is_pynvml_function(value: Any) -> TypeGuard[types.FunctionType]:
    return isinstance(value, types.FunctionType) and value.__globals__ is vars(pynvml)


def _is_bound_here(value: Any, ns: dict[str, Any]) -> TypeGuard[types.FunctionType]:
    return isinstance(value, types.FunctionType) and value.__globals__ is ns


def _rebind(
    fn: types.FunctionType, ns: dict[str, Any], memo: dict[int, types.FunctionType]
) -> types.FunctionType:
    """A copy of ``fn`` that resolves globals in ``ns``; decorator closures are rebound too."""
    if id(fn) in memo:
        return memo[id(fn)]
    closure = None
    if fn.__closure__ is not None:
        closure = tuple(_rebind_cell(cell, ns, memo) for cell in fn.__closure__)
    new = types.FunctionType(fn.__code__, ns, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__doc__ = fn.__doc__
    new.__dict__.update(fn.__dict__)
    wrapped = fn.__dict__.get("__wrapped__")
    if _is_pynvml_function(wrapped):
        new.__dict__["__wrapped__"] = _rebind(wrapped, ns, memo)
    memo[id(fn)] = new
    return new


def _rebind_cell(
    cell: types.CellType, ns: dict[str, Any], memo: dict[int, types.FunctionType]
) -> types.CellType:
    try:
        value = cell.cell_contents
    except ValueError:  # an empty cell
        return cell
    return types.CellType(_rebind(value, ns, memo)) if _is_pynvml_function(value) else cell


def _with_faults(name: str, fn: types.FunctionType, driver: SimDriver) -> Callable[..., Any]:
    store = driver.store

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            node: NodeState | None = store.read()
        except StateMissing:
            node = None  # the library call itself reports the missing driver
        if node is not None and name in node.held:
            node = _released(store, name)
        if node is not None and faults.armed_for(node, name):
            with store.transaction() as counted:
                code = faults.take(counted, name, _gpu_of(name, args))
            if code is not None:
                raise pynvml.NVMLError(code)
            node = None  # the state changed since: the call reads it again
        # The state just read is what the function's first library call finds: one read.
        driver.start_next_call_from(node)
        try:
            return fn(*args, **kwargs)
        finally:
            driver.start_next_call_from(None)

    return call


def _released(store: StateStore, name: str) -> NodeState | None:
    """Wait while ``name`` is held (`SimControl.hold`); the state once it is released."""
    while True:
        time.sleep(_HOLD_POLL_S)
        try:
            node = store.read()
        except StateMissing:
            return None
        if name not in node.held:
            return node


def _gpu_of(name: str, args: tuple[Any, ...]) -> int | None:
    """The GPU a call targets, for faults armed on one GPU."""
    if not args:
        return None
    if name.startswith("nvmlDeviceGetHandleByIndex") and isinstance(args[0], int):
        return args[0]
    h = handles.decode(args[0])
    return h.gpu if h is not None and h.kind in _DEVICE_KINDS else None
