"""Fuzzing the whole API over the Unix socket of an in-process agent on a simulated node, and
the seeded small run of bench/fuzz_rpc.py against a separate agent process.

Hypothesis builds requests for every RPC from the message descriptors (any field, any value,
unknown enum numbers, oneofs, maps, nested messages), plus raw bytes that may not decode at all.
Whatever arrives, the agent answers with a deliberate status: never INTERNAL or UNKNOWN, never a
crash, and a refused request changes nothing on the node (GPU state, sharing config).

The agent runs on tmpfs when there is one (its fsync'd writes stay off the shared disk), with
prewarm origins limited to 127.0.0.1, so no generated URL ever leaves the machine.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent._proto.gpuagent.v1 import agent_pb2, agent_pb2_grpc
from agent.api.auth import METHOD_ROLES, Role
from agent.api.server import _MODULES
from bench.fuzz_rpc import run
from tests.unit.api.support import InProcessAgent, agent_config
from tests.unit.test_safeyaml import billion_laughs

TOTAL_EXAMPLES = 10_000
RAW_EXAMPLES = 600
#: Generous: on a loaded machine (issue 36: load 4 on 2 cores) a call may take seconds.
CALL_TIMEOUT_S = 10.0
STREAM_TIMEOUT_S = 0.05  # watches run until cancelled: cut them short

SHARING_YAML = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "    - name: nvidia.com/gpu\n      replicas: 2\n"
)
MIG_YAML = (
    "version: v1\nmig-configs:\n  a:\n  - devices: all\n    mig-enabled: true\n"
    "    mig-devices: {1g.10gb: 7}\n"
)
INTERESTING = [
    "",
    "operations/" + "0" * 32,
    "operations/",
    "nvidia.com/gpu",
    "nvidia.com/mig-1g.10gb",
    "gpu",
    "http://127.0.0.1:9/model.bin",
    "https://127.0.0.1:9/x",
    "http://example.com/blocked",
    "../../etc/passwd",
    "/etc/hostname",
    "a" * 300,
    "mixed",
    "all",
    "prewarm",
    "mig.apply",
    "0" * 64,
    "\x00",
    SHARING_YAML,
    MIG_YAML,
    "{",
    "- [",
    "&a [*a, *a]",
    # The attacker's YAML (issue 16): each is refused while composing, never expanded.
    billion_laughs(),
    "[" * 5000 + "]" * 5000,
    "? [a, b]\n: 1\n",
    "version: v1\nmig-configs: {a: [{devices: [" + "9" * 5000 + "]}]}\n",
    "name: " + "A" * 20_000,
    "&a [*a]",
    SHARING_YAML.replace("replicas: 2", f"replicas: {2**31}"),
]

STRINGS = st.one_of(
    st.sampled_from(INTERESTING),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
)
_INTS = {
    FieldDescriptor.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: st.integers(0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: st.integers(0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: st.integers(0, 2**64 - 1),
}


def _scalar(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return STRINGS
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=32)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(width=32 if t == FieldDescriptor.TYPE_FLOAT else 64)
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-3, 99))  # open enums
    if t == FieldDescriptor.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1)
    return _INTS[t]


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    cls = GetMessageClass(descriptor)
    if descriptor.full_name == "google.protobuf.Duration":
        return st.builds(
            cls, seconds=st.integers(-(10**6), 10**6), nanos=st.integers(-(10**9) + 1, 10**9 - 1)
        )
    if depth > 3:
        return st.just(cls())
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, value = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            optional[field.name] = st.dictionaries(
                _scalar(key, depth), _scalar(value, depth), max_size=2
            )
        elif field.is_repeated:
            optional[field.name] = st.lists(_scalar(field, depth), max_size=3)
        else:
            optional[field.name] = _scalar(field, depth)
    return st.fixed_dictionaries({}, optional=optional).map(lambda kw: _build(cls, kw))


def _build(cls: type[Message], fields: dict[str, Any]) -> Message:
    message = cls()
    for name, value in fields.items():  # one by one: a later oneof member replaces an earlier one
        f = message.DESCRIPTOR.fields_by_name[name]
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            getattr(message, name).update(value)
        elif f.is_repeated:
            getattr(message, name).extend(value)
        elif f.message_type is not None:
            getattr(message, name).CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


def api_methods() -> list[MethodDescriptor]:
    return [
        method
        for module in _MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


@pytest.fixture(scope="module")
def agent() -> Iterator[InProcessAgent]:
    # On tmpfs when there is one: thousands of fsync'd writes stay off the shared disk.
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        root = Path(tmp)
        with InProcessAgent(root, agent_config(root)) as running:
            yield running


@pytest.fixture(scope="module")
def channel(agent: InProcessAgent) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"unix:{agent.socket}") as ch:
        yield ch


def gpu_state(agent: InProcessAgent) -> tuple[int, int, int]:
    """The simulated GPUs' state file; the simulator rewrites it on every driver mutation."""
    st_ = (agent.config.state_dir / "sim" / "state.json").stat()
    return (st_.st_ino, st_.st_mtime_ns, st_.st_size)


def sharing_state(agent: InProcessAgent) -> bytes | None:
    plugin = agent.config.sharing.config_path
    return plugin.read_bytes() if plugin.exists() else None


