"""The gRPC API of a real agent process on a simulated DGX H100: every RPC over TCP with mTLS
and over the Unix socket; who is refused what (roles, which SANs count); who sees processes;
health, reflection (v1 and v1alpha); certificate rotation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, duration_pb2
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from agent._proto.gpuagent.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    events_pb2,
    events_pb2_grpc,
    mig_pb2,
    mig_pb2_grpc,
    operations_pb2,
    operations_pb2_grpc,
    power_pb2,
    power_pb2_grpc,
    prewarm_pb2,
    prewarm_pb2_grpc,
    sharing_pb2,
    sharing_pb2_grpc,
    telemetry_pb2,
    telemetry_pb2_grpc,
)
from agent._proto.grpc.reflection.v1 import reflection_pb2 as v1_pb2
from agent._proto.grpc.reflection.v1 import reflection_pb2_grpc as v1_pb2_grpc
from agent.api.auth import METHOD_ROLES, Role
from agent.api.server import SERVICE_NAMES
from agent.gpu.sim import SimControl
from tests.integration.prewarm_fixtures.origin import Origin
from tests.unit.api.support import (
    COORDINATOR,
    READER,
    AgentProcess,
    Pki,
    agent_config,
    unix_channel,
    wait_for,
)

pytestmark = pytest.mark.integration

# What the node already is (MIG off everywhere): the apply is real but changes nothing, so the
# GPUs stay as the other tests expect.
MIG_CONFIG = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
"""

Call = Callable[[grpc.Channel], object]


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
    # The agent serves the PKI's files through copies, so rotation can replace them in place.
    served = root / "tls"
    served.mkdir()
    for name in ("server.pem", "server.key", "ca.pem"):
        shutil.copy(pki.root / name, served / name)
    config = agent_config(
        root,
        pki,
        grpc_insecure_listen="127.0.0.1:0",
    )
    text = config.read_text().replace(str(pki.root), str(served))
    config.write_text(text)
    with AgentProcess(root, config) as process:
        yield process


