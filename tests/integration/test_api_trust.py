"""A real agent process over real mTLS and its Unix socket: who may undo whose cache work, and
that no reply, event or log line carries a signed URL's credential."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator

import grpc
import pytest

from agent._proto.gpuagent.v1 import (
    cache_pb2,
    events_pb2,
    events_pb2_grpc,
    operations_pb2,
    operations_pb2_grpc,
    prewarm_pb2,
    prewarm_pb2_grpc,
)
from tests.integration.prewarm_fixtures.origin import Origin
from tests.unit.api.support import AgentProcess, Pki, agent_config, unix_channel

pytestmark = pytest.mark.integration
T = 20
RUNNING = (cache_pb2.CACHE_ITEM_STATE_QUEUED, cache_pb2.CACHE_ITEM_STATE_FETCHING)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Origin]:
    with Origin(tmp_path_factory.mktemp("origin")) as server:
        yield server


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[AgentProcess]:
    root = tmp_path_factory.mktemp("agent")
    with AgentProcess(root, agent_config(root, pki)) as process:
        yield process


def mtls(agent: AgentProcess, pki: Pki, who: str) -> grpc.Channel:
    return grpc.secure_channel(f"localhost:{agent.tcp_port}", getattr(pki, who).credentials(pki.ca))


def refusal(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    return caught.value


def submit(channel: grpc.Channel, url: str, name: str, *, pin: bool = False) -> str:
    return submit_all(channel, {name: url}, pin=pin)


def submit_all(channel: grpc.Channel, urls: dict[str, str], *, pin: bool = False) -> str:
    """One prewarm operation of a file per name -> URL."""
    targets = [
        prewarm_pb2.PrewarmTarget(file=prewarm_pb2.FileTarget(url=url, name=name, pin=pin))
        for name, url in urls.items()
    ]
    stub = prewarm_pb2_grpc.PrewarmServiceStub(channel)
    request = prewarm_pb2.SubmitPrewarmRequest(targets=targets)
    return str(stub.SubmitPrewarm(request, timeout=T).operation.name)


def wait_done(channel: grpc.Channel, name: str) -> operations_pb2.Operation:
    ops = operations_pb2_grpc.OperationsServiceStub(channel)
    request = operations_pb2.WaitOperationRequest(name=name)
    request.timeout.seconds = T
    op = ops.WaitOperation(request, timeout=T + 5).operation
    assert op.done, op
    return op


def item(channel: grpc.Channel, name: str) -> cache_pb2.CacheItem:
    stub = prewarm_pb2_grpc.PrewarmServiceStub(channel)
    items = stub.ListPrewarmItems(prewarm_pb2.ListPrewarmItemsRequest(), timeout=T).items
    (found,) = [i for i in items if i.name == name]
    return found


def test_a_prewarm_caller_cannot_unpin_evict_or_delete_the_admins_item(
    agent: AgentProcess, pki: Pki, origin: Origin
) -> None:
    origin.add("admin.bin", os.urandom(64 * 1024))
    with unix_channel(agent.socket) as admin:
        wait_done(admin, submit(admin, origin.url("admin.bin"), "admin-model", pin=True))
        before = item(admin, "admin-model")
    with mtls(agent, pki, "prewarmer") as team:
        stub = prewarm_pb2_grpc.PrewarmServiceStub(team)
        calls = [
            lambda: stub.PinCacheItem(
                prewarm_pb2.PinCacheItemRequest(item="admin-model", pinned=False), timeout=T
            ),
            lambda: stub.EvictCacheItem(
                prewarm_pb2.EvictCacheItemRequest(item="admin-model"), timeout=T
            ),
            lambda: stub.DeletePrewarmItem(
                prewarm_pb2.DeletePrewarmItemRequest(item="admin-model"), timeout=T
            ),
        ]
        for call in calls:
            error = refusal(call)
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error
            assert "belongs to an admin caller" in error.details()
            assert "local" not in error.details() and "unix" not in error.details()
        # Its own items stay its own to undo.
        origin.add("team.bin", os.urandom(64 * 1024))
        wait_done(team, submit(team, origin.url("team.bin"), "team-model", pin=True))
        stub.PinCacheItem(prewarm_pb2.PinCacheItemRequest(item="team-model"), timeout=T)
        stub.DeletePrewarmItem(prewarm_pb2.DeletePrewarmItemRequest(item="team-model"), timeout=T)
    with unix_channel(agent.socket) as admin:
        assert item(admin, "admin-model") == before


def test_a_prewarm_caller_cannot_cancel_the_admins_operation_or_item(
    agent: AgentProcess, pki: Pki, origin: Origin
) -> None:
    origin.add("slow.bin", os.urandom(4 * 1024 * 1024))
    origin.faults.rate_bps["/slow.bin"] = 64 * 1024  # a minute: still running when cancelled
    with unix_channel(agent.socket) as admin:
        name = submit(admin, origin.url("slow.bin"), "admin-slow")
    with mtls(agent, pki, "prewarmer") as team:
        ops = operations_pb2_grpc.OperationsServiceStub(team)
        error = refusal(
            lambda: ops.CancelOperation(operations_pb2.CancelOperationRequest(name=name), timeout=T)
        )
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "belongs to an admin caller" in error.details()
        stub = prewarm_pb2_grpc.PrewarmServiceStub(team)
        error = refusal(
            lambda: stub.CancelPrewarmItem(
                prewarm_pb2.CancelPrewarmItemRequest(item="admin-slow"), timeout=T
            )
        )
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        op = ops.GetOperation(operations_pb2.GetOperationRequest(name=name), timeout=T).operation
        assert not op.done and not op.cancel_requested
    # The coordinator ranks with the node's admin: it may.
    with mtls(agent, pki, "coordinator") as coordinator:
        ops = operations_pb2_grpc.OperationsServiceStub(coordinator)
        ops.CancelOperation(operations_pb2.CancelOperationRequest(name=name), timeout=T)
        assert wait_done(coordinator, name).state == operations_pb2.OPERATION_STATE_CANCELLED


def denied_as_the_admins(call: object) -> None:
    error = refusal(call)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error
    assert "belongs to an admin caller" in error.details()


def test_an_admin_who_resubmits_or_pins_an_item_takes_it_over(
    agent: AgentProcess, pki: Pki, origin: Origin
) -> None:
    for path in ("taken-resubmitted.bin", "taken-pinned.bin"):
        origin.add(path, os.urandom(64 * 1024))
    with mtls(agent, pki, "prewarmer") as team:
        wait_done(team, submit(team, origin.url("taken-resubmitted.bin"), "taken-resubmitted"))
        wait_done(team, submit(team, origin.url("taken-pinned.bin"), "taken-pinned"))
    with unix_channel(agent.socket) as admin:
        wait_done(admin, submit(admin, origin.url("taken-resubmitted.bin"), "taken-resubmitted"))
        prewarm_pb2_grpc.PrewarmServiceStub(admin).PinCacheItem(
            prewarm_pb2.PinCacheItemRequest(item="taken-pinned", pinned=True), timeout=T
        )
    with mtls(agent, pki, "prewarmer") as team:
        stub = prewarm_pb2_grpc.PrewarmServiceStub(team)
        # The team's own repeat leaves the admin its owner.
        wait_done(team, submit(team, origin.url("taken-resubmitted.bin"), "taken-resubmitted"))
        denied_as_the_admins(
            lambda: stub.EvictCacheItem(
                prewarm_pb2.EvictCacheItemRequest(item="taken-resubmitted"), timeout=T
            )
        )
        denied_as_the_admins(
            lambda: stub.PinCacheItem(
                prewarm_pb2.PinCacheItemRequest(item="taken-pinned", pinned=False), timeout=T
            )
        )
    with unix_channel(agent.socket) as admin:
        assert item(admin, "taken-resubmitted").state == cache_pb2.CACHE_ITEM_STATE_READY
        assert item(admin, "taken-pinned").pinned


def test_a_prewarm_caller_cannot_evict_a_blob_that_also_carries_an_admins_name(
    agent: AgentProcess, pki: Pki, origin: Origin
) -> None:
    data = os.urandom(64 * 1024)
    origin.add("shared-admin.bin", data)
    origin.add("shared-team.bin", data)  # the same bytes: one blob, two names
    with unix_channel(agent.socket) as admin:
        wait_done(admin, submit(admin, origin.url("shared-admin.bin"), "shared-admin"))
    with mtls(agent, pki, "prewarmer") as team:
        wait_done(team, submit(team, origin.url("shared-team.bin"), "shared-team"))
        stub = prewarm_pb2_grpc.PrewarmServiceStub(team)
        denied_as_the_admins(
            lambda: stub.EvictCacheItem(
                prewarm_pb2.EvictCacheItemRequest(item="shared-team"), timeout=T
            )
        )
        items = [item(team, name) for name in ("shared-admin", "shared-team")]
    assert {i.state for i in items} == {cache_pb2.CACHE_ITEM_STATE_READY}
    sha256 = hashlib.sha256(data).hexdigest()
    assert {i.sha256 for i in items} == {sha256}
    assert (agent.root / "cache" / "blobs" / "sha256" / sha256).read_bytes() == data
    for name in ("shared-admin", "shared-team"):
        assert (agent.root / "cache" / "by-name" / name).read_bytes() == data


def test_cancelling_ones_own_prewarm_leaves_a_joined_admin_item_running(
    agent: AgentProcess, pki: Pki, origin: Origin
) -> None:
    for path in ("joined-slow.bin", "own-slow.bin"):
        origin.add(path, os.urandom(4 * 1024 * 1024))
        origin.faults.rate_bps[f"/{path}"] = 64 * 1024  # a minute: still running when cancelled
    with unix_channel(agent.socket) as admin:
        admins = submit(admin, origin.url("joined-slow.bin"), "joined-slow")
    with mtls(agent, pki, "prewarmer") as team:
        urls = {
            "joined-slow": origin.url("joined-slow.bin"),
            "own-slow": origin.url("own-slow.bin"),
        }
        own = submit_all(team, urls)
        ops = operations_pb2_grpc.OperationsServiceStub(team)
        ops.CancelOperation(operations_pb2.CancelOperationRequest(name=own), timeout=T)
        assert wait_done(team, own).state == operations_pb2.OPERATION_STATE_CANCELLED
        own_item, joined = item(team, "own-slow"), item(team, "joined-slow")
    assert own_item.error == "cancelled"
    assert joined.state in RUNNING and not joined.error, joined
    with unix_channel(agent.socket) as admin:
        ops = operations_pb2_grpc.OperationsServiceStub(admin)
        op = ops.GetOperation(operations_pb2.GetOperationRequest(name=admins), timeout=T).operation
        assert not op.done and not op.cancel_requested
        ops.CancelOperation(operations_pb2.CancelOperationRequest(name=admins), timeout=T)
        wait_done(admin, admins)


SECRETS = ("S3SIGNATURE0123", "AKIAEXAMPLECRED", "azuresasvalue", "URLPASSWORD99")


def test_replies_events_and_the_log_carry_no_signed_url_credential(
    agent: AgentProcess, pki: Pki, origin: Origin
) -> None:
    origin.add("signed.bin", os.urandom(64 * 1024))
    query = (
        "?X-Amz-Signature=S3SIGNATURE0123&X-Amz-Credential=AKIAEXAMPLECRED&sig=azuresasvalue&sv=1"
    )
    good = origin.url("signed.bin") + query  # fetched: shown without its query
    missing = origin.url("gone.bin") + query  # fails: its error names the URL
    # Refused at submit: credentials belong in a header read from a file, not the URL.
    with_user_info = good.replace("http://", "http://agent:URLPASSWORD99@", 1)
    events: list[bytes] = []
    with mtls(agent, pki, "reader") as reader:
        stream = events_pb2_grpc.EventsServiceStub(reader).WatchEvents(
            events_pb2.WatchEventsRequest(), timeout=60
        )

        def watch() -> None:
            with contextlib.suppress(grpc.RpcError):  # cancelled at the end
                events.extend(e.SerializeToString() for e in stream)

        watching = threading.Thread(target=watch, daemon=True)
        watching.start()
        with mtls(agent, pki, "prewarmer") as team:
            refused = refusal(lambda: submit(team, with_user_info, "with-user-info"))
            ok = wait_done(team, submit(team, good, "signed"))
            failed = wait_done(team, submit(team, missing, "gone"))
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "credentials in the URL are not accepted" in refused.details()
        assert ok.state == operations_pb2.OPERATION_STATE_SUCCEEDED, ok
        assert failed.state == operations_pb2.OPERATION_STATE_FAILED
        replies = [
            refused.details().encode(),
            *(v for _, v in refused.trailing_metadata() if isinstance(v, bytes)),  # its details
            ok.SerializeToString(),
            failed.SerializeToString(),
            prewarm_pb2_grpc.PrewarmServiceStub(reader)
            .ListPrewarmItems(prewarm_pb2.ListPrewarmItemsRequest(), timeout=T)
            .SerializeToString(),
            operations_pb2_grpc.OperationsServiceStub(reader)
            .ListOperations(operations_pb2.ListOperationsRequest(kind="prewarm"), timeout=T)
            .SerializeToString(),
        ]
        shown = item(reader, "signed")
        assert shown.source == origin.url("signed.bin") + "?…"
        assert "gone.bin?…" in item(reader, "gone").error
        stream.cancel()
        watching.join(10)
    assert any(b"signed" in e for e in events)  # the stream saw the operations
    log = agent.output()
    assert "prewarm of gone (http://127.0.0.1" in log  # the log did record the failure
    for secret in SECRETS:
        for text in (*replies, *events):
            assert secret.encode() not in text
        assert secret not in log
