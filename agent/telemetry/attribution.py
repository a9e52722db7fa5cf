"""Attribution, one pure stage of telemetry: readings in, readings labelled with their pods out.

Given a tick's entity samples, the GPUs' MIG layouts (with the planner's placements, which name
DynamicMIG instances) and the latest allocations (kubelet PodResources, DRA claims), it tells
each GPU or MIG instance which containers hold it, puts the pod, its DRA claim (with the MIG
device UUID a DynamicMIG slice lacks) and its UID on the sample held by exactly one container,
and lists the DRA claims whose device matches nothing here. No NVML, no file, no clock: the
sampler reads, this decides (tests/unit/telemetry/test_attribution.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from agent.gpu.readings import GpuIdentity, MigLayout
from agent.gpu.types import GpuLayout
from agent.telemetry.allocation import Allocation, DeviceId, EntityKey, attribute, claims_of
from agent.telemetry.snapshot import DraClaim, Entity, EntitySample, PodRef

__all__ = ["Attribution", "attribute_samples", "profile_of", "resolver"]


@dataclass(frozen=True, slots=True)
class Attribution:
    #: the samples, each with its one holder's pod, claim and UID where it has exactly one
    samples: tuple[EntitySample, ...]
    #: entity -> every container holding it (for per-process usage rows)
    holders: Mapping[Entity, tuple[PodRef, ...]]
    #: (namespace, claim, pool, device) -> the DRA allocation whose device is not on this node
    unresolved: Mapping[tuple[str, ...], Allocation]


def attribute_samples(
    samples: Iterable[EntitySample],
    gpus: tuple[GpuIdentity, ...],
    layouts: Mapping[int, MigLayout],
    placed: Iterable[GpuLayout],
    allocations: Iterable[Allocation],
    pod_uid: Callable[[PodRef], str | None] = lambda _: None,
) -> Attribution:
    """Label ``samples`` with the pods of ``allocations`` (see the module's docstring)."""
    allocations = tuple(allocations)
    resolve = resolver(gpus, layouts, placed)
    unresolved: dict[tuple[str, ...], Allocation] = {}
    holders = attribute(allocations, resolve, lambda a: unresolved.setdefault(dra_key(a), a))
    claims = claims_of(allocations, resolve)
    out: list[EntitySample] = []
    held: dict[Entity, tuple[PodRef, ...]] = {}
    for sample in samples:
        entity = sample.entity
        gi = entity.instance.gpu_instance_id if entity.instance else None
        key: EntityKey = (entity.gpu.uuid, gi)
        allocated = holders.get(key, ())
        pod = allocated[0] if len(allocated) == 1 else None
        claim = claims.get((key, pod)) if pod is not None else None
        uid = None
        if pod is not None and claim is not None:
            claim = _with_mig_uuid(claim, layouts[entity.gpu.index], gi)
            uid = pod_uid(pod)
        out.append(EntitySample(entity, sample.values, pod, sample.idle_seconds, claim, uid))
        if allocated:
            held[entity] = allocated
    return Attribution(tuple(out), held, unresolved)


def dra_key(allocation: Allocation) -> tuple[str, ...]:
    claim = allocation.claim
    assert claim is not None
    return (claim.namespace, claim.name, claim.pool, claim.device)


def profile_of(layout: MigLayout | None, gi: int | None) -> str | None:
    """The profile name of GPU instance ``gi`` in ``layout``; None when there is no such one."""
    if layout is None or gi is None:
        return None
    return next((i.profile for i in layout.instances if i.id == gi), None)


def _with_mig_uuid(claim: DraClaim, layout: MigLayout, gi: int | None) -> DraClaim:
    """A MIG claim without the slice's UUID (DynamicMIG) gets the one MIG device NVML reports
    for the instance it resolved to; none where the instance has not exactly one."""
    if claim.mig_profile is None or claim.mig_device_uuid is not None or gi is None:
        return claim
    devices = [d for i in layout.instances if i.id == gi for d in i.devices]
    return replace(claim, mig_device_uuid=devices[0].uuid) if len(devices) == 1 else claim


def resolver(
    gpus: tuple[GpuIdentity, ...],
    layouts: Mapping[int, MigLayout],
    placed: Iterable[GpuLayout] = (),
) -> Callable[[DeviceId], EntityKey | None]:
    """Device -> the GPU or instance it is here: by GPU or MIG UUID, by minor and GI id, or for
    a DynamicMIG device by parent, GI profile and placement start."""
    by_uuid = {g.uuid: g for g in gpus}
    by_minor = {g.minor: g for g in gpus if g.minor is not None}
    mig: dict[str, EntityKey] = {}
    for index, layout in layouts.items():
        for instance in layout.instances:
            for device in instance.devices:
                mig[device.uuid] = (gpus[index].uuid, instance.id)
    # (GPU UUID, GI profile id, placement start) -> GI ids: instances cannot overlap, so one
    by_placement: defaultdict[tuple[str, int, int], list[int]] = defaultdict(list)
    for node_layout in placed:
        for gi in node_layout.instances:
            place = (node_layout.gpu.uuid, gi.profile_id, gi.placement.start)
            by_placement[place].append(gi.id)

    def resolve(device: DeviceId) -> EntityKey | None:
        if device.profile_id is not None and device.placement_start is not None:
            return by_place(device, device.profile_id, device.placement_start)
        if device.uuid is not None:
            if device.uuid in by_uuid:
                return (device.uuid, None)
            return mig.get(device.uuid)
        if device.gpu_uuid is not None:
            parent = by_uuid.get(device.gpu_uuid)
        else:
            parent = by_minor.get(device.minor) if device.minor is not None else None
        if parent is None:
            return None
        if device.gpu_instance_id is None:
            return (parent.uuid, None)
        known = profile_of(layouts.get(parent.index), device.gpu_instance_id)
        return (parent.uuid, device.gpu_instance_id) if known is not None else None

    def by_place(device: DeviceId, profile_id: int, start: int) -> EntityKey | None:
        """A DynamicMIG device: its parent (the slice's parentUUID and the name's minor must
        agree) and the one instance of that profile at that placement start."""
        parent = by_uuid.get(device.gpu_uuid) if device.gpu_uuid is not None else None
        if parent is None and device.gpu_uuid is None and device.minor is not None:
            parent = by_minor.get(device.minor)
        if parent is None or (device.minor is not None and parent.minor != device.minor):
            return None
        found = by_placement.get((parent.uuid, profile_id, start), [])
        if len(found) != 1 or profile_of(layouts.get(parent.index), found[0]) is None:
            return None
        return (parent.uuid, found[0])

    return resolve
