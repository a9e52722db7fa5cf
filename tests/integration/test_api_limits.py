"""Limits of the API on a real agent: message size and deadlines."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2

from agent._proto.gpuagent.v1 import (
    operations_pb2,
    operations_pb2_grpc,
    prewarm_pb2,
    prewarm_pb2_grpc,
    sharing_pb2,
    sharing_pb2_grpc,
)
from agent.api.server import MAX_RECEIVE_BYTES
from tests.integration.prewarm_fixtures.origin import Origin
from tests.unit.api.support import AgentProcess, agent_config, unix_channel

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    root = tmp_path_factory.mktemp("limits")
    with AgentProcess(root, agent_config(root)) as process:
        yield process


def test_a_request_over_the_size_limit_is_refused(agent: AgentProcess) -> None:
    huge = "x" * (MAX_RECEIVE_BYTES + 1)
    with unix_channel(agent.socket) as channel:
        share = sharing_pb2_grpc.SharingServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            share.SetSharing(sharing_pb2.SetSharingRequest(config_yaml=huge), timeout=10)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_wait_answers_before_the_callers_deadline(agent: AgentProcess, tmp_path: Path) -> None:
    with Origin(tmp_path) as origin, unix_channel(agent.socket) as channel:
        origin.add("slow.bin", b"\0" * (2 * 1024 * 1024))
        origin.faults.rate_bps["/slow.bin"] = 128 * 1024
        target = prewarm_pb2.PrewarmTarget(
            file=prewarm_pb2.FileTarget(url=origin.url("slow.bin"), name="slow")
        )
        op = (
            prewarm_pb2_grpc.PrewarmServiceStub(channel)
            .SubmitPrewarm(prewarm_pb2.SubmitPrewarmRequest(targets=[target]), timeout=10)
            .operation
        )
        ops = operations_pb2_grpc.OperationsServiceStub(channel)
        started = time.monotonic()
        waited = ops.WaitOperation(
            operations_pb2.WaitOperationRequest(
                name=op.name, timeout=duration_pb2.Duration(seconds=60)
            ),
            timeout=1.0,
        ).operation
        took = time.monotonic() - started
        assert not waited.done and 0.5 < took < 1.0
        with pytest.raises(grpc.RpcError) as caught:
            list(
                ops.WatchOperation(operations_pb2.WatchOperationRequest(name=op.name), timeout=0.5)
            )
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        ops.CancelOperation(operations_pb2.CancelOperationRequest(name=op.name), timeout=10)
        ended = ops.WaitOperation(
            operations_pb2.WaitOperationRequest(
                name=op.name, timeout=duration_pb2.Duration(seconds=20)
            ),
            timeout=30,
        ).operation
        assert ended.state == operations_pb2.OPERATION_STATE_CANCELLED, ended
