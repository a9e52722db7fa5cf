"""Which listed devices a republish wait compares (agent.dra.republish ``Expected``): those of
the GPUs NVML read; a device of a GPU not read (lost, or failing a read) is not, told by its
uuid or its ``parentUUID`` (agent.dra.slices reads it), or, when such a GPU's uuid is unknown,
by being no device of a GPU read."""

from __future__ import annotations

from typing import Any

from agent.dra.republish import Expected
from agent.dra.slices import read_slices
from agent.gpu.types import GpuInfo
from tests.unit.dra.test_detect import DRIVER, NODE, gpu, slice_


def mig(minor: int, uuid: str, parent: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {"type": {"string": "mig"}, "uuid": {"string": uuid}}
    if parent is not None:
        attributes["parentUUID"] = {"string": parent}
    return {"name": f"gpu-{minor}-mig-1g10gb-19-{uuid[-1]}", "attributes": attributes}


#: GPU 0 read, with MIG-a after the apply; GPU 1 read, MIG off; GPU 7 listed but not read
LISTED = read_slices(
    [
        slice_(
            [
                mig(0, "MIG-a", "GPU-0"),
                gpu(1, "GPU-1"),
                gpu(7, "GPU-7"),  # as the plugin last saw it
                mig(7, "MIG-z", "GPU-7"),
            ]
        )
    ],
    DRIVER,
    NODE,
)
READ = frozenset({"GPU-0", "GPU-1"})


def unread(uuid: str) -> GpuInfo:
    return GpuInfo(7, uuid, "", "", 0, 0, 0, None)


def test_the_reader_keeps_a_mig_devices_parent() -> None:
    assert [d.parent for d in LISTED.devices] == ["GPU-0", "", "", "GPU-7"]


def test_the_devices_of_a_gpu_not_read_are_not_compared_by_uuid_or_parent() -> None:
    expected = Expected(("GPU-1", "MIG-a"), READ, (unread("GPU-7"),))
    assert expected.listed(LISTED) == ("GPU-1", "MIG-a")
    assert expected.left_out() == " (GPU 7 not read: its devices are not compared)"


def test_with_its_uuid_unknown_only_the_gpus_read_are_compared() -> None:
    expected = Expected(("GPU-1", "MIG-a"), READ, (unread(""),))
    assert expected.listed(LISTED) == ("GPU-1", "MIG-a")


def test_every_gpu_read_compares_every_device_and_a_stale_one_of_a_gpu_read_still_counts() -> None:
    everything = Expected(("GPU-1", "MIG-a"), READ)
    assert everything.listed(LISTED) == ("GPU-1", "GPU-7", "MIG-a", "MIG-z")
    assert everything.left_out() == ""
    stale = read_slices(
        [slice_([mig(0, "MIG-a", "GPU-0"), mig(0, "MIG-b", "GPU-0")])], DRIVER, NODE
    )
    beside = Expected(("MIG-a",), frozenset({"GPU-0"}), (unread(""),))
    assert beside.listed(stale) == ("MIG-a", "MIG-b")  # GPU 0's old device: not yet republished