def mtls(agent: AgentProcess, pki: Pki, who: str = "coordinator") -> grpc.Channel:
    identity = getattr(pki, who)
    return grpc.secure_channel(f"localhost:{agent.tcp_port}", identity.credentials(pki.ca))


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def every_rpc(channel: grpc.Channel, origin: Origin, tag: str) -> dict[str, grpc.StatusCode]:
    """Call every method of the API once with a sensible request; returns each status code."""
    node = agent_pb2_grpc.NodeServiceStub(channel)
    ops = operations_pb2_grpc.OperationsServiceStub(channel)
    mig = mig_pb2_grpc.MigServiceStub(channel)
    share = sharing_pb2_grpc.SharingServiceStub(channel)
    prewarm = prewarm_pb2_grpc.PrewarmServiceStub(channel)
    telemetry = telemetry_pb2_grpc.TelemetryServiceStub(channel)
    events = events_pb2_grpc.EventsServiceStub(channel)
    power = power_pb2_grpc.PowerServiceStub(channel)
    codes: dict[str, grpc.StatusCode] = {}
    t = 20

    def record(method: str, call: Callable[[], object]) -> None:
        codes[method] = code_of(call)

    watch = events.WatchEvents(events_pb2.WatchEventsRequest(), timeout=t)
    sha = origin.add(f"weights-{tag}.bin", os.urandom(256 * 1024))
    target = prewarm_pb2.PrewarmTarget(
        file=prewarm_pb2.FileTarget(
            url=origin.url(f"weights-{tag}.bin"), sha256=sha, name=f"w-{tag}"
        )
    )
    submitted = prewarm.SubmitPrewarm(
        prewarm_pb2.SubmitPrewarmRequest(targets=[target], request_id=f"warm-{tag}"), timeout=t
    )
    codes["/gpuagent.v1.PrewarmService/SubmitPrewarm"] = grpc.StatusCode.OK
    name = submitted.operation.name
    first_event = next(watch)
    codes["/gpuagent.v1.EventsService/WatchEvents"] = grpc.StatusCode.OK
    assert first_event.event.WhichOneof("payload") == "operation"
    watch.cancel()

    streamed = list(ops.WatchOperation(operations_pb2.WatchOperationRequest(name=name), timeout=t))
    codes["/gpuagent.v1.OperationsService/WatchOperation"] = grpc.StatusCode.OK
    assert streamed[-1].operation.done
    assert streamed[-1].operation.state == operations_pb2.OPERATION_STATE_SUCCEEDED, streamed[-1]

    P = "/gpuagent.v1."
    record(P + "NodeService/GetNode", lambda: node.GetNode(agent_pb2.GetNodeRequest(), timeout=t))
    record(
        P + "PowerService/GetPower", lambda: power.GetPower(power_pb2.GetPowerRequest(), timeout=t)
    )
    at_default = "version: v1\npower: [{gpus: all, limit: 1}]\n"  # changes no limit
    record(
        P + "PowerService/ApplyPower",
        lambda: power.ApplyPower(power_pb2.ApplyPowerRequest(spec_yaml=at_default), timeout=t),
    )
    record(
        P + "PowerService/RestorePower",
        lambda: power.RestorePower(power_pb2.RestorePowerRequest(), timeout=t),
    )
    record(
        P + "OperationsService/GetOperation",
        lambda: ops.GetOperation(operations_pb2.GetOperationRequest(name=name), timeout=t),
    )
    record(
        P + "OperationsService/ListOperations",
        lambda: ops.ListOperations(operations_pb2.ListOperationsRequest(kind="prewarm"), timeout=t),
    )
    record(
        P + "OperationsService/WaitOperation",
        lambda: ops.WaitOperation(
            operations_pb2.WaitOperationRequest(
                name=name, timeout=duration_pb2.Duration(seconds=5)
            ),
            timeout=t,
        ),
    )
    record(
        P + "OperationsService/CancelOperation",
        lambda: ops.CancelOperation(operations_pb2.CancelOperationRequest(name=name), timeout=t),
    )
    record(
        P + "SharingService/GetSharing",
        lambda: share.GetSharing(sharing_pb2.GetSharingRequest(), timeout=t),
    )
    spec = sharing_pb2.SharingSpec(
        strategy=sharing_pb2.SHARING_STRATEGY_TIME_SLICING,
        resources=[sharing_pb2.SharedResource(name="nvidia.com/gpu", replicas=4)],
    )
    record(
        P + "SharingService/SetSharing",
        lambda: share.SetSharing(sharing_pb2.SetSharingRequest(spec=spec), timeout=t),
    )
    record(
        P + "SharingService/RollbackSharing",
        lambda: share.RollbackSharing(sharing_pb2.RollbackSharingRequest(), timeout=t),
    )
    record(
        P + "SharingService/ClearSharing",
        lambda: share.ClearSharing(sharing_pb2.ClearSharingRequest(), timeout=t),
    )
    record(
        P + "PrewarmService/ListPrewarmItems",
        lambda: prewarm.ListPrewarmItems(prewarm_pb2.ListPrewarmItemsRequest(), timeout=t),
    )
    record(
        P + "PrewarmService/ListCache",
        lambda: prewarm.ListCache(prewarm_pb2.ListCacheRequest(), timeout=t),
    )
    record(
        P + "PrewarmService/PinCacheItem",
        lambda: prewarm.PinCacheItem(
            prewarm_pb2.PinCacheItemRequest(item=f"w-{tag}", pinned=False), timeout=t
        ),
    )
    record(
        P + "PrewarmService/EvictCacheItem",
        lambda: prewarm.EvictCacheItem(
            prewarm_pb2.EvictCacheItemRequest(item=f"w-{tag}"), timeout=t
        ),
    )
    # The item is evicted now: cancelling it is refused as a precondition, not an internal error.
    record(
        P + "PrewarmService/CancelPrewarmItem",
        lambda: prewarm.CancelPrewarmItem(
            prewarm_pb2.CancelPrewarmItemRequest(item=f"w-{tag}"), timeout=t
        ),
    )
    record(
        P + "PrewarmService/DeletePrewarmItem",
        lambda: prewarm.DeletePrewarmItem(
            prewarm_pb2.DeletePrewarmItemRequest(item=f"w-{tag}"), timeout=t
        ),
    )
    record(
        P + "TelemetryService/GetTelemetrySnapshot",
        lambda: telemetry.GetTelemetrySnapshot(
            telemetry_pb2.GetTelemetrySnapshotRequest(), timeout=t
        ),
    )
    record(
        P + "MigService/PlanMig",
        lambda: mig.PlanMig(mig_pb2.PlanMigRequest(config_yaml=MIG_CONFIG), timeout=t),
    )
    record(
        P + "MigService/AssertMig",
        lambda: mig.AssertMig(mig_pb2.AssertMigRequest(config_yaml=MIG_CONFIG), timeout=t),
    )
    record(P + "MigService/ExportMig", lambda: mig.ExportMig(mig_pb2.ExportMigRequest(), timeout=t))
    record(P + "MigService/AdviseMig", lambda: mig.AdviseMig(mig_pb2.AdviseMigRequest(), timeout=t))
    record(
        P + "MigService/ResetGpu",
        lambda: mig.ResetGpu(mig_pb2.ResetGpuRequest(gpu_index=0, validate_only=True), timeout=t),
    )
    record(
        P + "TelemetryService/GetMetrics",
        lambda: telemetry.GetMetrics(telemetry_pb2.GetMetricsRequest(), timeout=t),
    )
    record(P + "NodeService/Doctor", lambda: node.Doctor(agent_pb2.DoctorRequest(), timeout=t))
    holder = f"coordinator-{tag}"
    record(
        P + "MigService/ClaimMig",
        lambda: mig.ClaimMig(
            mig_pb2.ClaimMigRequest(holder=holder, rollout=f"r-{tag}", ttl_seconds=30), timeout=t
        ),
    )
    record(
        P + "MigService/GetMigClaim",
        lambda: mig.GetMigClaim(mig_pb2.GetMigClaimRequest(), timeout=t),
    )
    # Released before the unclaimed apply below, which another holder's claim would refuse.
    record(
        P + "MigService/ReleaseMigClaim",
        lambda: mig.ReleaseMigClaim(mig_pb2.ReleaseMigClaimRequest(holder=holder), timeout=t),
    )

    def one_reconfiguration_at_a_time() -> None:  # an earlier pass's apply may still run
        running = ops.ListOperations(
            operations_pb2.ListOperationsRequest(kind="mig.apply", done=False), timeout=t
        ).operations
        for op in running:
            ops.WaitOperation(operations_pb2.WaitOperationRequest(name=op.name), timeout=t)

    one_reconfiguration_at_a_time()
    nothing = b'{"Version": "v1", "MigState": {"Devices": []}}'  # a checkpoint of no GPU
    record(
        P + "MigService/RestoreMig",
        lambda: mig.RestoreMig(mig_pb2.RestoreMigRequest(checkpoint=nothing), timeout=t),
    )
    one_reconfiguration_at_a_time()
    record(
        P + "MigService/ApplyMig",
        lambda: mig.ApplyMig(
            mig_pb2.ApplyMigRequest(config_yaml=MIG_CONFIG, config_name="all-disabled"), timeout=t
        ),
    )
    return codes


