#!/usr/bin/env python3
"""Load on the agent's inventory RPC while a prewarm runs; prints a markdown table.

Starts a real agent (``gpu-agent --simulate dgx-h100 … serve``) and a local HTTP origin, starts
a throttled prewarm that lasts the whole run, then has ``--clients`` concurrent clients (each
with its own channel, spread over ``--procs`` processes) call ``NodeService.GetNode`` over
mTLS (or the Unix socket) for ``--duration`` seconds per row: one row per ``--rate`` (calls per
second per client; 0 = back to back, which measures saturation). Reports call latency
percentiles, errors and the agent's CPU and peak RSS, with the machine's load average.

    .venv/bin/python bench/api_load.py                 # 60 s at 2/s per client, 60 s back to back
    .venv/bin/python bench/api_load.py --duration 10 --rate 1 --transport unix
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import multiprocessing
import os
import shlex
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent._proto.gpuagent.v1 import (  # noqa: E402
    agent_pb2,
    agent_pb2_grpc,
    operations_pb2,
    operations_pb2_grpc,
    prewarm_pb2,
    prewarm_pb2_grpc,
)
from tests.unit.api.support import AgentProcess, Pki, agent_config  # noqa: E402

CHUNK = 64 * 1024


class SlowOrigin:
    """Serves one sparse file of zeros at a fixed rate, so a prewarm lasts as long as we like."""

    def __init__(self, size: int, rate_bps: int) -> None:
        self.size, self.rate = size, rate_bps
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(origin.size))
                self.end_headers()
                block, sent, start = bytes(CHUNK), 0, time.monotonic()
                try:
                    while sent < origin.size:
                        n = min(CHUNK, origin.size - sent)
                        self.wfile.write(block[:n])
                        sent += n
                        ahead = sent / origin.rate - (time.monotonic() - start)
                        if ahead > 0:
                            time.sleep(ahead)
                except (BrokenPipeError, ConnectionResetError):
                    return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/model.bin"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass(frozen=True)
class Target:
    address: str
    ca: bytes | None = None
    key: bytes | None = None
    cert: bytes | None = None

    def channel(self) -> grpc.aio.Channel:
        if self.ca is None:
            return grpc.aio.insecure_channel(self.address)
        creds = grpc.ssl_channel_credentials(self.ca, self.key, self.cert)
        return grpc.aio.secure_channel(self.address, creds)


async def _client(
    target: Target, until: float, rate: float, out: list[float], errors: list[str]
) -> None:
    async with target.channel() as channel:
        stub = agent_pb2_grpc.NodeServiceStub(channel)
        request = agent_pb2.GetNodeRequest()
        await stub.GetNode(request, timeout=10)  # connect (and handshake) outside the timing
        period = 1.0 / rate if rate > 0 else 0.0
        next_at = time.monotonic()
        while time.monotonic() < until:
            started = time.perf_counter()
            try:
                await stub.GetNode(request, timeout=5)
                out.append(time.perf_counter() - started)
            except grpc.RpcError as exc:
                errors.append(str(exc.code()))
            if period:
                next_at += period
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)


def _worker(
    target: Target,
    clients: int,
    start_at: float,
    duration: float,
    rate: float,
    queue: multiprocessing.Queue[object],
) -> None:
    async def main() -> tuple[list[float], list[str]]:
        latencies: list[float] = []
        errors: list[str] = []
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        until = time.monotonic() + duration

        # Stagger the clients over one period so their calls do not arrive in lockstep.
        async def staggered(i: int) -> None:
            if rate > 0:
                await asyncio.sleep(i / clients / rate)
            await _client(target, until, rate, latencies, errors)

        await asyncio.gather(*(staggered(i) for i in range(clients)))
        return latencies, errors

    queue.put(asyncio.run(main()))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


@dataclass(frozen=True)
class Row:
    rate: float
    latencies: list[float]
    errors: list[str]
    cpu: float  # cores
    peak_rss: int
    warmed: int  # prewarm bytes done by the end of the row
    prewarm_running: bool


def _load(args: argparse.Namespace, target: Target, rate: float, proc: psutil.Process) -> Row:
    """One row: the clients at ``rate`` for ``--duration`` seconds; agent CPU and RSS meanwhile."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    share = [
        args.clients // args.procs + (i < args.clients % args.procs) for i in range(args.procs)
    ]
    start_at = time.monotonic() + 3.0  # clients connect first
    workers = [
        ctx.Process(target=_worker, args=(target, n, start_at, args.duration, rate, queue))
        for n in share
    ]
    for w in workers:
        w.start()
    time.sleep(max(0.0, start_at - time.monotonic()))
    cpu_before, wall_before, peak_rss = proc.cpu_times(), time.monotonic(), 0
    while time.monotonic() < start_at + args.duration:
        peak_rss = max(peak_rss, proc.memory_info().rss)
        time.sleep(0.5)
    cpu_after, wall = proc.cpu_times(), time.monotonic() - wall_before
    results = [queue.get(timeout=args.duration + 60) for _ in workers]
    for w in workers:
        w.join(30)
    used = cpu_after.user + cpu_after.system - cpu_before.user - cpu_before.system
    return Row(
        rate,
        [x for lat, _ in results for x in lat],
        [e for _, errs in results for e in errs],
        used / wall,
        peak_rss,
        0,
        True,
    )


