"""The API's GPUs as the domain's layouts (proto -> records), for every client of the agent.

The CLI's MIG reads (show, plan, assert, export, generate-config, checkpoint) and the
coordinator's planning both run the same pure functions on these records that the agent runs
on its driver's, so a layout is read once, by the agent, and converted here once.
"""

from __future__ import annotations

from agent._proto.gpuagent.v1 import agent_pb2
from agent.gpu.types import (
    ComputeInstance,
    GiProfile,
    GpuInfo,
    GpuInstance,
    GpuLayout,
    MigMode,
    Placement,
    Process,
)

__all__ = ["layout_from"]


_placements: dict[tuple[int, int], Placement] = {}


def _placement(p: agent_pb2.Placement) -> Placement:
    # Frozen and few: one object per distinct placement. A plain dict rather than lru_cache:
    # this runs for every instance of every GPU of a sweep.
    key = (p.start, p.size)
    found = _placements.get(key)
    if found is None:
        if len(_placements) >= 1024:  # a bound, against agents sending odd placements
            _placements.clear()
        found = _placements[key] = Placement(*key)
    return found


_MAX_MODELS = 256
_ProfilesKey = tuple[bytes, ...]
_profiles_seen: dict[_ProfilesKey, tuple[GiProfile, ...]] = {}


def _profiles(gpu: agent_pb2.Gpu) -> tuple[GiProfile, ...]:
    """The GPU's profiles, converted once per model: the driver reports the same profiles and
    placements for every board of a product and memory size, and a 1,000-node sweep would
    otherwise build a quarter of a million placements."""
    # Keyed by the profiles' own bytes (serialising is C code, cheap): a key that only guessed
    # at sameness (model, memory, count) served one GPU's profiles for another's. MigProfile has
    # no map fields, so plain serialising is already byte-stable (and a third faster).
    key = tuple(p.SerializeToString() for p in gpu.mig_profiles)
    found = _profiles_seen.get(key)
    if found is None:
        if len(_profiles_seen) >= _MAX_MODELS:  # a bound, should drivers ever vary per GPU
            _profiles_seen.clear()
        found = _profiles_seen[key] = tuple(_profile(p) for p in gpu.mig_profiles)
    return found


def _profile(p: agent_pb2.MigProfile) -> GiProfile:
    # The API carries what planning needs; engine counts are not part of it.
    return GiProfile(
        constant=p.constant,
        id=p.id,
        name=p.name,
        slice_count=p.slice_count,
        memory_slices=p.memory_slices,
        instance_count=p.instance_count,
        memory_mb=p.memory_mb,
        multiprocessor_count=0,
        copy_engines=0,
        decoders=0,
        encoders=0,
        jpegs=0,
        ofas=0,
        placements=tuple(_placement(x) for x in p.placements),
    )


def layout_from(gpu: agent_pb2.Gpu) -> GpuLayout:
    # Positional arguments (in the records' field order): this runs for every GPU of a sweep,
    # and keyword passing is a measurable part of its cost.
    mode = gpu.mig_mode
    info = GpuInfo(
        gpu.index,
        gpu.uuid,
        gpu.name,
        gpu.pci_bus_id,
        gpu.pci_device_id,
        gpu.pci_subsystem_id,
        gpu.memory_total_bytes,
        MigMode(mode.current, mode.pending) if gpu.mig_capable else None,
    )
    instances = tuple(
        GpuInstance(
            gi.id,
            gi.profile_id,
            gi.profile_name,
            _placement(gi.placement),
            tuple(
                ComputeInstance(ci.id, ci.profile_id, _placement(ci.placement), ci.uuid or None)
                for ci in gi.compute_instances
            ),
        )
        for gi in gpu.instances
    )
    processes = tuple(
        Process(
            p.pid,
            p.used_memory_bytes if p.HasField("used_memory_bytes") else None,
            p.gpu_instance_id if p.HasField("gpu_instance_id") else None,
            p.compute_instance_id if p.HasField("compute_instance_id") else None,
        )
        for p in gpu.processes
    )
    return GpuLayout(info, _profiles(gpu), instances, processes)
