"""The attacker's corpus for bench/fuzz_rpc.py: documents to mutate, hostile values and YAML,
message generators from the API's descriptors, and byte-level attacks; no agent, no I/O."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import yaml
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from agent._proto.gpuagent.v1 import (
    mig_pb2,
    sharing_pb2,
)

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
