"""The API's doors and their fair share, on a real agent process with mTLS and roles: a read
identity that opens streams it never reads gets its share and no more, while the Unix socket and
the coordinator (admin) are served; many identities together cannot fill a door; a connection
that never finishes its TLS handshake is closed; a certificate SAN cannot forge a log line."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from agent._proto.gpuagent.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    events_pb2,
    events_pb2_grpc,
    mig_pb2,
    mig_pb2_grpc,
)
from tests.unit.api.support import (
    AgentProcess,
    Identity,
    InProcessAgent,
    Pki,
    agent_config,
    unix_channel,
    wait_for,
)

pytestmark = pytest.mark.integration

STREAMS_PER_CALLER = 3
CALLS_PER_CALLER = 6
CALLS_PER_DOOR = 8
HANDSHAKE_S = 1.0
LIFETIME_S = 1.0
# A SAN that, written raw, would end the "denied" line and start a forged CRITICAL record, with
# a terminal colour (ESC) and a carriage return. openssl's config reads \n and \r as escapes.
FORGED = "2030-01-01 00:00:00,000 CRITICAL agent.api.auth: forged"
EVIL_SAN = "URI:spiffe://cluster/ns/evil/sa/x\\n" + FORGED + " \x1b[31mred\\rX"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[AgentProcess]:
    root = tmp_path_factory.mktemp("fair")
    web = root / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {
                    "cert_file": str(pki.server.cert),
                    "key_file": str(pki.server.key),
                }
            }
        )
    )
    config = agent_config(
        root,
        pki,
        api={
            "max_streams_per_caller": STREAMS_PER_CALLER,
            "max_calls_per_caller": CALLS_PER_CALLER,
            "max_calls_per_door": CALLS_PER_DOOR,
        },
        handshake_timeout_s=HANDSHAKE_S,
        metrics_web_config=str(web),
    )
    with AgentProcess(root, config) as process:
        yield process


def mtls(agent: AgentProcess, pki: Pki, identity: Identity) -> grpc.Channel:
    # A connection of its own (grpc shares them between channels to one target by default).
    return grpc.secure_channel(
        f"localhost:{agent.tcp_port}",
        identity.credentials(pki.ca),
        options=[("grpc.use_local_subchannel_pool", 1)],
    )


def watch(channel: grpc.Channel) -> grpc.Future:
    """A WatchEvents stream that is opened and never read."""
    call = events_pb2_grpc.EventsServiceStub(channel).WatchEvents(
        events_pb2.WatchEventsRequest(), timeout=60
    )
    assert isinstance(call, grpc.Future)
    return call


def refused(calls: list[grpc.Future]) -> list[grpc.Future]:
    return [c for c in calls if c.done() and c.code() == grpc.StatusCode.RESOURCE_EXHAUSTED]


def get_node(channel: grpc.Channel) -> agent_pb2.GetNodeResponse:
    return agent_pb2_grpc.NodeServiceStub(channel).GetNode(agent_pb2.GetNodeRequest(), timeout=10)


def until_released(agent: AgentProcess, pki: Pki, identity: Identity) -> None:
    """Cancelled streams end on the server a moment later: wait until the caller's share is
    whole again (it can hold every stream it may)."""
    with mtls(agent, pki, identity) as channel:

        def whole() -> bool:
            probe = [watch(channel) for _ in range(STREAMS_PER_CALLER)]
            time.sleep(0.2)
            full = not refused(probe)
            for call in probe:
                call.cancel()
            return full

        wait_for(whole, "the cancelled streams to be released", timeout=10)


def test_never_read_streams_of_a_reader_leave_the_socket_and_the_coordinator_served(
    agent: AgentProcess, pki: Pki
) -> None:
    """The attack run's finding: 1,030 never-read WatchEvents used to fill the server's one
    limit of 1024 calls, and every other call, the Unix socket's too, got RESOURCE_EXHAUSTED."""
    channels = [mtls(agent, pki, pki.reader) for _ in range(9)]  # 128 streams per connection
    streams = [watch(channels[i % len(channels)]) for i in range(1030)]
    try:
        wait_for(lambda: len(refused(streams)) == 1030 - STREAMS_PER_CALLER, "the refusals")
        held = [c for c in streams if not c.done()]
        assert len(held) == STREAMS_PER_CALLER
        detail = refused(streams)[0].details()
        assert "api.max_streams_per_caller" in detail and "dashboard" in detail, detail
        # The reader still has calls left for its unary reads.
        assert get_node(channels[0]).node.gpus
        with unix_channel(agent.socket) as local:
            assert get_node(local).node.gpus
        with mtls(agent, pki, pki.coordinator) as coordinator:
            # The reserved share: more streams than a reader may hold, all open.
            admin_streams = [watch(coordinator) for _ in range(STREAMS_PER_CALLER + 2)]
            assert get_node(coordinator).node.gpus
            assert not any(c.done() for c in admin_streams)
            for call in admin_streams:
                call.cancel()
    finally:
        for call in streams:
            call.cancel()
        for channel in channels:
            channel.close()
    until_released(agent, pki, pki.reader)


