"""GpuLayout records for sharing tests, built from the H100-80GB table (reference/mig.md §1.3).

Sharing only reads MIG mode, GI profile names and CI widths, so these are plain records, not the
simulator.
"""

from __future__ import annotations

from agent.gpu.types import (
    ComputeInstance,
    GiProfile,
    GpuInfo,
    GpuInstance,
    GpuLayout,
    MigMode,
    Placement,
)

# name: (constant, profile id, compute slices, memory slices, max count, memory MiB, SMs, starts)
_H100 = {
    "1g.10gb": (0x0, 19, 1, 1, 7, 9984, 16, range(7)),
    "1g.10gb+me": (0x7, 20, 1, 1, 1, 9984, 16, range(7)),
    "1g.20gb": (0x9, 15, 1, 2, 4, 20096, 26, (0, 2, 4, 6)),
    "2g.20gb": (0x1, 14, 2, 2, 3, 20096, 32, (0, 2, 4)),
    "3g.40gb": (0x2, 9, 3, 4, 2, 40448, 60, (0, 4)),
    "4g.40gb": (0x3, 5, 4, 4, 1, 40448, 64, (0,)),
    "7g.80gb": (0x4, 0, 7, 8, 1, 81152, 132, (0,)),
}

PROFILES = tuple(
    GiProfile(
        constant=const,
        id=pid,
        name=name,
        slice_count=c,
        memory_slices=m,
        instance_count=count,
        memory_mb=mb,
        multiprocessor_count=sms,
        copy_engines=c,
        decoders=c,
        encoders=0,
        jpegs=c,
        ofas=1 if c == 7 or name.endswith("+me") else 0,
        placements=tuple(Placement(s, m) for s in starts),
    )
    for name, (const, pid, c, m, count, mb, sms, starts) in _H100.items()
)


def _info(index: int, mig: bool | None) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index:08x}-1111-2222-3333-444444444444",
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        pci_device_id=0x233010DE,
        pci_subsystem_id=0x16C110DE,
        memory_total_bytes=81559 * 1024 * 1024,
        mig_mode=None if mig is None else MigMode(current=mig, pending=mig),
    )


def full_gpu(index: int, *, mig_capable: bool = True) -> GpuLayout:
    """A GPU with MIG disabled (or not MIG-capable at all)."""
    return GpuLayout(_info(index, False if mig_capable else None), PROFILES, (), ())


def mig_gpu(index: int, *devices: str) -> GpuLayout:
    """A MIG-enabled GPU with one GI per entry: ``"1g.10gb"`` (full-width CI) or ``"1c.3g.40gb"``
    (a CI narrower than its GI)."""
    instances = []
    start = 0
    for gi_id, device in enumerate(devices, start=1):
        ci_width, _, gi_name = device.rpartition("c.") if device[1:3] == "c." else ("", "", device)
        _, pid, c, m, *_ = _H100[gi_name]
        width = int(ci_width) if ci_width else c
        ci = ComputeInstance(
            id=0,
            profile_id=width - 1,
            placement=Placement(0, width),
            uuid=f"MIG-{index:02x}{gi_id:06x}-aaaa-bbbb-cccc-dddddddddddd",
        )
        instances.append(GpuInstance(gi_id, pid, gi_name, Placement(start, m), (ci,)))
        start += m
    return GpuLayout(_info(index, True), PROFILES, tuple(instances), ())


def node(count: int) -> list[GpuLayout]:
    """``count`` full H100s, MIG disabled."""
    return [full_gpu(i) for i in range(count)]