def mig_applying(agent: InProcessAgent) -> bool:
    """An accepted MIG apply changes the GPUs in the background; meanwhile a refused request
    cannot be told apart from it by the GPU state."""
    store = agent.node.services.state
    return bool(store.list_operations(kind="mig.apply", done=False, limit=1))


def call(channel: grpc.Channel, method: MethodDescriptor, payload: bytes) -> grpc.StatusCode:
    path = f"/{method.containing_service.full_name}/{method.name}"
    try:
        if method.server_streaming:
            for _ in channel.unary_stream(path)(payload, timeout=STREAM_TIMEOUT_S):
                pass
        else:
            channel.unary_unary(path)(payload, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


DELIBERATE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.UNIMPLEMENTED,  # MigService, while the agent has no MIG service
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,  # watches cut short by the test
    grpc.StatusCode.CANCELLED,
}

#: Answers after which the request may have changed the node: accepted, or not known.
_NOT_A_REFUSAL = {grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED}

METHODS = api_methods()


def distinct_requests(method: MethodDescriptor) -> int | None:
    """How many different requests there are when that is few (no field: one; only single
    bools: two per field), else None. Hypothesis stops once it has tried them all."""
    fields = method.input_type.fields
    if all(f.type == f.TYPE_BOOL and not f.is_repeated for f in fields):
        return 2 ** len(fields)
    return None


# The budget is shared by request fields: a request with four fields has more to explore than
# one with a single name; a request with few possible values gets exactly those.
_FEW = {m.full_name: n for m in METHODS if (n := distinct_requests(m)) is not None}
PER_FIELD = (TOTAL_EXAMPLES - sum(_FEW.values())) / sum(
    len(m.input_type.fields) for m in METHODS if m.full_name not in _FEW
)


def budget_of(method: MethodDescriptor) -> int:
    few = _FEW.get(method.full_name)
    if few is not None:
        return few
    return max(1, math.ceil(PER_FIELD * len(method.input_type.fields)))


_counts: dict[str, int] = {}


@pytest.mark.parametrize("method", METHODS, ids=lambda m: f"{m.containing_service.name}.{m.name}")
def test_generated_requests_get_deliberate_answers_and_refusals_change_nothing(
    agent: InProcessAgent, channel: grpc.Channel, method: MethodDescriptor
) -> None:
    path = f"/{method.containing_service.full_name}/{method.name}"
    mutating = Role.READ not in METHOD_ROLES[path]
    budget = budget_of(method)

    @settings(
        max_examples=budget,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(request=messages(method.input_type))
    def check(request: Message) -> None:
        _counts[path] = _counts.get(path, 0) + 1
        quiet = mutating and not mig_applying(agent)
        gpus, sharing = (gpu_state(agent), sharing_state(agent)) if mutating else (None, None)
        code = call(channel, method, request.SerializeToString())
        assert code in DELIBERATE, f"{path} answered {code} to {request}"
        # A call cut off by its deadline is no refusal: the agent may have accepted it after
        # the client stopped waiting (a slow machine), so only a real refusal must change nothing.
        if mutating and code not in _NOT_A_REFUSAL:
            assert sharing_state(agent) == sharing, f"refused {path} changed sharing: {request}"
            if quiet and not mig_applying(agent):
                assert gpu_state(agent) == gpus, f"refused {path} changed the GPUs: {request}"

    check()
    assert _counts[path] >= budget
    # ... and after its examples the agent still serves (each case checks it: xdist workers
    # split the cases, so no one test sees them all)
    node = agent_pb2_grpc.NodeServiceStub(channel).GetNode(agent_pb2.GetNodeRequest(), timeout=10)
    assert len(node.node.gpus) == 8 and agent.node.ready


@settings(
    max_examples=RAW_EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
@given(method=st.sampled_from(METHODS), payload=st.binary(max_size=64))
def test_malformed_bytes_never_get_an_internal_error(
    agent: InProcessAgent, channel: grpc.Channel, method: MethodDescriptor, payload: bytes
) -> None:
    code = call(channel, method, payload)
    assert code in DELIBERATE, f"{method.full_name} answered {code} to {payload!r}"


def test_the_budgets_cover_the_whole_fuzz_run() -> None:
    """Every method's examples (each case asserts it ran its budget) add up to the run the
    suite promises, whichever worker runs which method."""
    assert sum(budget_of(m) for m in METHODS) >= TOTAL_EXAMPLES


def test_seeded_hostile_run_against_an_agent_process_meets_every_goal(tmp_path: Path) -> None:
    """bench/fuzz_rpc.py at 300 requests (seeded, so the same requests every time) and four
    pairs of conflicting applies: no INTERNAL or UNKNOWN answer, no refused call that changed
    the node, never two applies accepted at once, peak RSS within 256 MiB, still serving."""
    report = run(300, seed=16, pairs=4, root=tmp_path)
    assert report.requests == 300
    assert report.internal == 0, report.bugs
    assert report.changed == []
    assert report.pairs == 4 and report.pairs_both_accepted == 0
    assert report.stuck == []
    assert report.peak_rss <= 256 * 1024 * 1024
    assert report.still_serves
    assert report.codes["INVALID_ARGUMENT"] > 0 and report.codes["OK"] > 0