def test_readers_together_cannot_fill_the_door_and_the_coordinator_is_still_served(
    agent: AgentProcess, pki: Pki
) -> None:
    identities = [pki.reader, pki.prewarmer, pki.mig_operator]  # none of them admin
    channels = [mtls(agent, pki, identity) for identity in identities]
    streams = [watch(channel) for channel in channels for _ in range(STREAMS_PER_CALLER)]
    try:
        wait_for(
            lambda: len(refused(streams)) == len(streams) - CALLS_PER_DOOR, "the door refusals"
        )
        (door_refusal,) = refused(streams)
        assert "api.max_calls_per_door" in door_refusal.details(), door_refusal.details()
        with mtls(agent, pki, pki.coordinator) as coordinator:
            assert get_node(coordinator).node.gpus
        with unix_channel(agent.socket) as local:
            assert get_node(local).node.gpus
    finally:
        for call in streams:
            call.cancel()
        for channel in channels:
            channel.close()
    until_released(agent, pki, pki.reader)


@pytest.mark.parametrize("port", ["tcp_port", "metrics_port"])
def test_a_connection_that_never_finishes_its_tls_handshake_is_closed(
    agent: AgentProcess, port: str
) -> None:
    """The mTLS port held such a connection for 120 s, the TLS metrics port for 60 s."""
    with socket.create_connection(("127.0.0.1", getattr(agent, port)), timeout=10) as raw:
        started = time.monotonic()
        try:
            data = raw.recv(1024)  # no ClientHello is ever sent
        except ConnectionResetError:
            data = b""
        took = time.monotonic() - started
    assert data == b""
    assert took < HANDSHAKE_S + 3, took


def test_a_certificate_san_cannot_forge_a_log_line(agent: AgentProcess, pki: Pki) -> None:
    evil = pki.issue("evil", EVIL_SAN)
    with mtls(agent, pki, evil) as channel:
        stub = mig_pb2_grpc.MigServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.ApplyMig(mig_pb2.ApplyMigRequest(config_yaml="version: v1\n"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED

    def denied() -> str | None:
        lines = [line for line in agent.output().splitlines() if "ns/evil" in line]
        return lines[-1] if lines else None

    line = wait_for(denied, "the denial to be logged", timeout=10)
    assert "denied /gpuagent.v1.MigService/ApplyMig" in line
    assert "\\n" + FORGED + " \\x1b[31mred\\rX" in line, line
    text = agent.output()
    assert not re.search(r"^" + re.escape(FORGED), text, re.MULTILINE)
    assert "\x1b" not in text and "\r" not in text


def test_streams_outside_the_reserved_share_end_at_their_lifetime(tmp_path: Path) -> None:
    """On the plaintext loopback listener (anonymous, read only) a watch ends after
    api.stream_max_s with UNAVAILABLE; the Unix socket's watch stays open."""
    config = agent_config(
        tmp_path, grpc_insecure_listen="127.0.0.1:0", api={"stream_max_s": LIFETIME_S}
    )
    with (
        InProcessAgent(tmp_path, config) as running,
        grpc.insecure_channel(f"127.0.0.1:{running.node.ports.insecure}") as loopback,
        unix_channel(running.socket) as local,
    ):
        anonymous, admin = watch(loopback), watch(local)
        started = time.monotonic()
        wait_for(anonymous.done, "the loopback watch to end", timeout=10)
        took = time.monotonic() - started
        assert anonymous.code() == grpc.StatusCode.UNAVAILABLE
        assert "api.stream_max_s" in anonymous.details()
        assert LIFETIME_S - 0.2 < took < LIFETIME_S + 3, took
        assert not admin.done()
        admin.cancel()
