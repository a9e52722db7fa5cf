"""Atomic conflicts and refusals (issue 16): two conflicting applies sent at the same instant get
exactly one operation, the other ABORTED with no row of its own; a refused SubmitPrewarm leaves no
queued item behind. Real concurrency, made deterministic by barriers, never by sleeps."""

from __future__ import annotations

import asyncio
import http.server
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent._proto.gpuagent.v1 import (
    mig_pb2,
    mig_pb2_grpc,
    operations_pb2,
    operations_pb2_grpc,
    prewarm_pb2,
    prewarm_pb2_grpc,
)
from agent.api.auth import Policy
from agent.api.events import EventBus
from agent.api.interceptor import ApiInterceptor
from agent.api.mig import MigServicer
from agent.api.operations import MIG_APPLY, OperationRunner, OperationsServicer
from agent.gpu import open_driver
from agent.mig.lock import PartitionLock
from agent.mig.node_plan import NodePlan
from agent.mig.service import MigService
from agent.operation import AlreadyRunning
from agent.state import StateStore
from tests.unit.api.support import InProcessAgent, agent_config


def mig_config(devices: str, mig_devices: str) -> str:
    return (
        "version: v1\nmig-configs:\n  it:\n"
        f"    - devices: {devices}\n      mig-enabled: true\n      mig-devices: {mig_devices}\n"
    )


def test_exclusive_create_lets_one_of_two_stores_at_the_same_instant_win(tmp_path: Path) -> None:
    """Two connections to one database (as the agent and an embedded CLI would hold): the
    check for a running apply and the insert are one transaction."""
    path = tmp_path / "agent.db"
    StateStore(path).close()
    stores = [StateStore(path), StateStore(path)]
    barrier = threading.Barrier(2)
    outcomes: list[object] = [None, None]

    def create(i: int) -> None:
        barrier.wait(10)
        try:
            outcomes[i] = stores[i].create_operation(
                MIG_APPLY, request_id=None, request={"n": i}, exclusive=True
            )
        except AlreadyRunning as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=create, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    refused = [o for o in outcomes if isinstance(o, AlreadyRunning)]
    created = [o for o in outcomes if not isinstance(o, AlreadyRunning)]
    assert len(refused) == 1 and len(created) == 1
    assert refused[0].running == created[0]
    assert len(stores[0].list_operations(kind=MIG_APPLY)) == 1
    for s in stores:
        s.close()


