"""GetNode's prebuilt inventory: each GPU carries its idle seconds from the telemetry sampler's
latest snapshot, so a fleet sweep needs one call per node."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent._proto.gpuagent.v1 import agent_pb2
from agent.api.events import EventBus
from agent.api.inventory import NodeInventory
from agent.dra.mode import Allocation, AllocationMode
from agent.errors import Conflict
from agent.gpu import GpuDriver, open_driver
from agent.prewarm.inventory import Inventory as CacheInventory
from agent.sharing import SharingView, parse
from agent.sharing.view import DraView, Pickup
from agent.telemetry.snapshot import (
    Entity,
    EntitySample,
    GpuIdentity,
    GpuStatus,
    InstanceIdentity,
    Snapshot,
    SourceStatus,
)


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[GpuDriver]:
    gpu = open_driver("dgx-h100", tmp_path)
    try:
        yield gpu
    finally:
        gpu.close()


def _snapshot(driver: GpuDriver) -> Snapshot:
    gpus = [GpuIdentity(g.index, g.uuid, g.name, g.pci_bus_id, g.index) for g in driver.gpus()]
    return Snapshot(
        taken_at=1.0,
        taken_mono=1.0,
        hostname="node-1",
        driver_version="",
        nvml_version="",
        gpus=tuple(GpuStatus(g, up=True) for g in gpus),
        layouts=tuple(driver.layout(g.uuid) for g in gpus),
        entities=(
            EntitySample(Entity(gpus[0]), {}, idle_seconds=7200.0),
            # An instance's figure is its own, never its GPU's.
            EntitySample(Entity(gpus[1], InstanceIdentity(1, "1g.10gb")), {}, idle_seconds=9e9),
            EntitySample(Entity(gpus[2]), {}, idle_seconds=None),
            EntitySample(Entity(gpus[3]), {}, idle_seconds=0.0),
        ),
    )


def test_each_gpu_carries_its_idle_seconds_from_the_latest_snapshot(driver: GpuDriver) -> None:
    snapshot = _snapshot(driver)
    inventory = NodeInventory(
        EventBus(), node_name="node-1", simulated_preset=None, telemetry=lambda: snapshot
    )
    inventory.refresh_gpus()
    gpus = inventory.response().node.gpus
    idle = {g.index: g.idle_seconds for g in gpus if g.HasField("idle_seconds")}
    assert idle == {0: 7200.0, 3: 0.0}


def test_without_idle_figures_the_idle_seconds_are_absent(driver: GpuDriver) -> None:
    snapshot = _snapshot(driver)
    bare = Snapshot(
        taken_at=1.0,
        hostname="node-1",
        driver_version="",
        nvml_version="",
        gpus=snapshot.gpus,
        entities=(),
        layouts=snapshot.layouts,
    )
    inventory = NodeInventory(
        EventBus(), node_name="node-1", simulated_preset=None, telemetry=lambda: bare
    )
    inventory.refresh_gpus()
    gpus = inventory.response().node.gpus
    assert len(gpus) == 8
    assert not any(g.HasField("idle_seconds") for g in gpus)


def test_a_lost_gpu_is_reported_lost_and_the_others_serve(driver: GpuDriver) -> None:
    """A GPU down in the snapshot keeps its last layout with health LOST; one never seen up
    is listed by its index alone; the gpu-driver component names both."""
    snapshot = _snapshot(driver)
    statuses = list(snapshot.gpus)
    statuses[3] = GpuStatus(statuses[3].gpu, up=False, detail="GPU is lost")
    statuses[5] = GpuStatus(GpuIdentity(5, "", "", "", 5), up=False, detail="GPU is lost")
    layouts = tuple(layout for layout in snapshot.layouts if layout.gpu.index != 5)
    degraded = Snapshot(
        taken_at=2.0,
        hostname="node-1",
        driver_version="",
        nvml_version="",
        gpus=tuple(statuses),
        entities=(),
        layouts=layouts,
    )
    inventory = NodeInventory(
        EventBus(), node_name="node-1", simulated_preset=None, telemetry=lambda: degraded
    )
    inventory.refresh_gpus()
    node = inventory.response().node
    lost = {g.index: g.uuid for g in node.gpus if g.health == agent_pb2.GPU_HEALTH_LOST}
    assert lost == {3: snapshot.layouts[3].gpu.uuid, 5: ""}
    assert {g.index: g.health_detail for g in node.gpus if g.health_detail} == {
        3: "GPU is lost",
        5: "GPU is lost",
    }
    assert len(node.gpus) == 8
    assert [layout.gpu.index for layout in inventory.layouts()] == [0, 1, 2, 4, 6, 7]
    (component,) = [c for c in node.health.components if c.name == "gpu-driver"]
    assert not component.healthy
    assert "GPU 3 lost" in component.detail and "GPU 5 lost" in component.detail
    assert not inventory.every_gpu_lost()


def test_no_gpu_answers_names_each_lost_or_unread_gpu_and_is_empty_while_one_answers(
    driver: GpuDriver,
) -> None:
    """/readyz's words (agent.node): it named every GPU lost, but said a plain "ready" with
    every GPU unread (waiting for a reset), or some lost and the rest unread."""
    snapshot = _snapshot(driver)
    why = "nvmlDeviceGetMigMode: Unknown Error"

    def said(statuses: list[GpuStatus]) -> str:
        shot = dataclasses.replace(snapshot, gpus=tuple(statuses))
        inventory = NodeInventory(
            EventBus(), node_name="node-1", simulated_preset=None, telemetry=lambda: shot
        )
        inventory.refresh_gpus()
        return inventory.no_gpu_answers()

    unread = [GpuStatus(s.gpu, up=None, unread=why) for s in snapshot.gpus]
    every = ", ".join(f"GPU {i} cannot be read ({why})" for i in range(8))
    assert said(unread) == every
    mixed = list(unread)
    mixed[0] = GpuStatus(mixed[0].gpu, up=False, detail="GPU is lost")
    assert said(mixed).startswith(f"GPU 0 lost, GPU 1 cannot be read ({why}), GPU 2 ")
    lost = [GpuStatus(s.gpu, up=False, detail="GPU is lost") for s in snapshot.gpus]
    assert said(lost) == "every GPU is lost (GPU 0, 1, 2, 3, 4, 5, 6, 7)"
    mixed[7] = snapshot.gpus[7]  # one answers: the node has a GPU to serve
    assert said(mixed) == ""


def test_a_gpu_lost_and_back_is_logged_once_each_way(
    driver: GpuDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """The inventory alone says it at the operator's level (the sampler said the same loss too,
    so an agent's log and a CLI's stderr carried each event twice; it now says it at DEBUG):
    one line when lost, one when it answers again."""
    healthy = _snapshot(driver)
    statuses = list(healthy.gpus)
    statuses[3] = GpuStatus(statuses[3].gpu, up=False, detail="GPU is lost")
    down = dataclasses.replace(healthy, gpus=tuple(statuses), taken_mono=2.0)
    up = dataclasses.replace(healthy, taken_mono=3.0)
    sequence = iter([healthy, down, down, up, up])
    inventory = NodeInventory(
        EventBus(), node_name="node-1", simulated_preset=None, telemetry=lambda: next(sequence)
    )
    with caplog.at_level(logging.DEBUG):
        for _ in range(5):
            inventory.refresh_gpus()
    said = [(r.levelname, r.message) for r in caplog.records if r.name == "agent.api.inventory"]
    uuid = healthy.layouts[3].gpu.uuid
    assert said == [
        ("ERROR", f"GPU 3 ({uuid}) lost: GPU is lost"),
        ("WARNING", f"GPU 3 ({uuid}) answers NVML again"),
    ]


def test_an_older_snapshot_never_replaces_a_newer_one(driver: GpuDriver) -> None:
    """The sampler pushes each snapshot and the 1 s loop reads the latest: GetNode never goes
    back in time when the two race."""
    new = _snapshot(driver)
    old = Snapshot(
        taken_at=0.5,
        taken_mono=0.5,
        hostname="node-1",
        driver_version="",
        nvml_version="",
        gpus=(),
        entities=(),
    )
    inventory = NodeInventory(
        EventBus(), node_name="node-1", simulated_preset=None, telemetry=lambda: old
    )
    inventory.refresh_gpus(new)
    inventory.refresh_gpus()  # the loop, with the stale latest
    assert len(inventory.response().node.gpus) == 8


def test_a_snapshot_taken_after_the_clock_stepped_back_still_replaces_the_last(
    driver: GpuDriver,
) -> None:
    """Snapshots are ordered by the sampler's monotonic clock: with the wall clock stepped back
    an hour, GetNode still shows the newest (a GPU lost since), not the last one for an hour."""
    from dataclasses import replace

    before = _snapshot(driver)
    statuses = list(before.gpus)
    statuses[2] = GpuStatus(statuses[2].gpu, up=False, detail="GPU is lost")
    after = replace(
        before,
        taken_at=before.taken_at - 3600,
        taken_mono=before.taken_mono + 1,
        gpus=tuple(statuses),
    )
    inventory = NodeInventory(EventBus(), node_name="node-1", simulated_preset=None)
    inventory.refresh_gpus(before)
    inventory.refresh_gpus(after)
    lost = [
        g.index for g in inventory.response().node.gpus if g.health == agent_pb2.GPU_HEALTH_LOST
    ]
    assert lost == [2]


def test_a_cache_dir_that_vanished_is_an_unhealthy_component_not_a_stopped_agent() -> None:
    """`rm -rf` of the cache's host path (whoever can write it is not trusted) made the cache
    refresh raise FileNotFoundError; the inventory task crashed and stopped the whole agent."""

    def gone() -> CacheInventory:
        raise FileNotFoundError(2, "No such file or directory", "/var/cache/gpu-agent")

    inventory = NodeInventory(EventBus(), node_name="n", simulated_preset=None, cache=gone)
    inventory.refresh_cache()
    health = {c.name: c for c in inventory.response().node.health.components}
    assert not health["cache"].healthy
    assert "No such file or directory" in health["cache"].detail
    assert "/var/cache/gpu-agent" in health["cache"].detail


class _Recorder(EventBus):
    def __init__(self) -> None:
        super().__init__()
        self.published: list[dict[str, object]] = []

    def publish(self, **payload: object) -> None:
        self.published.append(payload)


def test_a_destroyed_instances_xids_are_not_announced_again_for_its_gpu(driver: GpuDriver) -> None:
    """The watcher drops a destroyed instance's key (its count retires): WatchEvents must not
    say its XIDs happened again, on the GPU or anywhere; a new XID is still announced once."""
    counts: list[dict[tuple[int, int | None, int], int]] = [{(0, None, 13): 1, (0, 1, 13): 2}]
    snapshot = _snapshot(driver)
    bus = _Recorder()
    inventory = NodeInventory(
        bus, node_name="node-1", simulated_preset=None, xids=lambda: counts[0]
    )
    inventory.refresh_gpus(snapshot)

    def xids_announced(after: dict[tuple[int, int | None, int], int]) -> list[str]:
        bus.published.clear()
        counts[0] = after
        inventory.refresh_gpus(dataclasses.replace(snapshot, taken_mono=snapshot.taken_mono + 1))
        return [str(p["xid"]).replace("\n", " ") for p in bus.published if "xid" in p]

    assert xids_announced({(0, None, 13): 1}) == []
    (announced,) = xids_announced({(0, None, 13): 2})
    assert "gpu_instance_id" not in announced and "count: 1" in announced


def test_gpus_whose_xids_are_not_watched_are_a_degraded_component(driver: GpuDriver) -> None:
    """`status` lists it under "degraded": a HEALTH column of "healthy" is no verdict where no
    XID reaches the marks (doctor's health/xid check says the same)."""
    why: list[str | None] = ["GPU 3: NVML delivers no XID events for it"]
    inventory = NodeInventory(
        EventBus(),
        node_name="node-1",
        simulated_preset=None,
        xid_unwatched=lambda: why[0],
    )
    snapshot = _snapshot(driver)
    inventory.refresh_gpus(snapshot)
    (xids,) = [c for c in inventory.response().node.health.components if c.name == "xid-events"]
    assert (xids.healthy, xids.detail) == (False, why[0])
    why[0] = None
    inventory.refresh_gpus(dataclasses.replace(snapshot, taken_mono=snapshot.taken_mono + 1))
    (xids,) = [c for c in inventory.response().node.health.components if c.name == "xid-events"]
    assert (xids.healthy, xids.detail) == (True, "watched on every GPU")


def test_a_degraded_telemetry_source_is_a_degraded_component(driver: GpuDriver) -> None:
    """`status` lists it under "degraded" (and `fleet status` among the node's problems): with
    kubelet's List failing, pod labels are its last answer and nothing but the metrics said
    so; `gpu-agent status` read as if every source were read."""
    inventory = NodeInventory(EventBus(), node_name="node-1", simulated_preset=None)
    reason = "kubelet pod-resources List failed (UNAVAILABLE): pods as of its last answer"
    snapshot = dataclasses.replace(
        _snapshot(driver), sources=(SourceStatus("devices"), SourceStatus("pods", reason))
    )
    inventory.refresh_gpus(snapshot)
    (part,) = [c for c in inventory.response().node.health.components if c.name == "telemetry"]
    assert (part.healthy, part.detail) == (False, f"pods: {reason}")
    inventory.refresh_gpus(
        dataclasses.replace(
            snapshot,
            taken_mono=snapshot.taken_mono + 1,
            sources=(SourceStatus("devices"), SourceStatus("pods")),
        )
    )
    (part,) = [c for c in inventory.response().node.health.components if c.name == "telemetry"]
    assert (part.healthy, part.detail) == (True, "every source read: devices, pods")


def test_a_gpu_whose_process_list_was_not_read_is_not_in_the_layouts_read(
    driver: GpuDriver,
) -> None:
    """The reclaimable mark ("idle with no process") read the inventory's layouts, in which a
    GPU whose process list failed kept its last list: an empty one made it reclaimable while
    nobody knew what ran on it. Its processes are unknown in GetNode, and it is left out."""
    snapshot = _snapshot(driver)
    statuses = list(snapshot.gpus)
    why = "processes and layout: nvmlDeviceGetComputeRunningProcesses: Unknown Error"
    statuses[2] = GpuStatus(statuses[2].gpu, up=True, unread=why)
    unread = dataclasses.replace(snapshot, gpus=tuple(statuses))
    inventory = NodeInventory(
        EventBus(), node_name="node-1", simulated_preset=None, telemetry=lambda: unread
    )
    inventory.refresh_gpus()
    assert [layout.gpu.index for layout in inventory.layouts()] == [0, 1, 3, 4, 5, 6, 7]
    gpu = inventory.response().node.gpus[2]
    assert gpu.unread == why and not gpu.never_read and list(gpu.processes) == []
    (component,) = [
        c for c in inventory.response().node.health.components if c.name == "gpu-driver"
    ]
    assert not component.healthy and f"GPU 2 not read: {why}" in component.detail


def _sharing_view(state: str, dra_error: str | None = None) -> SharingView:
    config = parse({"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 4}]}}})
    dra = None
    if dra_error is not None:
        dra = DraView(Allocation(AllocationMode.DRA, "driver"), error=dra_error)
    return SharingView(
        config_path=Path("/etc/nvidia-device-plugin/config.yaml"),
        exists=True,
        config=config,
        advertised=(),
        problems=(),
        pickup=Pickup(state, f"{state} because"),  # type: ignore[arg-type]
        last_write=None,
        dra=dra,
    )


def _sharing_component(inventory: NodeInventory) -> agent_pb2.ComponentHealth:
    node = inventory.response().node
    return next(c for c in node.health.components if c.name == "sharing")


def test_the_sharing_part_is_degraded_while_the_plugin_has_not_loaded_the_file() -> None:
    """It read healthy ("plugin not-loaded") while the plugin ran its old config; the DRA
    driver's objects not read were not said either. The pickup state is always said."""
    views = iter(
        [_sharing_view("not-loaded"), _sharing_view("loaded"), _sharing_view("unknown", "API down")]
    )
    inventory = NodeInventory(EventBus(), node_name="node-1", simulated_preset=None)
    inventory.watch_sharing(lambda: next(views))
    inventory.refresh_sharing()
    part = _sharing_component(inventory)
    assert not part.healthy and part.detail.startswith("plugin not-loaded: not-loaded because")
    assert inventory.response().node.sharing_pickup == "not-loaded"  # what fleet status reads
    inventory.refresh_sharing()
    part = _sharing_component(inventory)
    assert part.healthy and part.detail == "plugin loaded: loaded because"
    assert inventory.response().node.sharing_pickup == "loaded"
    inventory.refresh_sharing()
    part = _sharing_component(inventory)
    assert not part.healthy and "DeviceClasses not read: API down" in part.detail


def test_an_unreadable_sharing_config_is_unknown_not_the_last_one_read() -> None:
    def show() -> SharingView:
        if broken:
            raise Conflict("config.yaml is not valid YAML")
        return _sharing_view("loaded")

    broken = False
    inventory = NodeInventory(EventBus(), node_name="node-1", simulated_preset=None)
    inventory.watch_sharing(show)
    inventory.refresh_sharing()
    assert inventory.response().node.HasField("sharing")
    broken = True
    inventory.refresh_sharing()
    assert not inventory.response().node.HasField("sharing")
    assert not _sharing_component(inventory).healthy


def test_a_gpu_not_read_is_left_out_of_the_layouts_and_named_with_its_call(
    driver: GpuDriver,
) -> None:
    """GPU 2's MIG-mode read fails and GPU 5 was never read: the layouts that sharing counts
    as advertised GPUs left out only lost ones, so both were counted (GPU 5 as a whole GPU of
    no MIG mode). Both are left out, and `unread_gpus` names each with its call; a lost GPU
    never read is lost, not unread."""
    snapshot = _snapshot(driver)
    statuses = list(snapshot.gpus)
    statuses[2] = GpuStatus(statuses[2].gpu, up=True, unread="nvmlDeviceGetMigMode: Unknown")
    statuses[5] = GpuStatus(GpuIdentity(5, "", "", "", 5), up=True, unread="nvmlDeviceGetUUID: x")
    statuses[6] = GpuStatus(GpuIdentity(6, "", "", "", 6), up=False, detail="GPU is lost")
    layouts = tuple(layout for layout in snapshot.layouts if layout.gpu.index not in (5, 6))
    unread = dataclasses.replace(snapshot, gpus=tuple(statuses), layouts=layouts)
    inventory = NodeInventory(
        EventBus(), node_name="node-1", simulated_preset=None, telemetry=lambda: unread
    )
    inventory.refresh_gpus()
    assert [layout.gpu.index for layout in inventory.layouts()] == [0, 1, 3, 4, 7]
    assert inventory.unread_gpus() == {
        2: "nvmlDeviceGetMigMode: Unknown",
        5: "nvmlDeviceGetUUID: x",
    }