def expected_codes() -> dict[str, grpc.StatusCode]:
    codes = dict.fromkeys(METHOD_ROLES, grpc.StatusCode.OK)
    codes["/gpuagent.v1.PrewarmService/CancelPrewarmItem"] = grpc.StatusCode.FAILED_PRECONDITION
    return codes


def served_services(channel: grpc.Channel) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (answer,) = stub.ServerReflectionInfo(iter([request]), timeout=10)
    return {s.name for s in answer.list_services_response.service}


def v1_reflection(channel: grpc.Channel, **request: str) -> v1_pb2.ServerReflectionResponse:
    """One grpc.reflection.v1 exchange, with v1's own messages (as grpcurl sends them)."""
    stub = v1_pb2_grpc.ServerReflectionStub(channel)
    (answer,) = stub.ServerReflectionInfo(
        iter([v1_pb2.ServerReflectionRequest(**request)]), timeout=10
    )
    return answer


def test_every_rpc_over_mtls_and_over_the_unix_socket(
    agent: AgentProcess, pki: Pki, origin: Origin
) -> None:
    """The coordinator (allow-listed) and the local admin (socket) may call everything."""
    with unix_channel(agent.socket) as local:
        assert every_rpc(local, origin, "local") == expected_codes()
    with mtls(agent, pki) as channel:
        assert every_rpc(channel, origin, "mtls") == expected_codes()


def test_the_socket_is_root_only(agent: AgentProcess) -> None:
    assert (agent.socket.stat().st_mode & 0o777) == 0o600


