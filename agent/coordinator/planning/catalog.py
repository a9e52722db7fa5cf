"""MIG profiles per GPU model, for GPUs that report none.

The driver lists GPU-instance profiles only while MIG is on, so an agent reports none for a GPU
with MIG off, yet the fleet planner must know what such a GPU could hold. Profiles come, in
order of trust, from another GPU of the same model in the fleet that reports them (the real
driver's numbers), then from the model tables in ``agent.gpu.models`` (the ones the simulator
pretends to be).
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.gpu.models import MODELS, GpuModel
from agent.gpu.profiles import profile_name
from agent.gpu.shapes import get_shape
from agent.gpu.types import GiProfile, GpuInfo, GpuLayout, MigMode, Placement

__all__ = ["Catalog", "preset_layouts", "reference_profiles"]

_ModelKey = tuple[int, int]  # (packed PCI device id, total memory bytes)


def reference_profiles(model: GpuModel, memory_total_bytes: int) -> tuple[GiProfile, ...]:
    """A model's profiles as the driver would report them on a board with this much memory."""
    return tuple(
        GiProfile(
            constant=p.constant,
            id=p.id,
            name=profile_name(p.slice_count, p.memory_mb, memory_total_bytes, p.attrs),
            slice_count=p.slice_count,
            memory_slices=p.memory_slices,
            instance_count=p.instance_count,
            memory_mb=p.memory_mb,
            multiprocessor_count=p.multiprocessor_count,
            copy_engines=p.copy_engines,
            decoders=p.decoders,
            encoders=p.encoders,
            jpegs=p.jpegs,
            ofas=p.ofas,
            placements=tuple(Placement(s, p.memory_slices) for s in p.starts),
        )
        for p in model.gi_profiles
    )


class Catalog:
    """Profiles by GPU model: learned from the fleet first, the reference tables second."""

    def __init__(self, layouts: Iterable[GpuLayout] = ()) -> None:
        self._learned: dict[_ModelKey, tuple[GiProfile, ...]] = {}
        for layout in layouts:
            if layout.profiles:
                self._learned.setdefault(_key(layout.gpu), layout.profiles)

    def profiles(self, gpu: GpuInfo) -> tuple[GiProfile, ...]:
        """What ``gpu`` offers with MIG on; empty for a model neither source knows."""
        if gpu.mig_mode is None:
            return ()
        learned = self._learned.get(_key(gpu))
        if learned is not None:
            return learned
        model = _reference_model(gpu)
        return () if model is None else reference_profiles(model, gpu.memory_total_bytes)

    def complete(self, layout: GpuLayout) -> GpuLayout:
        """``layout`` with its model's profiles filled in when the agent reported none."""
        if layout.profiles:
            return layout
        profiles = self.profiles(layout.gpu)
        if not profiles:
            return layout
        return GpuLayout(layout.gpu, profiles, layout.instances, layout.processes)


def _key(gpu: GpuInfo) -> _ModelKey:
    return (gpu.pci_device_id, gpu.memory_total_bytes)


def _reference_model(gpu: GpuInfo) -> GpuModel | None:
    by_id = [m for m in MODELS.values() if m.pci_device_id == gpu.pci_device_id]
    if len(by_id) == 1:
        return by_id[0]
    return next((m for m in MODELS.values() if m.name == gpu.name), None)


def preset_layouts(preset: str, node: str) -> tuple[GpuLayout, ...]:
    """Idle whole GPUs (MIG off) of a node shape (agent.gpu.shapes): nodes to try in a capacity
    replay."""
    out = []
    for index, key in enumerate(get_shape(preset).gpus):
        model = MODELS[key]
        info = GpuInfo(
            index=index,
            uuid=f"GPU-{node}-{index}",
            name=model.name,
            pci_bus_id=f"00000000:{index + 1:02X}:00.0",
            pci_device_id=model.pci_device_id,
            pci_subsystem_id=model.pci_subsystem_id,
            memory_total_bytes=model.memory_total_bytes,
            mig_mode=MigMode(False, False),
        )
        out.append(GpuLayout(info, reference_profiles(model, info.memory_total_bytes), (), ()))
    return tuple(out)
