"""Scrape cost of gpu-agent's /metrics next to nvitop-exporter's, on the same simulated node.

The node: a simulated DGX H100 (8 GPUs) cut into 56 ``1g.10gb`` MIG instances, each running one
process of its own pod, attributed through a fake kubelet PodResources server; the simulator's
modelled NVML latencies are on (0.09 ms per call, 20 ms per PCIe-throughput read, ...). Each
exporter runs in its own process against that node, one after the other so they do not compete
for CPU, both collecting every second. nvitop-exporter sees the simulator as ``pynvml``.

Measured per exporter, with Prometheus' own Accept header and, as Prometheus sends unless a
scrape config turns compression off, ``Accept-Encoding: gzip`` (``--identity``: without it):
* scrape latency p50 / p99 (client side, full body), at a steady rate and in bursts of
  ``--burst`` concurrent scrapes;
* CPU per scrape: process CPU over ``--cpu-seconds`` of back-to-back scrapes, less the
  collection CPU of that span;
* collection CPU: process CPU per second without scrapes;
* steady RSS after the run;
* staleness: seconds from a change on the node (a process's GPU memory on one MIG instance), made
  at a random phase, until a scrape shows it;
* the floor: the same client at the same rate against a server that does nothing
  (``scrape_targets.run_floor``), the latency no exporter can go under on this machine;
* filesystem syscalls per scrape (gpu-agent, when ``strace`` is installed): ``strace -c -e
  trace=%file,fstatfs`` attached to the thread that serves scrapes (the event loop, the main
  thread) over 100 scrapes.

Usage (from the repository root):  .venv/bin/python -m bench.telemetry_scrape [--scrapes N]
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil

from agent._proto.k8s.podresources.v1 import api_pb2, api_pb2_grpc
from bench.scrape_targets import INTERVAL_S, PRESET

_FRESH_MIB = itertools.count(2000)
PROFILE = "1g.10gb"
#: the floor server's body: about gpu-agent's gzipped /metrics on this node (10.7 kB)
FLOOR_BODY_BYTES = 11_000
INSTANCES_PER_GPU = 7
MIB = 1024 * 1024
#: what Prometheus 2.x sends: OpenMetrics preferred, classic text accepted
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


# -- the simulated node -------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    gpu: int
    gpu_instance: int
    mig_uuid: str
    pid: int
    pod: str


def build_node(state_dir: Path, log_dir: Path) -> list[Device]:
    """56 MIG instances with one pod process each; returns them in creation order."""
    from agent.gpu import open_driver
    from agent.gpu.sim import SimControl

    driver = open_driver(PRESET, state_dir)
    control = SimControl(state_dir)
    devices: list[Device] = []
    try:
        for gpu in driver.gpus():
            driver.set_mig_mode(gpu.uuid, True)
            spec = next(p for p in driver.gi_profiles(gpu.uuid) if p.name == PROFILE)
            for slot in range(INSTANCES_PER_GPU):
                gi = driver.create_gpu_instance(gpu.uuid, spec.id, spec.placements[slot])
                ci_profile = max(driver.ci_profiles(gpu.uuid, gi.id), key=lambda c: c.slice_count)
                ci = driver.create_compute_instance(gpu.uuid, gi.id, ci_profile.id)
                n = len(devices) + 1
                control.set_workload(
                    gpu.index, gpu_instance=gi.id, sm_active=0.6, tensor_active=0.4, dram_active=0.3
                )
                control.start_process(
                    10_000 + n,
                    gpu.index,
                    used_memory_mib=1000,
                    gpu_instance=gi.id,
                    compute_instance=ci.id,
                    cgroup=f"0::/kubepods.slice/kubepods-pod{n:032x}.slice/cri-containerd-{n:064x}.scope",
                )
                (log_dir / f"pod-{n}_bench_main-{n:064x}.log").touch()
                devices.append(Device(gpu.index, gi.id, ci.uuid or "", 10_000 + n, f"pod-{n}"))
            control.set_workload(gpu.index, pcie_tx_bytes_per_s=2e9, pcie_rx_bytes_per_s=1e9)
    finally:
        driver.close()
    return devices


class _Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, devices: list[Device]) -> None:
        self._response = api_pb2.ListPodResourcesResponse()
        for d in devices:
            pod = self._response.pod_resources.add(name=d.pod, namespace="bench")
            container = pod.containers.add(name="main")
            container.devices.add(
                resource_name=f"nvidia.com/mig-{PROFILE}", device_ids=[d.mig_uuid]
            )

    def List(self, request: object, context: object) -> api_pb2.ListPodResourcesResponse:
        return self._response


@contextmanager
def kubelet(socket: Path, devices: list[Device]) -> Iterator[None]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Kubelet(devices), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield
    finally:
        server.stop(grace=None).wait()


# -- measuring -----------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    latencies_ms: list[float]
    cpu_per_scrape_s: float
    collection_cpu_per_s: float
    rss_mb: float
    staleness_s: list[float]
    probes: int
    burst_ms: list[float]
    file_syscalls: int | None
    body_kb: float
    samples: int


#: ask for gzip, as Prometheus does unless a scrape config sets enable_compression: false
#: (``--identity`` turns it off)
ACCEPT_GZIP = [True]


def scrape(port: int, timeout_s: float = 30) -> tuple[float, str]:
    """(milliseconds until the whole body is in, the body): the time ends when the last byte
    arrives; a gzipped body is inflated after it, as it is not the exporter's work."""
    headers = {"Accept": PROMETHEUS_ACCEPT}
    if ACCEPT_GZIP[0]:
        headers["Accept-Encoding"] = "gzip"
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        raw = response.read()
        gzipped = response.headers.get("Content-Encoding") == "gzip"
    elapsed = (time.perf_counter() - started) * 1000
    return elapsed, (gzip.decompress(raw) if gzipped else raw).decode()


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def wait_ready(port: int, ready: Callable[[str], bool], deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            if ready(scrape(port)[1]):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"exporter on port {port} did not become ready")


