#!/usr/bin/env python3
"""Hostile and careless callers against a real agent process; prints a markdown report.

Starts ``gpu-agent --simulate dgx-h100 --state-dir D --config C serve`` on a temp state dir (its
Unix socket; prewarm origins limited to 127.0.0.1, where a local origin serves every path) and
sends ``--requests`` requests, cycling over every RPC of the API:

* generated: any field of the request message with edge values (ints at their type's limits,
  unknown enum numbers, oneofs, maps, nested messages), and for YAML fields the attacker's
  corpus: billion laughs of every size, deep nesting, non-scalar keys, huge integers and strings,
  alias cycles, merge bombs, duplicate keys, unknown tags, and valid MIG and sharing configs with
  one value swapped for a hostile one (replicas past uint32, MPS past 48 clients, ...);
* mutated: a generated request's bytes flipped, cut, spliced or padded, and random bytes;
* conflicting: pairs of ApplyMig sent at the same instant (``--pairs``);
* first of all, once each, the requests issue 16 reported (`issue_attacks`).

It reports status codes per RPC, the INTERNAL and UNKNOWN answers (goal 0), refused mutating
calls that changed the node (goal 0: GPU state file, plugin files, operations and prewarm items,
compared before and after each refused call), pairs of conflicting applies both accepted (goal 0),
the agent's peak RSS (goal <= 256 MiB; VmHWM, with psutil sampling as a cross-check) and whether
it still serves afterwards.

    .venv/bin/python bench/fuzz_rpc.py                      # 10,080 requests, seed 16
    .venv/bin/python bench/fuzz_rpc.py --requests 300 --seed 1 --pairs 4
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import psutil
from google.protobuf.descriptor import MethodDescriptor

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent._proto.gpuagent.v1 import (  # noqa: E402
    agent_pb2,
    agent_pb2_grpc,
    mig_pb2,
    mig_pb2_grpc,
    operations_pb2,
    operations_pb2_grpc,
    prewarm_pb2,
    prewarm_pb2_grpc,
    sharing_pb2,
    sharing_pb2_grpc,
)
from agent.api.server import _MODULES  # noqa: E402
from bench.fuzz_corpus import (  # noqa: E402
    Generator,
    issue_attacks,
)
from tests.unit.api.support import AgentProcess, agent_config  # noqa: E402

_P = "/gpuagent.v1."
MUTATING = frozenset(
    _P + m
    for m in (
        "OperationsService/CancelOperation",
        "MigService/ApplyMig",
        "SharingService/SetSharing",
        "SharingService/ClearSharing",
        "SharingService/RollbackSharing",
        "PrewarmService/SubmitPrewarm",
        "PrewarmService/CancelPrewarmItem",
        "PrewarmService/EvictCacheItem",
    )
)
#: Answers a caller can act on. INTERNAL and UNKNOWN are bugs; the rest are deliberate.
BUGS = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
CALL_TIMEOUT_S = 10.0
STREAM_TIMEOUT_S = 0.05  # watches run until cancelled: cut them short
RSS_GOAL = 256 * 1024 * 1024


def api_methods() -> list[MethodDescriptor]:
    return [
        method
        for module in _MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


def path_of(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


# -- the node, observed ------------------------------------------------------------------------


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class NodeState:
    gpus: str | None
    plugin: tuple[str | None, ...]
    operations: frozenset[str]
    items: frozenset[str]
    applying: bool

    def changes(self, after: NodeState) -> list[str]:
        """What a refused call changed; GPUs only when no accepted apply was running."""
        out = []
        if after.plugin != self.plugin:
            out.append("plugin files")
        if after.operations - self.operations:
            out.append("operations")
        if after.items - self.items:
            out.append("prewarm items")
        if not (self.applying or after.applying) and after.gpus != self.gpus:
            out.append("GPUs")
        return out


class Observer:
    def __init__(self, agent: AgentProcess, channel: grpc.Channel, plugin: Path) -> None:
        self.sim = agent.state_dir / "sim" / "state.json"
        self.plugin = [plugin, plugin.with_name(plugin.name + ".previous")]
        self.ops = operations_pb2_grpc.OperationsServiceStub(channel)
        self.prewarm = prewarm_pb2_grpc.PrewarmServiceStub(channel)

    def state(self, names: list[str] | None = None) -> NodeState:
        """The node now; ``names`` collects operation names and item ids for later requests."""
        listed = self.ops.ListOperations(
            operations_pb2.ListOperationsRequest(page_size=1000), timeout=CALL_TIMEOUT_S
        ).operations
        items = self.prewarm.ListPrewarmItems(
            prewarm_pb2.ListPrewarmItemsRequest(), timeout=CALL_TIMEOUT_S
        ).items
        if names is not None:
            for known in [op.name for op in listed[:3]] + [i.id for i in items[:3]]:
                if known not in names:
                    names.append(known)
            del names[:-40]  # the newest are the ones that may still be running
        return NodeState(
            gpus=_digest(self.sim),
            plugin=tuple(_digest(p) for p in self.plugin),
            operations=frozenset(op.name for op in listed),
            items=frozenset(i.id for i in items),
            applying=any(op.kind == "mig.apply" and not op.done for op in listed),
        )


class PeakRss:
    """The agent's peak RSS: the kernel's high-water mark, and psutil samples as a check."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.sampled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.sampled = max(self.sampled, self.proc.memory_info().rss)
            except psutil.Error:
                return

    def hwm(self) -> int | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None

    def peak(self) -> int:
        return max(self.hwm() or 0, self.sampled)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class Origin:
    """Serves every path at once (its own bytes), so accepted prewarms finish."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return

            def do_GET(self) -> None:
                body = self.path.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class Report:
    requests: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    by_method: dict[str, Counter[str]] = field(default_factory=dict)
    by_origin: Counter[str] = field(default_factory=Counter)
    bugs: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    slow: list[str] = field(default_factory=list)
    pairs: int = 0
    pairs_both_accepted: int = 0
    stuck: list[str] = field(default_factory=list)
    peak_rss: int = 0
    sampled_rss: int = 0
    still_serves: bool = False
    seconds: float = 0.0

    @property
    def internal(self) -> int:
        return self.codes["INTERNAL"] + self.codes["UNKNOWN"]


def call(channel: grpc.Channel, method: MethodDescriptor, payload: bytes) -> grpc.StatusCode:
    path = path_of(method)
    try:
        if method.server_streaming:
            for _ in channel.unary_stream(path, None, None)(payload, timeout=STREAM_TIMEOUT_S):
                pass
        else:
            channel.unary_unary(path, None, None)(payload, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def conflicting_pair(channel: grpc.Channel, i: int, report: Report) -> None:
    """Two different applies at the same instant: at most one may be accepted."""
    mig = mig_pb2_grpc.MigServiceStub(channel)
    layouts = ["{1g.10gb: 7}", "{3g.40gb: 2}", "{2g.20gb: 3}", "{7g.80gb: 1}"]
    configs = [
        f"version: v1\nmig-configs:\n  c:\n  - devices: [{i % 8}]\n    mig-enabled: true\n"
        f"    mig-devices: {layouts[(i + k) % 4]}\n"
        for k in (0, 1)
    ]
    barrier = threading.Barrier(2)
    answers: list[Any] = [None, None]

    def send(k: int) -> None:
        barrier.wait(10)
        try:
            answers[k] = mig.ApplyMig(
                mig_pb2.ApplyMigRequest(config_yaml=configs[k]), timeout=CALL_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            answers[k] = exc.code()

    threads = [threading.Thread(target=send, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    accepted = [a for a in answers if isinstance(a, mig_pb2.ApplyMigResponse)]
    report.pairs += 1
    report.pairs_both_accepted += len(accepted) == 2
    for a in answers:
        code = "OK" if isinstance(a, mig_pb2.ApplyMigResponse) else a.name
        report.codes[code] += 1
        report.by_method.setdefault("ApplyMig (pairs)", Counter())[code] += 1
        if isinstance(a, grpc.StatusCode) and a in BUGS:
            report.bugs.append(f"ApplyMig pair {i}: {code}")
    ops = operations_pb2_grpc.OperationsServiceStub(channel)
    for a in accepted:
        ops.WaitOperation(operations_pb2.WaitOperationRequest(name=a.operation.name), timeout=60)


def settle(channel: grpc.Channel, timeout_s: float = 120.0) -> list[str]:
    """Wait for the applies the generated requests started, so the pairs race each other and
    not a leftover; returns those still running after ``timeout_s`` (each should end)."""
    ops = operations_pb2_grpc.OperationsServiceStub(channel)
    running = ops.ListOperations(
        operations_pb2.ListOperationsRequest(kind="mig.apply", done=False, page_size=1000),
        timeout=CALL_TIMEOUT_S,
    ).operations
    deadline = time.monotonic() + timeout_s
    stuck = []
    for op in running:
        left = max(deadline - time.monotonic(), 1.0)
        done = ops.WaitOperation(
            operations_pb2.WaitOperationRequest(name=op.name), timeout=left + 5
        ).operation
        if not done.done:
            progress = done.metadata.mig_apply
            stuck.append(f"{op.name}: {progress.phase} {progress.current_step}")
    return stuck


def still_serves(channel: grpc.Channel) -> bool:
    node = agent_pb2_grpc.NodeServiceStub(channel).GetNode(agent_pb2.GetNodeRequest(), timeout=30)
    sharing_pb2_grpc.SharingServiceStub(channel).GetSharing(
        sharing_pb2.GetSharingRequest(), timeout=30
    )
    return len(node.node.gpus) == 8


def run(
    requests: int, seed: int, pairs: int, root: Path, progress: Callable[[int], None] | None = None
) -> Report:
    rng = random.Random(seed)
    origin = Origin()
    config = agent_config(root)
    agent = AgentProcess(root, config).start()
    report = Report()
    started = time.monotonic()
    try:
        assert agent.proc is not None
        rss = PeakRss(agent.proc.pid)
        plugin = root / "plugin" / "config.yaml"
        with grpc.insecure_channel(f"unix:{agent.socket}") as channel:
            observer = Observer(agent, channel, plugin)
            gen = Generator(rng, origin.url)
            methods = api_methods()
            by_name = {m.name: m for m in methods}
            fixed = [(by_name[name], "attack", data) for name, data in issue_attacks()]
            for i in range(requests):
                if i < len(fixed):
                    method, how, payload = fixed[i]
                else:
                    method = methods[i % len(methods)]
                    how, payload = gen.payload(method)
                path = path_of(method)
                mutating = path in MUTATING
                before = observer.state(gen.names) if mutating else None
                t0 = time.monotonic()
                code = call(channel, method, payload)
                spent = time.monotonic() - t0
                report.requests += 1
                report.codes[code.name] += 1
                report.by_origin[f"{how} {code.name}"] += 1
                report.by_method.setdefault(method.name, Counter())[code.name] += 1
                if code in BUGS:
                    report.bugs.append(f"{method.name} ({how}): {code.name} for {payload[:80]!r}")
                if not method.server_streaming and spent > CALL_TIMEOUT_S / 2:
                    report.slow.append(f"{method.name} ({how}): {spent:.1f}s")
                if before is not None and code is not grpc.StatusCode.OK:
                    changed = before.changes(observer.state())
                    if changed:
                        report.changed.append(
                            f"{method.name} ({how}) {code.name} changed {', '.join(changed)}"
                        )
                if progress is not None and (i + 1) % 500 == 0:
                    progress(i + 1)
            report.stuck = settle(channel)
            for i in range(pairs):
                conflicting_pair(channel, i, report)
            report.still_serves = still_serves(channel)
        rss.stop()
        report.peak_rss, report.sampled_rss = rss.peak(), rss.sampled
    finally:
        report.seconds = time.monotonic() - started
        agent.stop()
        origin.close()
    return report


def markdown(report: Report, args: argparse.Namespace) -> str:
    mib = 1024 * 1024
    load = os.getloadavg()[0]
    lines = [
        f"{report.requests} requests over {len(report.by_method) - (report.pairs > 0)} RPCs "
        f"(seed {args.seed}) and {report.pairs} conflicting ApplyMig pairs in "
        f"{report.seconds:.0f} s, load average {load:.1f}",
        "",
        "| goal | result |",
        "|---|---|",
        f"| INTERNAL / UNKNOWN answers: 0 | {report.internal} |",
        f"| refused calls that changed the node: 0 | {len(report.changed)} |",
        f"| conflicting applies both accepted: 0 | {report.pairs_both_accepted} |",
        f"| agent peak RSS <= 256 MiB | {report.peak_rss / mib:.0f} MiB "
        f"(psutil samples {report.sampled_rss / mib:.0f} MiB) |",
        f"| still serves afterwards | {'yes' if report.still_serves else 'NO'} |",
        f"| calls slower than {CALL_TIMEOUT_S / 2:.0f} s | {len(report.slow)} |",
        f"| applies still running 120 s after the last request | {len(report.stuck)} |",
        "",
        "| status | count |",
        "|---|---|",
        *(f"| {code} | {n} |" for code, n in report.codes.most_common()),
        "",
        "| RPC | answers |",
        "|---|---|",
        *(
            f"| {name} | {', '.join(f'{c} {n}' for c, n in counts.most_common())} |"
            for name, counts in sorted(report.by_method.items())
        ),
    ]
    for title, entries in (
        ("bugs", report.bugs),
        ("changed", report.changed),
        ("slow", report.slow),
        ("stuck", report.stuck),
    ):
        if entries:
            lines += ["", f"{title}:", *(f"- {e}" for e in entries[:20])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_080)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=40, help="conflicting ApplyMig pairs")
    args = parser.parse_args()
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        report = run(
            args.requests,
            args.seed,
            args.pairs,
            Path(tmp),
            progress=lambda n: print(f"{n} requests", file=sys.stderr, flush=True),
        )
    print(markdown(report, args))
    ok = (
        report.internal == 0
        and not report.changed
        and report.pairs_both_accepted == 0
        and report.peak_rss <= RSS_GOAL
        and report.still_serves
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
