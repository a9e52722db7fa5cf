"""A MIG change this agent makes is no telemetry fault, and it is said once.

An apply destroys and creates every GPU's instances while the sampler reads them: reads that
meet it fail. Those failures are the agent's own doing, not the GPU's: they must not feed
``gpu_agent_telemetry_errors_total`` (its dashboard panel and alerts spiked after every apply),
and what a GPU half-way through the change answered is not published as its reading (not read
this tick, never 0). The same change made by anyone else still counts. The first MIG enable
says what it learned (fields a MIG GPU does not support, layouts re-probed) once, not per GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse

from agent.gpu import GpuDriver, open_driver
from agent.gpu.readings import MigLayout, NodeReader
from agent.mig.apply import ProgressEvent
from agent.mig.lock import PartitionLock
from agent.mig.reset import simulated_reset
from agent.mig.service import MigService
from agent.mig.spec import parse_spec
from agent.state import StateStore
from agent.telemetry.exporter import MetricsExporter
from agent.telemetry.pods import PodResourcesClient, PodWatcher
from agent.telemetry.readers import Sources, build_sampler
from agent.telemetry.sampler import Sampler, SamplerOptions
from agent.telemetry.snapshot import Snapshot
from agent.telemetry.stats import TelemetryStats
from dcgm.counters import load_counters
from tests.unit.telemetry.kubelet import FakeKubelet, serve
from tests.unit.telemetry.simnode import GPM_WINDOW_S, SimNode, sim_node

SPEC = parse_spec((Path(__file__).parents[3] / "examples" / "mig-config.yaml").read_text())
LAST_GPU = 7
#: what a GPU's status says while this agent changes it (gpu-agent status shows it)
RECONFIGURING = "being reconfigured by this agent (MIG change in progress)"


class MidTick(NodeReader):
    """The agent's reader over the simulated driver, with a change made in the middle of a
    tick: right after GPU ``at``'s layout is read (the last one's by default), so that every
    GPU's readings meet instances destroyed or created since its layout was read."""

    def __init__(self, driver: GpuDriver) -> None:
        super().__init__(driver)
        self.change: Callable[[], object] | None = None
        self.at = LAST_GPU

    def mig_layout(self, gpu: int) -> MigLayout:
        layout = super().mig_layout(gpu)
        if gpu == self.at and self.change is not None:
            change, self.change = self.change, None
            change()
        return layout