def memory_value(body: str, metric: str, selector: str) -> float | None:
    for line in body.splitlines():
        if line.startswith(metric + "{") and selector in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def measure(
    name: str,
    command: list[str],
    port: int,
    ready: Callable[[str], bool],
    memory: Callable[[str, Device], float | None],
    devices: list[Device],
    state_dir: Path,
    args: argparse.Namespace,
) -> Result:
    from agent.gpu.sim import SimControl

    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        process = psutil.Process(child.pid)
        wait_ready(port, ready)
        time.sleep(args.warmup)
        # Collection alone: CPU over a quiet span.
        before = cpu_seconds(process)
        quiet = args.scrapes / args.rate
        time.sleep(quiet)
        collection = (cpu_seconds(process) - before) / quiet
        latencies, body = steady_latencies(port, args.scrapes, args.rate)
        # CPU: back-to-back scrapes for whole seconds, less what collection costs over the same
        # span. A span of many ticks: one tick's CPU landing in a short span would be counted
        # as the scrapes' (and the process CPU clock ticks at 10 ms).
        before, started, count = cpu_seconds(process), time.monotonic(), 0
        while count < 1 or time.monotonic() - started < args.cpu_seconds:
            scrape(port)
            count += 1
        span = time.monotonic() - started
        cpu_per_scrape = (cpu_seconds(process) - before - collection * span) / count
        bursts = concurrent_bursts(port, args.burst, args.bursts)
        syscalls = file_syscalls(child.pid, port) if name == "gpu-agent" else None
        # Staleness: change a process's memory, poll until the exporter shows it.
        control = SimControl(state_dir)
        staleness = []
        phase = random.Random(7)
        for k in range(args.changes):
            # A random phase: a change right after a detection would always land just after a
            # collection and measure a whole interval.
            time.sleep(phase.uniform(0.0, INTERVAL_S))
            device = devices[(k * 13) % len(devices)]
            new_mib = next(_FRESH_MIB)  # never a value an earlier run left on the node
            control.stop_process(device.pid)
            control.start_process(
                device.pid,
                device.gpu,
                used_memory_mib=new_mib,
                gpu_instance=device.gpu_instance,
                compute_instance=0,
            )
            changed = time.monotonic()
            while time.monotonic() - changed < 10:
                if memory(scrape(port)[1], device) == new_mib:
                    staleness.append(time.monotonic() - changed)
                    break
                time.sleep(0.02)
        rss = process.memory_info().rss / 1e6
        samples = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
        return Result(
            name,
            latencies,
            cpu_per_scrape,
            collection,
            rss,
            staleness,
            args.changes,
            bursts,
            syscalls,
            len(body) / 1e3,
            samples,
        )
    finally:
        child.terminate()
        child.wait(timeout=30)