# The probe runs as nobody, who may not read the test venv's interpreter (under /root): the
# system Python runs it, with nothing but the standard library.
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason="needs the system python3")
def test_a_non_root_user_cannot_connect_to_the_socket(agent: AgentProcess) -> None:
    """Only the socket's own mode stops them: its directories are opened for the attempt."""
    opened = []
    for directory in agent.socket.parents:
        mode = directory.stat().st_mode
        if not mode & 0o001:
            opened.append((directory, mode))
            directory.chmod((mode & 0o7777) | 0o001)
    probe = (
        "import errno, socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except OSError as exc:\n"
        "    print(errno.errorcode[exc.errno])\n"
        "else:\n"
        "    print('connected')\n"
    )
    try:
        as_nobody = subprocess.run(
            [SYSTEM_PYTHON, "-c", probe, str(agent.socket)],
            user=65534,
            group=65534,
            capture_output=True,
            text=True,
            timeout=30,
        )
        as_root = subprocess.run(
            [sys.executable, "-c", probe, str(agent.socket)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        for directory, mode in reversed(opened):
            directory.chmod(mode & 0o7777)
    assert as_root.stdout.strip() == "connected", as_root.stderr
    assert as_nobody.stdout.strip() == "EACCES", as_nobody.stderr


def test_health_and_reflection_answer_any_verified_client(agent: AgentProcess, pki: Pki) -> None:
    """Reflection v1 (what current grpcurl asks first) and v1alpha list the same services, and
    v1 describes them; any verified client may use them."""
    with mtls(agent, pki, "reader") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "gpuagent.v1.NodeService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        names = served_services(channel)
        v1 = v1_reflection(channel, list_services="")
        described = v1_reflection(channel, file_containing_symbol="gpuagent.v1.NodeService")
        itself = v1_reflection(
            channel, file_containing_symbol="grpc.reflection.v1.ServerReflection"
        )
    reflection = {"grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"}
    assert {*SERVICE_NAMES, "grpc.health.v1.Health", *reflection} <= names
    assert {s.name for s in v1.list_services_response.service} == names
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in described.file_descriptor_response.file_descriptor_proto
    ]
    assert any(
        f.name == "gpuagent/v1/agent.proto" and "NodeService" in {s.name for s in f.service}
        for f in files
    )
    (own,) = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in itself.file_descriptor_response.file_descriptor_proto
    ]
    assert own.package == "grpc.reflection.v1"
    assert own.service[0].method[0].input_type == ".grpc.reflection.v1.ServerReflectionRequest"


def denied_methods(channel: grpc.Channel) -> set[str]:
    """Every API method the channel's caller is refused (raw bytes: an empty message fits every
    request, and a refusal comes before the request is looked at; admitted streams end at once
    on a request they refuse)."""
    refused_stream = {
        "/gpuagent.v1.OperationsService/WatchOperation": b"",  # no name
        "/gpuagent.v1.EventsService/WatchEvents": events_pb2.WatchEventsRequest(
            types=[999]  # type: ignore[list-item]  # no such type
        ).SerializeToString(),
    }
    denied = set()
    for method in METHOD_ROLES:
        if method in refused_stream:
            call: Callable[..., object] = channel.unary_stream(method)
            request = refused_stream[method]
            code = code_of(lambda call=call, request=request: list(call(request, timeout=10)))
        else:
            call = channel.unary_unary(method)
            code = code_of(lambda call=call: call(b"", timeout=10))
        if code == grpc.StatusCode.PERMISSION_DENIED:
            denied.add(method)
    return denied


def needing(*roles: Role) -> set[str]:
    """Methods none of ``roles`` may call."""
    return {m for m, needed in METHOD_ROLES.items() if needed.isdisjoint(roles)}


def test_a_read_only_identity_reads_but_every_mutation_is_denied(
    agent: AgentProcess, pki: Pki
) -> None:
    with mtls(agent, pki, "reader") as channel:
        node = agent_pb2_grpc.NodeServiceStub(channel).GetNode(
            agent_pb2.GetNodeRequest(), timeout=10
        )
        assert len(node.node.gpus) == 8
        assert denied_methods(channel) == needing(Role.READ)
    assert "/gpuagent.v1.MigService/PlanMig" in needing(Role.READ)
    log = agent.output()
    assert f"denied /gpuagent.v1.SharingService/SetSharing to mTLS client {READER}" in log
    assert "PRIVATE KEY" not in log


