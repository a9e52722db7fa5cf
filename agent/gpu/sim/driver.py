"""The simulated ``libnvidia-ml.so.1`` as one process sees it.

``SimDriver.library`` stands where pynvml keeps the loaded CDLL: pynvml's own wrappers look
symbols up on it by name and call them with ctypes arguments, exactly as with the real library
(a missing name is a missing symbol: pynvml raises NVMLError_FunctionNotFound). The driver also
holds what real NVML keeps in process memory: the init reference count, event sets and GPM
samples. Everything else is the node state in the shared store.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pynvml

from agent.gpu.models import GpuModel
from agent.gpu.sim import generations, latency
from agent.gpu.sim.abi import REGISTRY, Export, NvmlReturn, decode, fail
from agent.gpu.sim.handles import Kind
from agent.gpu.sim.lifecycle import model_of
from agent.gpu.sim.memory import EventSet, Sample
from agent.gpu.sim.state import ComputeInstance, Gpu, GpuInstance, NodeState
from agent.gpu.sim.store import StateMissing, StateStore

#: Calls that never reach the kernel module: they answer with the driver unloaded too.
_WITHOUT_MODULE = frozenset({"nvmlShutdown", "nvmlErrorString"})


@dataclass(frozen=True, slots=True)
class Target:
    """What a handle resolved to in one state snapshot."""

    node: NodeState
    gpu: Gpu
    model: GpuModel
    gi: GpuInstance | None = None
    ci: ComputeInstance | None = None

    @property
    def is_mig_device(self) -> bool:
        return self.ci is not None


class _Library:
    """Attribute access by symbol name, like ``ctypes.CDLL``: a symbol the installed driver
    generation lacks is missing, as with ``dlsym`` (``generations.py``)."""

    def __init__(
        self, exports: dict[str, Callable[..., Any]], exported: Callable[[str], bool]
    ) -> None:
        self._exports = exports
        self._exported = exported

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = self._exports.get(name)
        if fn is None or not self._exported(name):
            raise AttributeError(name)
        return fn


class _CallState(threading.local):
    """What the library call in progress on this thread answers from.

    A driver call sees one consistent state: it is read once as the call starts, and every
    lookup of the call uses it. Per thread (the agent calls NVML from several threads) and per
    call (a nested call saves and restores its caller's).
    """

    #: The call's state; None outside a call, without state, or once the call mutated the
    #: node: lookups then read the store.
    node: NodeState | None = None
    #: The state the pynvml function in progress read for its fault check (``surface.py``):
    #: its first library call starts from it instead of reading it again.
    next_node: NodeState | None = None


class SimDriver:
    def __init__(self, store: StateStore, *, latency: bool) -> None:
        self.store = store
        self._call = _CallState()
        self.latency = latency
        self.lock = threading.Lock()
        self.refcount = 0
        self._local_ids = itertools.count(1)
        self.event_sets: dict[int, EventSet] = {}
        self.samples: dict[int, Sample | None] = {}
        self.library = _Library(
            {name: self._bind(e) for name, e in REGISTRY.items()}, self._driver_exports
        )

    def _driver_exports(self, name: str) -> bool:
        try:
            version = self.store.read().driver_version
        except StateMissing:
            return True  # no driver loaded: the call itself answers DRIVER_NOT_LOADED
        return generations.has_symbol(name, version)

    def _bind(self, export: Export) -> Callable[..., Any]:
        delay = latency.seconds(export.name)

        name = export.name
        impl = export.impl
        needs_module = name not in _WITHOUT_MODULE
        needs_init = export.needs_init
        returns_value = export.returns_value
        local = self._call
        read = self.store.read

        def call(*args: Any) -> Any:
            node = local.next_node
            local.next_node = None
            if self.latency and delay:
                time.sleep(delay)
                node = None  # the call took its time: it answers from the state after
            if node is None:
                try:
                    node = read()
                except StateMissing:
                    node = None  # the call itself answers DRIVER_NOT_LOADED
            if needs_module and node is not None and node.driver_missing(time.time()):
                return pynvml.NVML_ERROR_DRIVER_NOT_LOADED
            if needs_init and self.refcount == 0:
                return pynvml.NVML_ERROR_UNINITIALIZED
            outer = local.node
            local.node = node
            try:
                result = impl(self, *args)
            except NvmlReturn as ret:
                return ret.code
            except StateMissing:
                return pynvml.NVML_ERROR_DRIVER_NOT_LOADED
            finally:
                local.node = outer
            return result if returns_value else pynvml.NVML_SUCCESS

        call.__name__ = export.name
        return call

    def module_unloaded(self) -> bool:
        """The node's driver is marked absent (``SimControl.driver_absent``): the library may
        be loaded in this process, but the kernel module behind it is not."""
        try:
            return self.store.read().driver_missing(time.time())
        except StateMissing:
            return False  # the call itself answers DRIVER_NOT_LOADED

    def start_next_call_from(self, node: NodeState | None) -> None:
        """Let this thread's next library call start from ``node``, just read from the store
        (None: read it again)."""
        self._call.next_node = node

    def new_local_id(self) -> int:
        return next(self._local_ids)

    def node(self) -> NodeState:
        """The state the current call answers from (``_CallState``)."""
        node = self._call.node
        return node if node is not None else self.store.read()

    def reread(self) -> NodeState:
        """The state as it is now, for a call that blocks (``nvmlEventSetWait``): from here on
        it answers from that."""
        node = self._call.node = self.store.read()
        return node

    @staticmethod
    def now() -> float:
        return time.monotonic()

    @contextmanager
    def mutate(self) -> Iterator[NodeState]:
        """A private copy of the state, loaded fresh under the store's lock and written back
        if the block completes; the rest of the call reads the store again."""
        self._call.node = None
        with self.store.transaction() as node:
            yield node

    def device(self, value: Any, node: NodeState | None = None) -> Target:
        """A physical GPU or MIG device handle."""
        return self._resolve(value, node, (Kind.DEVICE, Kind.MIG_DEVICE))

    def physical(self, value: Any, node: NodeState | None = None) -> Target:
        """A physical GPU handle; MIG device handles get NOT_SUPPORTED, as for GPU-wide getters."""
        t = self.device(value, node)
        if t.is_mig_device:
            raise fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return t

    def gpu_instance(self, value: Any, node: NodeState | None = None) -> tuple[Target, GpuInstance]:
        t = self._resolve(value, node, (Kind.GPU_INSTANCE,))
        if t.gi is None:
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return t, t.gi

    def compute_instance(
        self, value: Any, node: NodeState | None = None
    ) -> tuple[Target, GpuInstance, ComputeInstance]:
        t = self._resolve(value, node, (Kind.COMPUTE_INSTANCE,))
        if t.gi is None or t.ci is None:
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return t, t.gi, t.ci

    def _resolve(self, value: Any, node: NodeState | None, kinds: tuple[Kind, ...]) -> Target:
        h = decode(value)
        if h.kind not in kinds:
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        node = node if node is not None else self.node()
        if h.gpu >= len(node.gpus):
            raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = node.gpus[h.gpu]
        if gpu.lost:
            raise fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        model = model_of(gpu)
        if h.kind == Kind.DEVICE:
            return Target(node, gpu, model)
        for gi in gpu.gpu_instances:
            if h.kind == Kind.GPU_INSTANCE:
                if gi.serial == h.serial:
                    return Target(node, gpu, model, gi)
                continue
            for ci in gi.compute_instances:
                if ci.serial == h.serial:
                    return Target(node, gpu, model, gi, ci)
        raise fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # destroyed, reset or never existed