def steady_latencies(port: int, scrapes: int, rate: float) -> tuple[list[float], str]:
    """Latencies of ``scrapes`` scrapes at a steady ``rate`` per second, as a scraper sends
    them, and the last body."""
    latencies, body = [], ""
    started = time.monotonic()
    for i in range(scrapes):
        time.sleep(max(0.0, started + i / rate - time.monotonic()))
        ms, body = scrape(port)
        latencies.append(ms)
    return latencies, body


def floor_latencies(target: list[str], port: int, args: argparse.Namespace) -> list[float]:
    """Steady-rate latencies of a server that does nothing (``scrape_targets.run_floor``) with a
    body the size of gpu-agent's gzipped one: the part of any exporter's latency that is this
    machine's and this client's."""
    child = subprocess.Popen([*target, "floor", str(FLOOR_BODY_BYTES), str(port)])
    try:
        wait_ready(port, lambda body: True)
        return steady_latencies(port, args.scrapes, args.rate)[0]
    finally:
        child.terminate()
        child.wait(timeout=30)


def concurrent_bursts(port: int, size: int, bursts: int) -> list[float]:
    """Latencies of ``bursts`` bursts of ``size`` scrapes sent at once, a second apart."""
    latencies: list[float] = []
    with futures.ThreadPoolExecutor(size) as pool:
        for _ in range(bursts):
            gate = threading.Barrier(size)

            def one(gate: threading.Barrier = gate) -> float:
                gate.wait()
                started = time.perf_counter()
                try:
                    return scrape(port, timeout_s=60)[0]
                except OSError:  # counted at its time so far: a lower bound
                    return (time.perf_counter() - started) * 1000

            latencies += [f.result() for f in [pool.submit(one) for _ in range(size)]]
            time.sleep(1.0)
    return latencies


def file_syscalls(pid: int, port: int, scrapes: int = 100) -> int | None:
    """Filesystem syscalls the scrape-serving thread (``pid``'s main thread) makes over
    ``scrapes`` scrapes; None without strace."""
    if shutil.which("strace") is None:
        return None
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        tracer = subprocess.Popen(
            ["strace", "-c", "-e", "trace=%file,fstatfs", "-p", str(pid), "-o", out.name],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attached
        for _ in range(scrapes):
            scrape(port)
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=30)
        totals = [line.split() for line in out.read().splitlines() if line.endswith("total")]
    return int(totals[0][2]) if totals and len(totals[0]) >= 4 else 0


