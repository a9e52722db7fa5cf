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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import psutil
import yaml
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

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

# -- the attacker's corpus -------------------------------------------------------------------------

MIG_DOC: dict[str, Any] = {
    "version": "v1",
    "mig-configs": {
        "balanced": [
            {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 2, "3g.40gb": 1}}
        ],
        "off": [{"devices": [0, 1], "mig-enabled": False}],
    },
}
SHARING_DOC: dict[str, Any] = {
    "version": "v1",
    "flags": {"migStrategy": "none", "plugin": {"deviceIDStrategy": "uuid"}},
    "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
    "imex": {"channelIDs": [0]},
}
HOSTILE_VALUES: list[Any] = [
    -1,
    0,
    49,
    2**29,
    2**31,
    2**32,
    2**63,
    -(2**63),
    1e308,
    float("nan"),
    True,
    None,
    "",
    "x" * 70,
    [1, [2, [3]]],
    {"a": {"b": {"c": 1}}},
    "serial",
    [1],
    "mixed",
]


def billion_laughs(levels: int, fan_out: int) -> str:
    lines = ["l0: &l0 [" + ", ".join(["lol"] * fan_out) + "]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * fan_out) + "]")
    return "\n".join(lines) + "\n"


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def mutate_doc(rng: random.Random, doc: dict[str, Any]) -> str:
    """A valid document with one value replaced, a key removed or an unknown key added."""
    copy = yaml.safe_load(yaml.safe_dump(doc))
    path = rng.choice([p for p in _paths(copy) if p])
    parent = copy
    for step in path[:-1]:
        parent = parent[step]
    choice = rng.random()
    if choice < 0.7:
        parent[path[-1]] = rng.choice(HOSTILE_VALUES)
    elif choice < 0.85 and isinstance(parent, dict):
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[rng.choice(["renameByDefault", "replica", "unknown", "channelIDs"])] = True
    return yaml.safe_dump(copy)


def hostile_yaml(rng: random.Random) -> str:
    kind = rng.randrange(14)
    if kind == 0:
        levels = rng.randint(3, 12)
        laughs = billion_laughs(levels, rng.randint(2, 20))
        # Bare, or as the value of fields that a careless error message would print whole.
        target = rng.choice(["", "version", "mig-configs", "sharing", "flags", "imex"])
        return laughs + (f"{target}: *l{levels - 1}\n" if target else "")
    if kind == 1:
        depth = rng.choice([33, 100, 1000, 100_000])
        return rng.choice(["[", "{a: "]) * depth + rng.choice(["]", "}"]) * depth
    if kind == 2:
        return "".join(f"{'  ' * i}k{i}:\n" for i in range(rng.choice([33, 200, 400])))
    if kind == 3:
        return rng.choice(["? [a, b]\n: 1\n", "{[1]: 2}", "? {a: 1}\n: x\n", "k: &k v\n*k : 1\n"])
    if kind == 4:
        digits = "9" * rng.choice([21, 70, 5000, 50_000])
        where = rng.choice(["x: {}", "version: v1\nmig-configs: {{a: [{{devices: [{}]}}]}}"])
        return where.format(digits)
    if kind == 5:
        return "name: " + "A" * rng.choice([16_385, 200_000, 1_000_000, 1_100_000])
    if kind == 6:
        return rng.choice(["&a [*a]", "a: &a {b: *a}", "&a {x: [*a, *a]}"])
    if kind == 7:  # merges of merges: each level doubles
        lines = ["m0: &m0 {a: 1, b: 2}"]
        for i in range(1, rng.randint(3, 30)):
            lines.append(f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: 1}}")
        return "\n".join(lines)
    if kind == 8:
        return "a: 1\na: 2\n"
    if kind == 9:
        return rng.choice(["!!python/object/apply:os.system ['true']", "!!binary AAAA", "a: ["])
    if kind == 10:
        return "x: " + rng.choice(["1" + ":0" * 30, "0x" + "f" * 40, "0b" + "1" * 80, "1e99999"])
    if kind == 11:
        return mutate_doc(rng, MIG_DOC)
    if kind == 12:
        return mutate_doc(rng, SHARING_DOC)
    return yaml.safe_dump(rng.choice([MIG_DOC, SHARING_DOC]))


