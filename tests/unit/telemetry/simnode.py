"""Helpers to build telemetry on a simulated node (the simulator is the driver, never a mock)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent.gpu import GpuDriver, open_driver
from agent.gpu.readings import NodeReader
from agent.gpu.sim import SimControl
from agent.gpu.types import GpuInstance
from agent.telemetry.readers import Sources, build_sampler
from agent.telemetry.sampler import Sampler, SamplerOptions
from agent.telemetry.snapshot import EntitySample, Snapshot
from agent.telemetry.stats import TelemetryStats
from dcgm.counters import CounterSet, load_counters

#: A little over NVML's 100 ms GPM refresh, so every second tick yields a GPM window.
GPM_WINDOW_S = 0.12


@dataclass
class SimNode:
    state_dir: Path
    driver: GpuDriver
    control: SimControl
    stats: TelemetryStats = field(default_factory=TelemetryStats)

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.driver.gpus()]

    def sampler(
        self,
        counters: CounterSet | None = None,
        options: SamplerOptions | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        **sources: object,
    ) -> Sampler:
        """The sampler the agent builds, over the readers its counters and ``sources``
        (``Sources``' fields: xids, pods, dra, profiling, containers) choose."""
        options = options or SamplerOptions(hostname="node-1", proc_root=self.control.proc_root)
        return build_sampler(
            NodeReader(self.driver),
            counters or load_counters(),
            self.stats,
            options,
            Sources(**sources),  # type: ignore[arg-type]
            clock=clock,
            wall_clock=wall_clock,
        )

    def create_instance(self, gpu: int, profile: str, slot: int = 0) -> GpuInstance:
        """Enable MIG if needed and create one GI with a full-size CI."""
        uuid = self.uuids[gpu]
        layout = self.driver.layout(uuid)
        if not (layout.gpu.mig_mode and layout.gpu.mig_mode.current):
            self.driver.set_mig_mode(uuid, True)
        spec = next(p for p in self.driver.gi_profiles(uuid) if p.name == profile)
        gi = self.driver.create_gpu_instance(uuid, spec.id, spec.placements[slot])
        ci = max(self.driver.ci_profiles(uuid, gi.id), key=lambda c: c.slice_count)
        self.driver.create_compute_instance(uuid, gi.id, ci.id)
        return gi


def sim_node(state_dir: Path, preset: str = "dgx-h100") -> SimNode:
    driver = open_driver(preset, state_dir)
    return SimNode(state_dir, driver, SimControl(state_dir))


def two_ticks(sampler: Sampler) -> Snapshot:
    """Seed GPM, wait one window, collect: the snapshot a scrape would see after one interval."""
    sampler.tick()
    time.sleep(GPM_WINDOW_S)
    return sampler.tick()


def entity(snapshot: Snapshot, gpu: int, gpu_instance: int | None = None) -> EntitySample:
    for sample in snapshot.entities:
        instance = sample.entity.instance
        gi = instance.gpu_instance_id if instance is not None else None
        if sample.entity.gpu.index == gpu and gi == gpu_instance:
            return sample
    raise AssertionError(f"no entity GPU {gpu} GI {gpu_instance} in the snapshot")