def table(results: list[Result]) -> str:
    def q(values: list[float], p: int) -> float:
        return statistics.quantiles(values, n=100, method="inclusive")[p - 1]

    rows = [
        ("scrape latency p50 (ms)", lambda r: f"{q(r.latencies_ms, 50):.2f}"),
        ("scrape latency p99 (ms)", lambda r: f"{q(r.latencies_ms, 99):.2f}"),
        ("burst latency p50 (ms)", lambda r: f"{q(r.burst_ms, 50):.2f}"),
        ("burst latency p99 (ms)", lambda r: f"{q(r.burst_ms, 99):.2f}"),
        ("CPU per scrape (ms)", lambda r: f"{r.cpu_per_scrape_s * 1000:.2f}"),
        ("collection CPU (s per s)", lambda r: f"{r.collection_cpu_per_s:.3f}"),
        ("steady RSS (MB)", lambda r: f"{r.rss_mb:.1f}"),
        (
            "staleness mean / max (s), seen",
            lambda r: (
                (
                    f"{statistics.mean(r.staleness_s):.2f} / {max(r.staleness_s):.2f}, "
                    if r.staleness_s
                    else "n/a, "
                )
                + f"{len(r.staleness_s)}/{r.probes}"
            ),
        ),
        (
            "filesystem syscalls per 100 scrapes (strace)",
            lambda r: "n/a" if r.file_syscalls is None else str(r.file_syscalls),
        ),
        ("samples per scrape", lambda r: str(r.samples)),
        ("body (kB)", lambda r: f"{r.body_kb:.0f}"),
    ]
    head = "| | " + " | ".join(r.name for r in results) + " |"
    lines = [head, "|---" * (len(results) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(cell(r) for r in results) + " |" for label, cell in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=120, help="scrapes per exporter")
    parser.add_argument("--rate", type=float, default=4.0, help="scrapes per second")
    parser.add_argument("--burst", type=int, default=50, help="concurrent scrapes in a burst")
    parser.add_argument("--bursts", type=int, default=4, help="bursts of concurrent scrapes")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring")
    parser.add_argument("--changes", type=int, default=8, help="staleness probes")
    parser.add_argument(
        "--cpu-seconds", type=float, default=10.0, help="back-to-back scrapes for CPU, seconds"
    )
    parser.add_argument(
        "--identity", action="store_true", help="scrape without Accept-Encoding: gzip"
    )
    args = parser.parse_args()
    ACCEPT_GZIP[0] = not args.identity
    with tempfile.TemporaryDirectory(prefix="gpu-agent-bench-") as tmp:
        root = Path(tmp)
        state, logs, socket = root / "state", root / "containers", root / "kubelet.sock"
        logs.mkdir()
        devices = build_node(state, logs)
        target = [sys.executable, "-m", "bench.scrape_targets"]
        with kubelet(socket, devices):
            agent = measure(
                "gpu-agent",
                [*target, "gpu-agent", str(state), "19400", str(socket), str(logs)],
                19400,
                lambda body: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{" in body,
                _our_memory,
                devices,
                state,
                args,
            )
            nvitop = measure(
                "nvitop-exporter",
                [*target, "nvitop-exporter", str(state), "19500"],
                19500,
                lambda body: "gpu_memory_used_MiB{" in body,
                lambda body, d: memory_value(body, "gpu_memory_used_MiB", f'uuid="{d.mig_uuid}"'),
                devices,
                state,
                args,
            )
        floor = floor_latencies(target, 19600, args)
    n = len(devices)
    print(f"Simulated {PRESET}: 8 GPUs, {n} MIG instances ({PROFILE}), {n} pods;")
    print(f"modelled NVML latencies on; {args.scrapes} scrapes at {args.rate:g}/s; interval 1 s;")
    encoding = "identity" if args.identity else "gzip, as Prometheus sends"
    print(f"Accept-Encoding: {encoding}\n")
    print(table([agent, nvitop]))
    p50, p99 = (statistics.quantiles(floor, n=100, method="inclusive")[p - 1] for p in (50, 99))
    print(
        f"\nFloor (a server that does nothing, {FLOOR_BODY_BYTES} bytes, same client and rate):"
        f" p50 {p50:.2f} ms, p99 {p99:.2f} ms"
    )
    command = (
        f"--scrapes {args.scrapes} --rate {args.rate:g} --burst {args.burst} "
        f"--bursts {args.bursts} --changes {args.changes} --cpu-seconds {args.cpu_seconds:g}"
    ) + (" --identity" if args.identity else "")
    print(f"\nCommand: .venv/bin/python -m bench.telemetry_scrape {command}")


def _our_memory(body: str, device: Device) -> float | None:
    for line in body.splitlines():
        if (
            line.startswith("DCGM_FI_DEV_FB_USED{")
            and f'GPU_I_ID="{device.gpu_instance}"' in line
            and f'gpu="{device.gpu}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return None


if __name__ == "__main__":
    main()
