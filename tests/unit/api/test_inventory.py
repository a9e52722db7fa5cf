"""GetNode's prebuilt inventory: each GPU carries its idle seconds from the telemetry sampler's
latest snapshot, so a fleet sweep needs one call per node."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.api.events import EventBus
from agent.api.inventory import NodeInventory
from agent.gpu import GpuDriver, open_driver
from agent.telemetry.snapshot import (
    Entity,
    EntitySample,
    GpuIdentity,
    InstanceIdentity,
    Snapshot,
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
        taken_at=0.0,
        hostname="node-1",
        driver_version="",
        nvml_version="",
        gpus=(),
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
        driver, EventBus(), node_name="node-1", simulated_preset=None, telemetry=lambda: snapshot
    )
    inventory.refresh_gpus()
    gpus = inventory.response().node.gpus
    idle = {g.index: g.idle_seconds for g in gpus if g.HasField("idle_seconds")}
    assert idle == {0: 7200.0, 3: 0.0}


@pytest.mark.parametrize("with_source", [True, False])
def test_without_a_snapshot_the_idle_seconds_are_absent(
    driver: GpuDriver, with_source: bool
) -> None:
    inventory = NodeInventory(
        driver,
        EventBus(),
        node_name="node-1",
        simulated_preset=None,
        telemetry=(lambda: None) if with_source else None,
    )
    inventory.refresh_gpus()
    gpus = inventory.response().node.gpus
    assert len(gpus) == 8
    assert not any(g.HasField("idle_seconds") for g in gpus)