class MeetingMig(MigService):
    """Plans only once both callers are planning: both have passed the servicer's early look
    for a running apply, so only the store can refuse one of them."""

    def __init__(self, *args: Any, barrier: threading.Barrier, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._barrier = barrier

    def plan(self, *args: Any, **kwargs: Any) -> NodePlan:
        self._barrier.wait(10)
        return super().plan(*args, **kwargs)


async def two_applies_at_once(tmp_path: Path) -> None:
    state_dir = tmp_path / "node"
    driver = open_driver("dgx-h100", state_dir)
    store = StateStore(tmp_path / "agent.db")
    barrier = threading.Barrier(2)
    service = MeetingMig(driver, store, PartitionLock(state_dir), lambda gpu: None, barrier=barrier)
    bus, runner = EventBus(), OperationRunner(store, EventBus())
    loop = asyncio.get_running_loop()
    bus.bind(loop)
    runner.bind(loop)
    server = grpc.aio.server(interceptors=[ApiInterceptor(Policy.of({}))])
    mig_pb2_grpc.add_MigServiceServicer_to_server(
        MigServicer(service, runner, lambda: None, lambda: None, lambda _feature: None), server
    )
    operations_pb2_grpc.add_OperationsServiceServicer_to_server(OperationsServicer(runner), server)
    sock = tmp_path / "s.sock"
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{sock}") as channel:
            mig = mig_pb2_grpc.MigServiceStub(channel)
            first = mig_pb2.ApplyMigRequest(config_yaml=mig_config("[0]", "{3g.40gb: 2}"))
            second = mig_pb2.ApplyMigRequest(config_yaml=mig_config("[0]", "{1g.10gb: 7}"))
            answers = await asyncio.gather(
                mig.ApplyMig(first, timeout=30),
                mig.ApplyMig(second, timeout=30),
                return_exceptions=True,
            )
            accepted = [a for a in answers if isinstance(a, mig_pb2.ApplyMigResponse)]
            refused = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
            assert len(accepted) == 1 and len(refused) == 1, answers
            assert refused[0].code() == grpc.StatusCode.ABORTED
            name = accepted[0].operation.name
            assert name in (refused[0].details() or "")
            rows = store.list_operations(kind=MIG_APPLY)
            assert [f"operations/{op.id}" for op in rows] == [name]
            ops = operations_pb2_grpc.OperationsServiceStub(channel)
            done = await ops.WaitOperation(
                operations_pb2.WaitOperationRequest(name=name), timeout=30
            )
            assert done.operation.done
    finally:
        await server.stop(None)
        await runner.shutdown(5)
        store.close()
        driver.close()


def test_two_conflicting_applies_at_the_same_instant_get_exactly_one_operation(
    tmp_path: Path,
) -> None:
    asyncio.run(two_applies_at_once(tmp_path))


# -- SubmitPrewarm -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent() -> Iterator[InProcessAgent]:
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        root = Path(tmp)
        with InProcessAgent(root, agent_config(root)) as running:
            yield running


@pytest.fixture(scope="module")
def prewarm(agent: InProcessAgent) -> Iterator[prewarm_pb2_grpc.PrewarmServiceStub]:
    with grpc.insecure_channel(f"unix:{agent.socket}") as ch:
        yield prewarm_pb2_grpc.PrewarmServiceStub(ch)


class _Origin(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads the answers, not the server's log."""


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    """A loopback origin that serves every path (its own text), so accepted items finish."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Origin)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def file(url: str, name: str = "") -> prewarm_pb2.PrewarmTarget:
    return prewarm_pb2.PrewarmTarget(file=prewarm_pb2.FileTarget(url=url, name=name))


def items(stub: prewarm_pb2_grpc.PrewarmServiceStub) -> list[tuple[str, str]]:
    """The recorded items by name and id (their states move on in the background)."""
    listed = stub.ListPrewarmItems(prewarm_pb2.ListPrewarmItemsRequest(), timeout=10).items
    return sorted((i.name, i.id) for i in listed)


@pytest.mark.parametrize(
    ("targets", "request_id", "code"),
    [
        ([("a.bin", "same"), ("b.bin", "same")], "", "INVALID_ARGUMENT"),  # one request, one name
        ([("c.bin", "")], "x" * 500, "INVALID_ARGUMENT"),
        ([("d.bin", "")], "used-for-another", "FAILED_PRECONDITION"),
        ([("e.bin", ""), ("other.bin", "held")], "", "FAILED_PRECONDITION"),
        ([("f.bin", ""), ("ftp://127.0.0.1/g.bin", "")], "", "INVALID_ARGUMENT"),
    ],
    ids=["same-name-two-sources", "bad-request-id", "reused-request-id", "name-held", "bad-url"],
)
def test_a_refused_submit_prewarm_leaves_no_item_behind(
    prewarm: prewarm_pb2_grpc.PrewarmServiceStub,
    origin: str,
    targets: list[tuple[str, str]],
    request_id: str,
    code: str,
) -> None:
    # What the refusals run into: an item named "held", and a request id already used.
    prewarm.SubmitPrewarm(
        prewarm_pb2.SubmitPrewarmRequest(
            targets=[file(origin + "held.bin", "held")], request_id="used-for-another"
        ),
        timeout=10,
    )
    sent = [file(path if "://" in path else origin + path, name) for path, name in targets]
    before = items(prewarm)
    with pytest.raises(grpc.RpcError) as caught:
        prewarm.SubmitPrewarm(
            prewarm_pb2.SubmitPrewarmRequest(targets=sent, request_id=request_id), timeout=10
        )
    assert caught.value.code().name == code, caught.value.details()
    assert items(prewarm) == before


def test_a_retried_submit_prewarm_gets_its_first_operation_and_submits_nothing(
    prewarm: prewarm_pb2_grpc.PrewarmServiceStub, origin: str
) -> None:
    request = prewarm_pb2.SubmitPrewarmRequest(
        targets=[file(origin + "retry.bin", "retry")], request_id="retry-1"
    )
    first = prewarm.SubmitPrewarm(request, timeout=10).operation
    before = items(prewarm)
    again = prewarm.SubmitPrewarm(request, timeout=10).operation
    assert again.name == first.name
    assert items(prewarm) == before
