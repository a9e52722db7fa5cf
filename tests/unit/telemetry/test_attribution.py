"""Attribution as a pure stage: readings and allocations in, labelled readings out, with no
sampler, driver or kubelet behind it (agent/telemetry/attribution.py)."""

from __future__ import annotations

from types import MappingProxyType

from agent.gpu.readings import GpuIdentity, GpuInstanceInfo, MigDevice, MigLayout
from agent.gpu.types import ComputeInstance, GpuInfo, GpuInstance, GpuLayout, MigMode, Placement
from agent.telemetry.allocation import Allocation, DeviceId
from agent.telemetry.attribution import attribute_samples
from agent.telemetry.snapshot import DraClaim, Entity, EntitySample, InstanceIdentity, PodRef

GPU0 = GpuIdentity(0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", "00000000:18:00.0", 0)
GPU1 = GpuIdentity(1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", "00000000:2A:00.0", 1)
GI3 = GpuInstanceInfo(3, "1g.10gb", (MigDevice("MIG-3333", 3, 0),))
GI5 = GpuInstanceInfo(5, "1g.10gb", (MigDevice("MIG-5555", 5, 0),))
LAYOUTS = {0: MigLayout(False), 1: MigLayout(True, (GI3, GI5))}
TRAIN = PodRef("ml", "train-0", "main")
NB = PodRef("team-a", "nb-1", "jupyter")
NB2 = PodRef("team-a", "nb-2", "jupyter")
MIG = "nvidia.com/mig-1g.10gb"


def _samples() -> list[EntitySample]:
    values = MappingProxyType({252: 1024.0})
    return [
        EntitySample(Entity(GPU0), values),
        EntitySample(Entity(GPU1), values),
        EntitySample(Entity(GPU1, InstanceIdentity(3, "1g.10gb")), values),
        EntitySample(Entity(GPU1, InstanceIdentity(5, "1g.10gb")), values),
    ]


def _by_gi(result_samples: tuple[EntitySample, ...]) -> dict[tuple[int, int | None], PodRef | None]:
    return {
        (s.entity.gpu.index, s.entity.instance.gpu_instance_id if s.entity.instance else None): (
            s.pod
        )
        for s in result_samples
    }


def test_device_plugin_ids_label_the_gpu_and_the_instance_held_by_one_container() -> None:
    allocations = [
        Allocation(TRAIN, "nvidia.com/gpu", DeviceId(uuid="GPU-aaaa")),
        Allocation(NB, MIG, DeviceId(uuid="MIG-3333")),
        Allocation(NB, MIG, DeviceId(uuid="MIG-5555")),
        Allocation(NB2, MIG, DeviceId(uuid="MIG-5555")),  # shared (time-slicing): two holders
        Allocation(TRAIN, "nvidia.com/gpu", DeviceId(uuid="GPU-elsewhere")),
    ]
    result = attribute_samples(_samples(), (GPU0, GPU1), LAYOUTS, (), allocations)
    assert _by_gi(result.samples) == {(0, None): TRAIN, (1, None): None, (1, 3): NB, (1, 5): None}
    five = Entity(GPU1, InstanceIdentity(5, "1g.10gb"))
    assert result.holders[five] == (NB, NB2)
    assert result.unresolved == {}  # a device plugin's id of another node is not a DRA problem
    assert [s.values for s in result.samples] == [s.values for s in _samples()]


def test_a_dynamic_mig_claim_resolves_by_placement_and_gets_the_mig_device_uuid() -> None:
    claim = DraClaim("serve", "ml", "gpu.nvidia.com", "node-1", "gpu-1-mig-1g10gb-5", "1g.10gb")
    placed = [_placed(GPU1, [(3, 19, 0), (5, 19, 4)])]
    device = DeviceId(gpu_uuid="GPU-bbbb", minor=1, profile_id=19, placement_start=4)
    gone = DraClaim("old", "ml", "gpu.nvidia.com", "node-1", "gpu-1-mig-1g10gb-6", "1g.10gb")
    allocations = [
        Allocation(TRAIN, "gpu.nvidia.com", device, claim),
        Allocation(NB, "gpu.nvidia.com", None, gone),  # not in this node's ResourceSlices
    ]
    result = attribute_samples(
        _samples(), (GPU0, GPU1), LAYOUTS, placed, allocations, lambda pod: f"uid-{pod.name}"
    )
    (held,) = [s for s in result.samples if s.pod is not None]
    assert held.entity.instance is not None and held.entity.instance.gpu_instance_id == 5
    assert held.claim is not None and held.claim.mig_device_uuid == "MIG-5555"
    assert held.pod_uid == "uid-train-0"
    assert list(result.unresolved) == [("ml", "old", "node-1", "gpu-1-mig-1g10gb-6")]


def test_a_dynamic_mig_device_whose_minor_names_another_gpu_is_not_guessed() -> None:
    claim = DraClaim("serve", "ml", "gpu.nvidia.com", "node-1", "gpu-0-mig-1g10gb-5", "1g.10gb")
    placed = [_placed(GPU1, [(5, 19, 4)])]
    device = DeviceId(gpu_uuid="GPU-bbbb", minor=0, profile_id=19, placement_start=4)
    allocations = [Allocation(TRAIN, "gpu.nvidia.com", device, claim)]
    result = attribute_samples(_samples(), (GPU0, GPU1), LAYOUTS, placed, allocations)
    assert all(s.pod is None for s in result.samples)
    assert len(result.unresolved) == 1


def _placed(gpu: GpuIdentity, instances: list[tuple[int, int, int]]) -> GpuLayout:
    """The planner's layout of ``gpu``: (GI id, profile id, placement start) per instance."""
    info = GpuInfo(
        gpu.index, gpu.uuid, gpu.name, gpu.pci_bus_id, 0, 0, 80 << 30, MigMode(True, True)
    )
    gis = tuple(
        GpuInstance(
            gi,
            profile,
            "1g.10gb",
            Placement(start, 1),
            (ComputeInstance(0, 0, Placement(0, 1), None),),
        )
        for gi, profile, start in instances
    )
    return GpuLayout(info, (), gis, ())
