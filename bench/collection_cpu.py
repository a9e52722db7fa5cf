"""Collection CPU per tick, the simulator's own cost measured apart (issue 38, item 4).

The node is bench/telemetry_scrape.py's: a simulated DGX H100 cut into 56 ``1g.10gb`` MIG
instances, one pod process each, attributed through a fake kubelet, the modelled NVML latencies
on. The sampler is built as the agent builds it (``readers.build_sampler``: every reader the
default counters choose, kubelet's pods and the processes reader included) and ticked on this
thread; CPU is this thread's (``time.thread_time``: the modelled latencies sleep, which costs
no CPU, and the XID and kubelet threads are not counted).

The simulator stands in for libnvidia-ml and the kernel driver; its CPU is not the agent's, and
on a GPU node the real library's takes its place. It is measured as the CPU inside the
outermost calls into the simulated pynvml module (each public ``nvml*`` function: the fault
check, pynvml's own Python wrapper and the simulated library). A second pass under cProfile
(same CPU clock) lists the agent's own functions by self time; cProfile inflates all of them.

Usage (from the repository root):
    .venv/bin/python -m bench.collection_cpu [--ticks N] [--top K]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.telemetry_scrape import INTERVAL_S, PRESET, build_node, kubelet

_SIM = Path(__file__).resolve().parent.parent / "agent" / "gpu" / "sim"
_GPM_WINDOW_S = 0.12  # over NVML's 100 ms GPM refresh: every tick yields GPM values


class SimulatorClock:
    """CPU of this thread inside the outermost calls into the simulated pynvml module."""

    def __init__(self, module: Any) -> None:
        self.cpu_s = 0.0
        self._depth = 0
        self._thread = threading.get_ident()
        for name, fn in list(vars(module).items()):
            if name.startswith("nvml") and callable(fn) and not isinstance(fn, type):
                setattr(module, name, self._timed(fn))

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self._thread or self._depth:
                return fn(*args, **kwargs)  # another thread's (XIDs), or nested in a timed call
            self._depth += 1
            began = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu_s += time.thread_time() - began
                self._depth -= 1

        return call


class Stages:
    """CPU per stage of a tick (the frame, each reader, attribution), the simulator's apart."""

    def __init__(self, clock: SimulatorClock) -> None:
        from agent.telemetry import sampler
        from agent.telemetry.devices import DeviceReader
        from agent.telemetry.gpm import GpmReader
        from agent.telemetry.pods import PodsReader
        from agent.telemetry.processes import ProcessReader
        from agent.telemetry.topology import Topology
        from agent.telemetry.xid import XidReader

        self.cpu: dict[str, list[float]] = {}  # stage -> [total, simulator]
        self._clock = clock
        for stage, owner, attr in (
            ("layouts", Topology, "frame"),
            ("devices", DeviceReader, "read"),
            ("gpm", GpmReader, "read"),
            ("xid", XidReader, "read"),
            ("pods", PodsReader, "read"),
            ("processes", ProcessReader, "read"),
            ("attribution", sampler, "attribute_samples"),
        ):
            setattr(owner, attr, self._timed(stage, getattr(owner, attr)))

    def _timed(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            began, sim = time.thread_time(), self._clock.cpu_s
            try:
                return fn(*args, **kwargs)
            finally:
                entry = self.cpu.setdefault(stage, [0.0, 0.0])
                entry[0] += time.thread_time() - began
                entry[1] += self._clock.cpu_s - sim

        return call

    def reset(self) -> None:
        self.cpu.clear()


@contextmanager
def sampler_on_bench_node() -> Iterator[tuple[Any, SimulatorClock, Stages]]:
    from agent.gpu import load_driver
    from agent.gpu.readings import NodeReader
    from agent.gpu.sim import SimControl
    from agent.telemetry.pods import PodResourcesClient, PodWatcher
    from agent.telemetry.procs import ContainerDirectory
    from agent.telemetry.readers import Sources, build_sampler
    from agent.telemetry.sampler import SamplerOptions
    from agent.telemetry.stats import TelemetryStats
    from agent.telemetry.xid import XidWatcher
    from dcgm.counters import load_counters

    with tempfile.TemporaryDirectory() as tmp:
        state, logs, socket = Path(tmp, "state"), Path(tmp, "logs"), Path(tmp, "kubelet.sock")
        state.mkdir()
        logs.mkdir()
        devices = build_node(state, logs)
        with kubelet(socket, devices):
            driver = load_driver(PRESET, state, latency=True)
            clock = SimulatorClock(driver.nvml.module)  # before the gateway wraps a function
            stages = Stages(clock)
            driver.open()
            stats, reader = TelemetryStats(), NodeReader(driver)
            pods = PodWatcher(PodResourcesClient(socket), socket, INTERVAL_S, stats)
            pods.refresh()  # its thread's work; a tick reads the answer it keeps
            xids = XidWatcher.for_reader(reader, stats)
            xids.start()
            options = SamplerOptions(
                interval_s=INTERVAL_S, hostname="bench", proc_root=SimControl(state).proc_root
            )
            sources = Sources(xids, pods, None, None, ContainerDirectory(logs))
            sampler = build_sampler(reader, load_counters(), stats, options, sources)
            try:
                for _ in range(3):  # past GPM's first windows
                    sampler.tick()
                    time.sleep(_GPM_WINDOW_S)
                yield sampler, clock, stages
            finally:
                sampler.stop()
                xids.stop()
                pods.stop()
                driver.close()


def measure(ticks: int, top: int) -> None:
    with sampler_on_bench_node() as (sampler, clock, stages):
        total = 0.0
        clock.cpu_s = 0.0
        stages.reset()
        for _ in range(ticks):
            time.sleep(_GPM_WINDOW_S)
            began = time.thread_time()
            sampler.tick()
            total += time.thread_time() - began
        simulator = clock.cpu_s
        by_stage = {k: list(v) for k, v in stages.cpu.items()}
        profiler = cProfile.Profile(time.thread_time)
        for _ in range(ticks):
            time.sleep(_GPM_WINDOW_S)
            profiler.enable()
            sampler.tick()
            profiler.disable()
    per = 1000 / ticks
    print(f"ticks: {ticks}, CPU of the sampler thread (ms per tick)")
    print(f"  total           {total * per:8.2f}")
    print(f"  simulator       {simulator * per:8.2f}")
    print(f"  agent's own     {(total - simulator) * per:8.2f}")
    print("\nper stage (ms per tick): total, simulator, agent's own")
    for stage, (cpu, sim) in by_stage.items():
        print(f"  {stage:<12} {cpu * per:8.2f} {sim * per:8.2f} {(cpu - sim) * per:8.2f}")
    rest = total - sum(cpu for cpu, _ in by_stage.values())
    print(f"  {'the rest':<12} {rest * per:8.2f}")
    print(f"\nthe agent's own functions by self CPU under cProfile (ms per tick), top {top}:")
    for tt, calls, name in agent_functions(pstats.Stats(profiler), top):
        print(f"  {tt * per:7.3f}  {calls / ticks:8.1f} calls  {name}")


def agent_functions(stats: pstats.Stats, top: int) -> list[tuple[float, int, str]]:
    """The agent's functions by self CPU; a builtin counts for the calls the agent made."""
    rows = []
    for (path, line, name), (_cc, calls, tt, _ct, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if path == "~":
            edges = [e for c, e in callers.items() if _agent(c[0])]
            calls, tt = sum(e[1] for e in edges), sum(e[2] for e in edges)
            label = name
        elif not _agent(path):
            continue
        else:
            label = f"{Path(path).name}:{line}({name})"
        rows.append((tt, calls, label))
    return sorted(rows, reverse=True)[:top]


@functools.cache
def _agent(path: str) -> bool:
    """Code of the agent (or of the libraries it calls): not the simulator, pynvml or this bench."""
    if path == "~":
        return False
    where = Path(path).resolve()
    return not (
        where.is_relative_to(_SIM) or where.name == "pynvml.py" or where == Path(__file__).resolve()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    measure(args.ticks, args.top)


if __name__ == "__main__":
    main()