def test_email_ip_and_common_name_are_not_identities(agent: AgentProcess, pki: Pki) -> None:
    """Issue 16: a certificate whose email SAN (and CN) is the coordinator's SPIFFE ID, with an
    IP SAN too, holds no role beyond the read every verified client has."""
    with mtls(agent, pki, "impostor") as channel:
        assert denied_methods(channel) == needing(Role.READ)
        share = sharing_pb2_grpc.SharingServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            share.ClearSharing(sharing_pb2.ClearSharingRequest(), timeout=10)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "without URI or DNS SAN" in (caught.value.details() or "")
    assert "needs the role admin or sharing" in (caught.value.details() or "")
    assert "ClearSharing to mTLS client without URI or DNS SAN" in agent.output()


def test_an_agents_serving_certificate_cannot_act_as_a_client(
    agent: AgentProcess, pki: Pki
) -> None:
    """Agent certificates are server auth only (agent-daemonset.yaml): one node's key, even
    with the coordinator's SPIFFE ID in it, is refused as a client by every other agent."""
    serving = pki.issue("serving-only", f"URI:{COORDINATOR}", usage="serverAuth")
    with grpc.secure_channel(f"localhost:{agent.tcp_port}", serving.credentials(pki.ca)) as ch:
        stub = agent_pb2_grpc.NodeServiceStub(ch)
        assert code_of(lambda: stub.GetNode(agent_pb2.GetNodeRequest(), timeout=5)) == (
            grpc.StatusCode.UNAVAILABLE
        )