class Node:
    def __init__(self, sim: SimNode, store: StateStore, sampler: Sampler, reader: MidTick) -> None:
        self.sim, self.store, self.sampler, self.reader = sim, store, sampler, reader
        self.mig = self.service(sim.driver)

    def service(self, driver: GpuDriver) -> MigService:
        """A MIG service over ``driver``: the agent's own (``sim.driver``) or another's."""
        reset = simulated_reset(self.sim.state_dir)
        return MigService(driver, self.store, PartitionLock(self.sim.state_dir), reset)

    def tick_during(self, change: Callable[[], object]) -> Snapshot:
        """One tick with ``change`` made in its middle."""
        self.reader.change = change
        snapshot = self.sampler.tick()
        assert self.reader.change is None, "the change was not made"
        return snapshot

    def settle(self) -> Snapshot:
        """Ticks enough for every source (GPM's two-sample windows) to read the new layout."""
        self.sampler.tick()
        time.sleep(GPM_WINDOW_S)  # GPM's refresh window, not a wait for the change
        return self.sampler.tick()

    def scrape(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        exporter = MetricsExporter(load_counters(), "dcgm", self.sampler.latest, self.sim.stats)
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in parse(exporter.render("text/plain")[0].decode()):
            for s in family.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    def errors(self) -> dict[str, float]:
        """``gpu_agent_telemetry_errors_total`` by kind, as a scrape shows it."""
        rows = self.scrape().get("gpu_agent_telemetry_errors_total", [])
        return {labels["kind"]: value for labels, value in rows if value}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """The dgx-h100 node the agent serves, with kubelet (so process lists are read too)."""
    sim = sim_node(tmp_path / "state")
    store = StateStore(sim.state_dir / "agent.db")
    socket = tmp_path / "kubelet.sock"
    with serve(socket, FakeKubelet([])):
        watcher = PodWatcher(PodResourcesClient(socket), socket, 60, TelemetryStats())
        watcher.refresh()
        reader = MidTick(sim.driver)
        options = SamplerOptions(hostname="node-1", proc_root=sim.control.proc_root)
        sampler = build_sampler(reader, load_counters(), sim.stats, options, Sources(pods=watcher))
        yield Node(sim, store, sampler, reader)
    store.close()


def _gpu_rows(scrape: dict[str, list[tuple[dict[str, str], float]]], name: str) -> set[str]:
    return {labels["gpu"] for labels, _ in scrape.get(name, [])}


def test_the_agents_own_mig_apply_and_disable_count_no_telemetry_errors(node: Node) -> None:
    """The audit's apply/disable pair left nvml 12 and gpm 3 (and a one-off processes): every
    one from reads that met the agent's own change."""
    node.settle()
    node.tick_during(lambda: node.mig.apply(SPEC, "all-balanced"))
    node.settle()
    node.tick_during(lambda: node.mig.apply(SPEC, "all-disabled"))
    node.settle()
    assert node.errors() == {}


def test_a_gpu_mid_change_reads_as_not_read_this_tick_never_as_0(node: Node) -> None:
    node.settle()
    node.tick_during(lambda: node.mig.apply(SPEC, "all-balanced"))
    node.settle()
    during = node.tick_during(lambda: node.mig.apply(SPEC, "all-disabled"))
    assert [(s.gpu.index, s.up, s.unread) for s in during.gpus] == [
        (i, True, RECONFIGURING) for i in range(8)
    ], "a GPU mid-change must say why it is not read this tick"
    assert during.entities == ()  # nothing half-read published as a reading
    scrape = node.scrape()
    assert [v for _, v in scrape["gpu_agent_gpu_read"]] == [0.0] * 8
    assert [v for _, v in scrape["gpu_agent_gpu_up"]] == [1.0] * 8
    assert _gpu_rows(scrape, "DCGM_FI_DEV_FB_USED") == set()
    assert _gpu_rows(scrape, "gpu_agent_field_supported") == set()

    after = node.settle()
    assert all(s.up and not s.unread for s in after.gpus)
    scrape = node.scrape()
    assert _gpu_rows(scrape, "DCGM_FI_DEV_FB_USED") == {str(i) for i in range(8)}
    assert [v for _, v in scrape["gpu_agent_gpu_read"]] == [1.0] * 8


def test_the_same_change_by_someone_else_still_counts_its_errors(node: Node) -> None:
    """Another process changing MIG (nvidia-smi, mig-parted, a second agent) is not this
    agent's change: the reads it breaks are faults to count, as before."""
    node.settle()
    other = open_driver("dgx-h100", node.sim.state_dir)
    try:
        node.tick_during(lambda: node.service(other).apply(SPEC, "all-balanced"))
        node.settle()
        during = node.tick_during(lambda: node.service(other).apply(SPEC, "all-disabled"))
    finally:
        other.close()
    errors = node.errors()
    assert errors.get("nvml", 0) > 0 and errors.get("gpm", 0) > 0, errors
    assert not any(s.unread == RECONFIGURING for s in during.gpus)  # not said to be ours


def test_the_first_mig_enable_says_what_it_learned_once(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """Each GPU enters MIG in its own tick (the sampler ticks between GPUs): the fields a MIG
    GPU does not read are one line, and each change's re-probe one line; the gauge still has
    every GPU's fact."""
    node.settle()

    def tick_per_gpu(event: ProgressEvent) -> None:
        if event.phase == "done":
            node.sampler.tick()

    start = len(caplog.records)  # what the start said (the XID and vGPU fields) is not counted
    with caplog.at_level(logging.DEBUG, logger="agent.telemetry"):
        node.mig.apply(SPEC, "all-balanced", progress=tick_per_gpu)
        node.settle()
        scrape = node.scrape()
        node.mig.apply(SPEC, "all-disabled", progress=tick_per_gpu)
        node.settle()
    said = [
        (r.name, r.levelname, r.getMessage())
        for r in caplog.records[start:]
        if r.levelno >= logging.INFO and r.name.startswith("agent.telemetry")
    ]
    unsupported = [m for name, _, m in said if name == "agent.telemetry.support"]
    assert len(unsupported) == 1, unsupported
    assert unsupported[0].startswith("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, DCGM_FI_DEV_GPU_UTIL")
    assert "(NVIDIA H100 80GB HBM3, MIG on)" in unsupported[0]
    reprobed = [m for name, _, m in said if name == "agent.telemetry.topology"]
    everyone = "MIG layout changed on GPUs 0, 1, 2, 3, 4, 5, 6, 7: field support re-probed"
    assert reprobed == [everyone, everyone]
    assert [level for _, level, _ in said] == ["WARNING", "INFO", "INFO"]
    util = [
        (labels["gpu"], value)
        for labels, value in scrape["gpu_agent_field_supported"]
        if labels["field"] == "DCGM_FI_DEV_GPU_UTIL"
    ]
    assert util == [(str(i), 0.0) for i in range(8)]


#: What the process list read of a GPU meets when a GPU instance it listed is destroyed before
#: its compute instances are asked for: the audit's one-off kind="processes" line.
def _race(node: Node, change: Callable[[], object]) -> Callable[[], None]:
    def made() -> None:
        change()
        node.sim.control.inject_fault(
            "nvmlGpuInstanceGetComputeInstances", "INVALID_ARGUMENT", gpu=1, count=1
        )

    return made


def test_a_process_list_that_meets_the_agents_own_change_is_no_fault(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node.mig.apply(SPEC, "all-balanced")
    node.settle()
    node.reader.at = 1
    start = len(caplog.records)
    with caplog.at_level(logging.INFO, logger="agent.telemetry"):
        during = node.tick_during(_race(node, lambda: node.mig.apply(SPEC, "all-1g")))
    assert not node.sim.control.describe().get("faults"), "the race was not met"
    assert during.gpus[1].unread == RECONFIGURING
    assert node.errors() == {}
    warned = [r.getMessage() for r in caplog.records[start:] if r.levelno >= logging.WARNING]
    assert warned == []


def test_a_process_list_that_fails_outside_the_agents_change_still_counts(node: Node) -> None:
    """The same failure with no change of this agent's in progress (another process changed
    the layout, which the tick reads afresh): counted and said, as any failed process list."""
    node.mig.apply(SPEC, "all-balanced")
    node.settle()
    other = open_driver("dgx-h100", node.sim.state_dir)
    try:
        node.service(other).apply(SPEC, "all-1g")
    finally:
        other.close()
    node.reader.at = 1
    during = node.tick_during(_race(node, lambda: None))
    assert not node.sim.control.describe().get("faults"), "the race was not met"
    assert "nvmlGpuInstanceGetComputeInstances: Invalid Argument" in during.gpus[1].unread
    errors = node.errors()
    assert errors.get("processes") == 1 and errors.get("nvml", 0) >= 1, errors
