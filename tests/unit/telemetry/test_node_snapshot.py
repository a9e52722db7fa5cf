"""One node snapshot for telemetry and the API: the sampler's tick carries every GPU's layout
and processes, the inventory (GetNode) reads it and makes no NVML call of its own, and a
layout is re-read in full only when the MIG shape changes (BENCHMARKS.md, "NVML calls per
node")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.api.events import EventBus
from agent.api.inventory import NodeInventory
from agent.config import TelemetrySettings
from agent.gpu import GpuDriver, open_driver
from agent.gpu.readings import FULL_LAYOUT_EVERY, NodeReader
from agent.gpu.sim import SimControl
from agent.telemetry.service import TelemetryService, build_telemetry


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[GpuDriver, TelemetryService, NodeInventory]]:
    driver = open_driver("h100-nvl", tmp_path)
    settings = TelemetrySettings(kubelet_socket=tmp_path / "absent.sock")
    telemetry = build_telemetry(
        driver, settings, hostname="n", proc_root=tmp_path, attribute_pods=False
    )
    inventory = NodeInventory(
        EventBus(), node_name="n", simulated_preset=None, telemetry=telemetry.sampler.latest
    )
    telemetry.sampler.subscribe(inventory.refresh_gpus)
    yield driver, telemetry, inventory
    driver.close()


def _total(driver: GpuDriver) -> int:
    return sum(driver.calls.values())


def test_the_inventory_adds_no_nvml_calls(
    node: tuple[GpuDriver, TelemetryService, NodeInventory],
) -> None:
    driver, telemetry, inventory = node
    telemetry.sampler.tick()
    before = _total(driver)
    inventory.refresh_gpus()
    assert _total(driver) == before
    assert [g.uuid for g in inventory.response().node.gpus] == [g.uuid for g in driver.gpus()]


def test_getnode_follows_a_mig_change_made_outside_the_agent(
    node: tuple[GpuDriver, TelemetryService, NodeInventory], tmp_path: Path
) -> None:
    _driver, telemetry, inventory = node
    telemetry.sampler.tick()
    outside = open_driver("h100-nvl", tmp_path)  # another NVML client (nvidia-smi, mig-parted)
    uuid = outside.gpus()[1].uuid
    outside.set_mig_mode(uuid, True)
    profile = next(p for p in outside.gi_profiles(uuid) if p.name.startswith("3g"))
    gi = outside.create_gpu_instance(uuid, profile.id, profile.placements[0])
    outside.create_compute_instance(uuid, gi.id, outside.ci_profiles(uuid, gi.id)[-1].id)
    SimControl(tmp_path).start_process(77, 0, used_memory_mib=100)
    outside.close()
    telemetry.sampler.tick()
    gpus = inventory.response().node.gpus
    assert [i.profile_name for i in gpus[1].instances] == [profile.name]
    assert [p.pid for p in gpus[0].processes] == [77]


def test_an_unchanged_layout_costs_one_process_list(tmp_path: Path) -> None:
    driver = open_driver("h100-nvl", tmp_path)
    reader = NodeReader(driver)
    reader.gpus()
    spent: list[int] = []
    for _ in range(FULL_LAYOUT_EVERY + 1):
        mig = reader.mig_layout(0)
        start = _total(driver)
        reader.layout(0, mig)
        spent.append(_total(driver) - start)
    assert spent[0] > 10  # the first read is in full
    assert spent[1:FULL_LAYOUT_EVERY] == [1] * (FULL_LAYOUT_EVERY - 1)  # the process list
    assert spent[FULL_LAYOUT_EVERY] > 10  # the periodic full re-read
    driver.set_mig_mode(driver.gpus()[0].uuid, True)  # the agent's own change: read in full
    start = _total(driver)
    layout = reader.layout(0, reader.mig_layout(0))
    assert _total(driver) - start > 10
    assert layout.gpu.mig_mode is not None and layout.gpu.mig_mode.current
    driver.close()
