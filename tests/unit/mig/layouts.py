"""GpuLayout records built from the simulator's GPU models, for pure planner tests."""

from __future__ import annotations

from collections.abc import Sequence

from agent.gpu.models import MODELS, GpuModel
from agent.gpu.profiles import profile_name
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
from agent.mig.desired import _free_ci_start

#: A mig-parted config: GPU 0 in two 3g.40gb halves (an H100 or H200), the others untouched.
MIG_HALVES = """\
version: v1
mig-configs:
  halves:
    - devices: [0]
      mig-enabled: true
      mig-devices: {3g.40gb: 2}
"""

#: (profile name, start, CI widths); widths default to one full-width CI.
Instance = tuple[str, int] | tuple[str, int, tuple[int, ...]]


def profiles_of(model: GpuModel) -> tuple[GiProfile, ...]:
    """The profiles GpuDriver.gi_profiles would report for ``model``."""
    return tuple(
        GiProfile(
            constant=p.constant,
            id=p.id,
            name=profile_name(p.slice_count, p.memory_mb, model.memory_total_bytes, p.attrs),
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


def make_layout(
    model_key: str,
    instances: Sequence[Instance] = (),
    *,
    busy: Sequence[tuple[int, int]] = (),
    gpu_processes: Sequence[int] = (),
    mig: tuple[bool, bool] | None = (True, True),
    index: int = 0,
) -> GpuLayout:
    """A layout of ``model_key`` holding ``instances`` (GI ids 1, 2, ... in the given order).

    ``busy`` is (pid, GI id) of processes on instances; ``gpu_processes`` run on the whole GPU.
    """
    model = MODELS[model_key]
    profiles = profiles_of(model)
    by_name = {p.name: p for p in profiles}
    gis: list[GpuInstance] = []
    for gi_id, spec in enumerate(instances, start=1):
        name, start = spec[0], spec[1]
        profile = by_name[name]
        widths = spec[2] if len(spec) == 3 else (profile.slice_count,)  # type: ignore[misc]
        cis: list[ComputeInstance] = []
        used = 0
        for ci_id, width in enumerate(widths):
            at = _free_ci_start(profile.slice_count, width, used)
            assert at is not None, f"{widths} do not fit a {name} instance"
            used |= ((1 << width) - 1) << at
            cis.append(ComputeInstance(ci_id, width, Placement(at, width), None))
        gis.append(
            GpuInstance(
                gi_id, profile.id, name, Placement(start, profile.memory_slices), tuple(cis)
            )
        )
    gpu = GpuInfo(
        index=index,
        uuid=f"GPU-{model_key}-{index}",
        name=model.name,
        pci_bus_id=f"00000000:{index + 1:02X}:00.0",
        pci_device_id=model.pci_device_id,
        pci_subsystem_id=model.pci_subsystem_id,
        memory_total_bytes=model.memory_total_bytes,
        mig_mode=None if mig is None else MigMode(*mig),
    )
    processes = [Process(pid, 1 << 30, gi, 0) for pid, gi in busy]
    processes += [Process(pid, 1 << 30, None, None) for pid in gpu_processes]
    return GpuLayout(gpu, profiles, tuple(gis), tuple(processes))