# -- generated and mutated requests ----------------------------------------------------------------

_INT_LIMITS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


class Generator:
    """Requests for any RPC from its message descriptor, deterministic for a seed."""

    def __init__(self, rng: random.Random, origin: str) -> None:
        self.rng = rng
        self.origin = origin
        self.request_ids = [f"req-{i}" for i in range(6)]  # reused: idempotency conflicts
        self.names: list[str] = ["operations/" + "0" * 32, "model.bin", "nvidia.com/gpu"]

    def text(self, name: str) -> str:
        rng = self.rng
        if name == "config_yaml":
            # Half attacks on the parser, half documents that parse and test the rules.
            roll = rng.random()
            if roll < 0.5:
                return hostile_yaml(rng)
            if roll < 0.85:
                return mutate_doc(rng, rng.choice([MIG_DOC, SHARING_DOC]))
            return yaml.safe_dump(rng.choice([MIG_DOC, SHARING_DOC]))
        if name == "request_id":
            return rng.choice([*self.request_ids, "", "x" * 200, "a\x00b"])
        if name == "url":
            return rng.choice(
                [
                    f"{self.origin}{rng.randrange(50)}.bin",
                    "http://127.0.0.1:9/x.bin",
                    "http://example.com/blocked",
                    "file:///etc/passwd",
                    "https://127.0.0.1:1/" + "a" * rng.choice([10, 5000]),
                    "",
                ]
            )
        if name == "sha256":
            return rng.choice(["0" * 64, "A" * 64, "g" * 64, "", "0" * 65])
        if name in ("name", "item"):
            return rng.choice([*self.names, "", "../../etc/passwd", "a" * 300, "\x00", "ok-1"])
        if name == "config_name":
            return rng.choice(["balanced", "off", "", "c", "current", "a" * 300, "\x07"])
        if name == "kind":
            return rng.choice(["", "mig.apply", "prewarm", "call:x", "MIG.APPLY"])
        pool = [
            "",
            "all",
            "mixed",
            "mig.apply",
            "prewarm",
            "nvidia.com/gpu",
            "operations/",
            "\x00",
            "a" * 300,
            "é" * 40,
            "{",
            "&a [*a]",
        ]
        if rng.random() < 0.3:
            return "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(rng.randrange(40)))
        return rng.choice(pool)

    def scalar(self, f: FieldDescriptor, depth: int) -> Any:
        rng, t = self.rng, f.type
        if t == FieldDescriptor.TYPE_STRING:
            return self.text(f.name)
        if t == FieldDescriptor.TYPE_BYTES:
            return rng.randbytes(rng.randrange(33))
        if t == FieldDescriptor.TYPE_BOOL:
            return rng.random() < 0.5
        if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return rng.choice([0.0, -1.0, 1e30, float("inf"), float("nan"), rng.uniform(-9, 9)])
        if t == FieldDescriptor.TYPE_ENUM:
            assert f.enum_type is not None
            known = [v.number for v in f.enum_type.values]
            return rng.choice([*known, rng.randint(-3, 99)])
        if t == FieldDescriptor.TYPE_MESSAGE:
            assert f.message_type is not None
            return self.message(f.message_type, depth + 1)
        low, high = _INT_LIMITS[t]
        if f.name == "page_size" and rng.random() < 0.6:
            return rng.choice([0, 1, 10, 1000])
        edges = [low, high, 0, 1, 2, 16, 17, 48, 49, 2**29, low + 1, high - 1]
        value = rng.choice([*edges, rng.randint(low, high), rng.randint(-5, 100)])
        return min(max(value, low), high)

    def message(self, descriptor: Descriptor, depth: int = 0) -> Message:
        cls = GetMessageClass(descriptor)
        msg: Any = cls()
        if descriptor.full_name == "google.protobuf.Duration":
            msg.seconds = self.rng.choice([0, 1, -1, 3, 10**6])
            msg.nanos = self.rng.choice([0, 5, -5, 999_999_999]) * (1 if msg.seconds >= 0 else -1)
            return msg
        if depth > 3:
            return msg
        for f in descriptor.fields:
            if self.rng.random() < 0.4:
                continue
            is_map = f.message_type is not None and f.message_type.GetOptions().map_entry
            if is_map:
                assert f.message_type is not None
                key_f = f.message_type.fields_by_name["key"]
                value_f = f.message_type.fields_by_name["value"]
                for _ in range(self.rng.randrange(3)):
                    key = self.scalar(key_f, depth)
                    value = self.scalar(value_f, depth)
                    if value_f.message_type is not None:
                        getattr(msg, f.name)[key].CopyFrom(value)
                    else:
                        getattr(msg, f.name)[key] = value
            elif f.is_repeated:
                # SubmitPrewarm's targets: sometimes far more than the limit.
                count = self.rng.choice([0, 1, 2, 3, 1001]) if f.name == "targets" else None
                n = count if count is not None else self.rng.randrange(4)
                values = [self.scalar(f, depth) for _ in range(n)]
                if f.message_type is not None:
                    for v in values:
                        getattr(msg, f.name).add().CopyFrom(v)
                else:
                    getattr(msg, f.name).extend(values)
            elif f.message_type is not None:
                getattr(msg, f.name).CopyFrom(self.scalar(f, depth))
            else:
                setattr(msg, f.name, self.scalar(f, depth))
        return msg

    def payload(self, method: MethodDescriptor) -> tuple[str, bytes]:
        """(how it was made, the bytes sent)."""
        roll = self.rng.random()
        data = self.message(method.input_type).SerializeToString()
        if roll < 0.75:
            return "generated", data
        if roll < 0.93:
            return "mutated", mutate_bytes(self.rng, data)
        return "random", self.rng.randbytes(self.rng.randrange(65))


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data or b"\x0a\x00")
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        i = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(i, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            del buf[i:]
        elif op == 2:
            buf[i:i] = rng.randbytes(rng.randrange(1, 9))
        elif op == 3:
            buf[i:i] = buf[: rng.randrange(len(buf) + 1)]
        else:
            buf[i:i] = rng.choice([b"\xff" * 10, b"\x0a\xff\xff\xff\xff\x0f", b"\x80" * 11])
    return bytes(buf)


def issue_attacks() -> list[tuple[str, bytes]]:
    """The requests issue 16 names, each sent once to each YAML RPC before the generated ones:
    10**8 laughs as the value of a field an error message would print, deep nesting, a list as
    a key, a 5000-digit integer, a huge string; and replicas whose advertised count passes
    2**32-1, MPS past the plugin's 48 clients."""
    laughs = billion_laughs(8, 10) + "version: *l7\nmig-configs: *l7\nsharing: *l7\n"
    texts = [
        laughs,
        "[" * 100_000 + "]" * 100_000,
        "version: v1\nmig-configs:\n  ? [a, b]\n  : []\n",
        "version: v1\nmig-configs:\n  a:\n  - devices: [" + "7" * 5000 + "]\n",
        "version: v1\nmig-configs:\n  a:\n  - devices: all\n    mig-enabled: " + "y" * 900_000,
    ]
    out: list[tuple[str, bytes]] = []
    for text in texts:
        out += [
            ("PlanMig", mig_pb2.PlanMigRequest(config_yaml=text).SerializeToString()),
            ("ApplyMig", mig_pb2.ApplyMigRequest(config_yaml=text).SerializeToString()),
            ("AssertMig", mig_pb2.AssertMigRequest(config_yaml=text).SerializeToString()),
            ("SetSharing", sharing_pb2.SetSharingRequest(config_yaml=text).SerializeToString()),
        ]
    for strategy, replicas in (
        (sharing_pb2.SHARING_STRATEGY_TIME_SLICING, 2**31),
        (sharing_pb2.SHARING_STRATEGY_MPS, 49),
    ):
        spec = sharing_pb2.SharingSpec(
            strategy=strategy,
            resources=[sharing_pb2.SharedResource(name="nvidia.com/gpu", replicas=replicas)],
        )
        out.append(("SetSharing", sharing_pb2.SetSharingRequest(spec=spec).SerializeToString()))
    return out


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
