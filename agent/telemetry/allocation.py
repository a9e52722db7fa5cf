"""What a pod holds, as the attribution stage sees it: kubelet's device ids parsed
(:func:`parse_device_id`), a container's :class:`Allocation`, and the pure maps from
allocations to the GPUs and MIG instances they name (:func:`attribute`, :func:`claims_of`).

Every id form is understood: ``GPU-<uuid>``, ``MIG-<uuid>``, the legacy
``MIG-GPU-<uuid>/<gi>/<ci>``, GKE's ``nvidia<N>[/gi<G>][/vgpu<k>]``, each optionally with a
time-slicing / MPS replica suffix ``::<n>``. A leaf of the telemetry room: the pods and DRA
readers, the reader interface and the attribution stage all read it, and it reads none of them.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent.telemetry.snapshot import DraClaim, PodRef

__all__ = [
    "Allocation",
    "DeviceId",
    "EntityKey",
    "Resolver",
    "attribute",
    "claims_of",
    "parse_device_id",
]

#: (physical GPU UUID, GPU instance id or None for the whole GPU)
EntityKey = tuple[str, int | None]

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
#: A number in an id: ASCII digits, one to nine (``\d`` takes any script's digits, and ``int()``
#: refuses 4300 of them with a ValueError)
_N = "[0-9]{1,9}"
_GPU = re.compile(rf"GPU-{_UUID}")
_MIG = re.compile(rf"MIG-{_UUID}")
_LEGACY_MIG = re.compile(rf"MIG-(?P<gpu>GPU-{_UUID})/(?P<gi>{_N})/(?P<ci>{_N})")
_GKE = re.compile(rf"nvidia(?P<minor>{_N})(?:/gi(?P<gi>{_N}))?(?:/vgpu(?P<vgpu>{_N}))?")
_REPLICA = re.compile(_N)


@dataclass(frozen=True, slots=True)
class DeviceId:
    """One parsed kubelet device id, or a DRA device. One of ``uuid`` / ``gpu_uuid`` / ``minor``
    is set; a DynamicMIG device sets ``profile_id`` and ``placement_start`` with its parent's
    ``gpu_uuid`` and ``minor`` both (the slice's ``parentUUID`` and its name's minor), which
    must name the same GPU."""

    #: a ``GPU-`` or (R470+) ``MIG-`` UUID, resolved through NVML's topology
    uuid: str | None = None
    #: the parent GPU of a legacy ``MIG-GPU-<uuid>/<gi>/<ci>`` id
    gpu_uuid: str | None = None
    #: GKE's ``nvidia<N>``: the device minor number
    minor: int | None = None
    gpu_instance_id: int | None = None
    #: time-slicing / MPS replica (``::n`` or GKE ``/vgpu<k>``)
    replica: int | None = None
    #: a DynamicMIG device: its GPU-instance profile id and placement start on the parent
    profile_id: int | None = None
    placement_start: int | None = None


def parse_device_id(raw: str) -> DeviceId | None:
    """Parse a device id; None for ids that are not NVIDIA GPUs or MIG devices (numbers that
    are not one to nine ASCII digits included): it never raises."""
    base, sep, tail = raw.partition("::")
    replica = int(tail) if sep and _REPLICA.fullmatch(tail) else None
    if sep and replica is None:
        return None
    if _GPU.fullmatch(base) or _MIG.fullmatch(base):
        return DeviceId(uuid=base, replica=replica)
    if m := _LEGACY_MIG.fullmatch(base):
        return DeviceId(gpu_uuid=m["gpu"], gpu_instance_id=int(m["gi"]), replica=replica)
    if m := _GKE.fullmatch(base):
        vgpu = int(m["vgpu"]) if m["vgpu"] is not None else replica
        gi = int(m["gi"]) if m["gi"] is not None else None
        return DeviceId(minor=int(m["minor"]), gpu_instance_id=gi, replica=vgpu)
    return None


@dataclass(frozen=True, slots=True)
class Allocation:
    """A container holding a GPU device."""

    pod: PodRef
    resource: str
    #: None: a DRA claim's device this node's ResourceSlices do not identify
    device: DeviceId | None
    #: the DRA claim it holds the device through; None for the device plugin's
    claim: DraClaim | None = None


#: Maps a parsed device to the GPU or instance it is, or None when this node has no such device.
Resolver = Callable[[DeviceId], EntityKey | None]


def attribute(
    allocations: Iterable[Allocation],
    resolve: Resolver,
    unresolved: Callable[[Allocation], object] = lambda _: None,
) -> dict[EntityKey, tuple[PodRef, ...]]:
    """Entity -> every container holding it (sorted, deduplicated). Devices of no GPU here are
    dropped; a DRA claim's device that resolves to none is also passed to ``unresolved``."""
    out: defaultdict[EntityKey, set[PodRef]] = defaultdict(set)
    for allocation in allocations:
        key = resolve(allocation.device) if allocation.device is not None else None
        if key is not None:
            out[key].add(allocation.pod)
        elif allocation.claim is not None:
            unresolved(allocation)
    return {key: tuple(sorted(pods)) for key, pods in out.items()}


def claims_of(
    allocations: Iterable[Allocation], resolve: Resolver
) -> dict[tuple[EntityKey, PodRef], DraClaim]:
    """(entity, container) -> the DRA claim it holds the entity through, where that is one
    claim (a device plugin's allocation has none)."""
    found: defaultdict[tuple[EntityKey, PodRef], set[DraClaim]] = defaultdict(set)
    for allocation in allocations:
        if allocation.claim is None or allocation.device is None:
            continue
        key = resolve(allocation.device)
        if key is not None:
            found[(key, allocation.pod)].add(allocation.claim)
    return {k: next(iter(v)) for k, v in found.items() if len(v) == 1}