def test_a_prewarm_team_prewarms_but_cannot_reconfigure_gpus(
    agent: AgentProcess, pki: Pki, origin: Origin
) -> None:
    with mtls(agent, pki, "prewarmer") as channel:
        assert denied_methods(channel) == needing(Role.READ, Role.PREWARM)
        prewarm = prewarm_pb2_grpc.PrewarmServiceStub(channel)
        sha = origin.add("team.bin", os.urandom(64 * 1024))
        target = prewarm_pb2.PrewarmTarget(
            file=prewarm_pb2.FileTarget(url=origin.url("team.bin"), sha256=sha, name="team")
        )
        submitted = prewarm.SubmitPrewarm(
            prewarm_pb2.SubmitPrewarmRequest(targets=[target]), timeout=20
        )
        ops = operations_pb2_grpc.OperationsServiceStub(channel)
        cancel = operations_pb2.CancelOperationRequest(name=submitted.operation.name)
        assert ops.CancelOperation(cancel, timeout=10).operation.name == cancel.name
    # The mig role may cancel MIG operations, not a team's prewarm.
    with mtls(agent, pki, "mig_operator") as channel:
        ops = operations_pb2_grpc.OperationsServiceStub(channel)
        assert code_of(lambda: ops.CancelOperation(cancel, timeout=10)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        assert denied_methods(channel) == needing(Role.READ, Role.MIG)


def test_a_mig_claim_is_its_takers_alone(agent: AgentProcess, pki: Pki) -> None:
    """A claim's holder is a name the caller gives: any mig caller naming the coordinator's
    holder could release its claim, renew it, or apply under it mid-rollout, and so break
    the coordinator's max-unavailable. The claim is bound to the identity that took it."""
    claim = mig_pb2.ClaimMigRequest(holder="coord-a", rollout="r1", ttl_seconds=60)
    with mtls(agent, pki, "coordinator") as channel:
        mig_pb2_grpc.MigServiceStub(channel).ClaimMig(claim, timeout=10)
    try:
        with mtls(agent, pki, "mig_operator") as channel:
            mig = mig_pb2_grpc.MigServiceStub(channel)
            release = mig_pb2.ReleaseMigClaimRequest(holder="coord-a")
            apply = mig_pb2.ApplyMigRequest(
                config_yaml=MIG_CONFIG, config_name="all-disabled", claim_holder="coord-a"
            )
            for call in (
                lambda: mig.ReleaseMigClaim(release, timeout=10),
                lambda: mig.ClaimMig(claim, timeout=10),
                lambda: mig.ApplyMig(apply, timeout=10),
            ):
                with pytest.raises(grpc.RpcError) as caught:
                    call()
                assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "taken by another caller" in (caught.value.details() or "")
            held = mig.GetMigClaim(mig_pb2.GetMigClaimRequest(), timeout=10)
            assert held.claim.holder == "coord-a" and not held.claim.operation
    finally:
        with mtls(agent, pki, "coordinator") as channel:
            done = mig_pb2_grpc.MigServiceStub(channel).ReleaseMigClaim(
                mig_pb2.ReleaseMigClaimRequest(holder="coord-a"), timeout=10
            )
    assert done.released


def test_process_lists_are_shown_to_mig_and_admin_only(agent: AgentProcess, pki: Pki) -> None:
    control = SimControl(agent.state_dir)
    control.start_process(4242, 0, used_memory_mib=2048)
    try:

        def node_as(who: str) -> agent_pb2.Node:
            with mtls(agent, pki, who) as channel:
                stub = agent_pb2_grpc.NodeServiceStub(channel)
                return stub.GetNode(agent_pb2.GetNodeRequest(), timeout=10).node

        def pids(node: agent_pb2.Node) -> list[int]:
            return [p.pid for g in node.gpus for p in g.processes]

        assert wait_for(lambda: pids(node_as("coordinator")) == [4242], "the process", 30)
        mig = node_as("mig_operator")
        assert pids(mig) == [4242] and not mig.processes_hidden
        for who in ("reader", "prewarmer"):
            node = node_as(who)
            assert pids(node) == [] and node.processes_hidden, who
            assert len(node.gpus) == 8
        with mtls(agent, pki, "reader") as channel:
            telemetry = telemetry_pb2_grpc.TelemetryServiceStub(channel)
            request = telemetry_pb2.GetTelemetrySnapshotRequest()
            assert telemetry.GetTelemetrySnapshot(request, timeout=10).snapshot.pods_hidden
        with mtls(agent, pki) as channel:
            telemetry = telemetry_pb2_grpc.TelemetryServiceStub(channel)
            assert not telemetry.GetTelemetrySnapshot(request, timeout=10).snapshot.pods_hidden
    finally:
        control.stop_process(4242)


def test_the_plaintext_loopback_listener_is_read_only(tmp_path: Path) -> None:
    config = agent_config(tmp_path, grpc_insecure_listen="127.0.0.1:0")
    with AgentProcess(tmp_path, config) as process:
        port = _insecure_port(process)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            node = agent_pb2_grpc.NodeServiceStub(channel).GetNode(
                agent_pb2.GetNodeRequest(), timeout=10
            )
            assert node.node.gpus
            share = sharing_pb2_grpc.SharingServiceStub(channel)
            code = code_of(
                lambda: share.ClearSharing(sharing_pb2.ClearSharingRequest(), timeout=10)
            )
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert process.tcp_port is None  # no certificate: no TCP listener besides loopback


def test_fleet_status_through_the_read_only_door_shows_the_node_and_what_was_withheld(
    tmp_path: Path,
) -> None:
    """`fleet status --insecure` on the loopback door (read role): the node answers, so it is
    shown reachable with its GPUs; its process lists are withheld from the role, and the row
    says so instead of reading as unreachable or as idle devices."""
    from agent.cli.fleet import fleet
    from tests.unit.coordinator.agents import invoke

    config = agent_config(tmp_path, grpc_insecure_listen="127.0.0.1:0")
    with AgentProcess(tmp_path, config) as process:
        address = f"127.0.0.1:{_insecure_port(process)}"
        done = invoke(fleet, ["status", "--nodes", "-o", "json", "--agents", address, "--insecure"])
        table = invoke(fleet, ["status", "--nodes", "--agents", address, "--insecure"])
    assert done.exit_code == 0, done.output
    [row] = json.loads(done.output)["nodes"]
    assert row["health"] != "unreachable", row
    assert "processes withheld (read role)" in row["detail"]
    assert len(row["gpus"]) > 0 and row["models"] != "-"
    assert row["idle"] is None and row["withheld"] == ["processes"]
    assert json.loads(done.output)["totals"]["reachable"] == 1
    assert "processes withheld (read role)" in table.output
    assert "unreachable" not in table.output


def _insecure_port(process: AgentProcess) -> int:
    import re

    match = re.search(r"plaintext gRPC on 127\.0\.0\.1:(\d+) \(bound (\d+)\)", process.output())
    assert match, process.output()
    return int(match.group(2))


def test_clients_without_a_certificate_or_from_another_ca_are_refused(
    agent: AgentProcess, pki: Pki
) -> None:
    attempts = {
        "no client certificate": grpc.ssl_channel_credentials(pki.ca.read_bytes()),
        "certificate from an unknown CA": pki.rogue.credentials(pki.ca),
    }
    for why, credentials in attempts.items():
        with grpc.secure_channel(f"localhost:{agent.tcp_port}", credentials) as channel:
            stub = agent_pb2_grpc.NodeServiceStub(channel)
            code = code_of(lambda stub=stub: stub.GetNode(agent_pb2.GetNodeRequest(), timeout=5))
        assert code == grpc.StatusCode.UNAVAILABLE, why  # the TLS handshake fails
    with grpc.insecure_channel(f"localhost:{agent.tcp_port}") as plaintext:
        stub = agent_pb2_grpc.NodeServiceStub(plaintext)
        assert code_of(lambda: stub.GetNode(agent_pb2.GetNodeRequest(), timeout=5)) == (
            grpc.StatusCode.UNAVAILABLE
        )


def test_domain_errors_carry_rich_details(agent: AgentProcess) -> None:
    """A refused sharing config names every bad field in a google.rpc.BadRequest."""
    with unix_channel(agent.socket) as channel:
        share = sharing_pb2_grpc.SharingServiceStub(channel)
        spec = sharing_pb2.SharingSpec(
            strategy=sharing_pb2.SHARING_STRATEGY_TIME_SLICING,
            resources=[sharing_pb2.SharedResource(name="nvidia.com/gpu", replicas=1)],
        )
        with pytest.raises(grpc.RpcError) as caught:
            share.SetSharing(sharing_pb2.SetSharingRequest(spec=spec), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(caught.value)
    assert status is not None
    bad = error_details_pb2.BadRequest()
    assert any(d.Unpack(bad) for d in status.details)
    assert any("replicas" in v.field for v in bad.field_violations), bad


def test_mig_advice_is_a_read_but_tells_a_reader_nothing_about_processes(
    agent: AgentProcess, pki: Pki
) -> None:
    """AdviseMig is open to the read role; whether an instance is in use is process
    information, so a reader's advice is made without it and says so."""
    request = mig_pb2.AdviseMigRequest(gpu_index=0)
    with mtls(agent, pki, "reader") as channel:
        read = mig_pb2_grpc.MigServiceStub(channel).AdviseMig(request, timeout=10)
    with mtls(agent, pki) as channel:
        full = mig_pb2_grpc.MigServiceStub(channel).AdviseMig(request, timeout=10)
    assert read.processes_hidden and not full.processes_hidden
    assert [g.gpu_index for g in read.gpus] == [0]


def test_certificates_rotate_while_clients_stay_connected(
    agent: AgentProcess, pki: Pki, tmp_path: Path
) -> None:
    """cert-manager replaces the files: open connections carry on, new ones get the new set."""
    served = agent.config.parent / "tls"
    before = mtls(agent, pki)
    node = agent_pb2_grpc.NodeServiceStub(before)
    node.GetNode(agent_pb2.GetNodeRequest(), timeout=10)

    rotated = Pki(tmp_path / "rotated")  # a new CA: clients of either CA must now be accepted
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(pki.ca.read_bytes() + rotated.ca.read_bytes())
    for source, name in (
        (rotated.server.key, "server.key"),
        (rotated.server.cert, "server.pem"),
        (bundle, "ca.pem"),
    ):
        staged = served / f".{name}.new"
        shutil.copy(source, staged)
        os.replace(staged, served / name)  # atomic, as a secret volume's symlink swap is

    # The connection made before the rotation still works.
    assert node.GetNode(agent_pb2.GetNodeRequest(), timeout=10).node.gpus

    def new_connection_uses(server_ca: Path, client: Pki) -> bool:
        creds = client.coordinator.credentials(server_ca)
        with grpc.secure_channel(f"localhost:{agent.tcp_port}", creds) as channel:
            stub = agent_pb2_grpc.NodeServiceStub(channel)
            return code_of(lambda: stub.GetNode(agent_pb2.GetNodeRequest(), timeout=5)) == (
                grpc.StatusCode.OK
            )

    assert wait_for(lambda: new_connection_uses(rotated.ca, rotated), "the rotated certificate", 15)
    assert new_connection_uses(rotated.ca, pki)  # old-CA clients are still in the bundle
    assert not new_connection_uses(pki.ca, pki)  # the old server certificate is gone
    assert "TLS certificate files changed" in agent.output()
    before.close()