def run(args: argparse.Namespace) -> list[Row]:
    shm = Path("/dev/shm")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        root = Path(tmp)
        pki = Pki(root / "pki")
        seconds = (args.duration + 10) * len(args.rate) + 30
        origin = SlowOrigin(int(args.prewarm_rate * seconds), int(args.prewarm_rate))
        agent = AgentProcess(root, agent_config(root, pki)).start()
        try:
            if args.transport == "mtls":
                target = Target(
                    f"localhost:{agent.tcp_port}",
                    pki.ca.read_bytes(),
                    pki.coordinator.key.read_bytes(),
                    pki.coordinator.cert.read_bytes(),
                )
            else:
                target = Target(f"unix:{agent.socket}")
            assert agent.proc is not None
            proc = psutil.Process(agent.proc.pid)
            with grpc.insecure_channel(f"unix:{agent.socket}") as control:
                warm = prewarm_pb2.FileTarget(url=origin.url, name="bench-model")
                op = (
                    prewarm_pb2_grpc.PrewarmServiceStub(control)
                    .SubmitPrewarm(
                        prewarm_pb2.SubmitPrewarmRequest(
                            targets=[prewarm_pb2.PrewarmTarget(file=warm)]
                        ),
                        timeout=10,
                    )
                    .operation
                )
                ops = operations_pb2_grpc.OperationsServiceStub(control)
                for rate in args.rate:
                    row = _load(args, target, rate, proc)
                    state = ops.GetOperation(
                        operations_pb2.GetOperationRequest(name=op.name), timeout=10
                    ).operation
                    items = state.metadata.prewarm.items
                    rows.append(
                        dataclasses.replace(
                            row,
                            warmed=items[0].done_bytes if items else 0,
                            prewarm_running=not state.done,
                        )
                    )
        finally:
            agent.stop()
            origin.close()
    return rows


COLUMNS = (
    "transport", "clients", "calls per client", "duration", "calls", "throughput", "p50", "p99",
    "max", "errors", "agent CPU", "agent peak RSS", "prewarm (MiB done, running)",
)  # fmt: skip


def table(args: argparse.Namespace, rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lat = row.latencies
        values = (
            args.transport,
            args.clients,
            f"{row.rate:g}/s" if row.rate > 0 else "back to back",
            f"{args.duration:g} s",
            len(lat),
            f"{len(lat) / args.duration:.0f}/s",
            f"{percentile(lat, 50) * 1e3:.2f} ms",
            f"{percentile(lat, 99) * 1e3:.2f} ms",
            f"{max(lat) * 1e3:.1f} ms",
            len(row.errors),
            f"{row.cpu * 100:.0f}% of a core",
            f"{row.peak_rss / 2**20:.0f} MiB",
            f"{row.warmed / 2**20:.0f}, {'yes' if row.prewarm_running else 'no'}",
        )
        lines.append("| " + " | ".join(str(v) for v in values) + " |")
    command = " ".join(["python bench/api_load.py", *(shlex.quote(a) for a in sys.argv[1:])])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    machine = (
        f"{os.cpu_count()} CPUs; load average {load} at the end (other work on the machine "
        f"counts); prewarm origin throttled to {args.prewarm_rate / 2**20:g} MiB/s"
    )
    return "\n".join(["`" + command + "`", "", machine, "", *lines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument(
        "--rate",
        type=float,
        action="append",
        help="calls/s per client, one table row each; 0 = back to back (default: 2 and 0)",
    )
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--transport", choices=("mtls", "unix"), default="mtls")
    parser.add_argument("--prewarm-rate", type=float, default=8 * 2**20, help="origin bytes/s")
    args = parser.parse_args()
    args.rate = args.rate or [2.0, 0.0]
    print(table(args, run(args)))


if __name__ == "__main__":
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    main()
