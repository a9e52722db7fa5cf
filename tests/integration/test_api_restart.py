"""Operations outlive the agent process: after kill -9 or SIGTERM in the middle of long work,
the restarted agent reports how each operation ended; none stays "running" forever."""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest

from agent._proto.gpuagent.v1 import (
    operations_pb2,
    operations_pb2_grpc,
    prewarm_pb2,
    prewarm_pb2_grpc,
)
from tests.integration.prewarm_fixtures.origin import Origin
from tests.unit.api.support import AgentProcess, agent_config, unix_channel, wait_for

pytestmark = pytest.mark.integration

SIZE = 4 * 1024 * 1024
RATE = 256 * 1024  # 16 s for the whole file: the agent is stopped long before


def start_slow_prewarm(agent: AgentProcess, origin: Origin) -> str:
    sha = origin.add("model.bin", os.urandom(SIZE))
    origin.faults.rate_bps["/model.bin"] = RATE
    target = prewarm_pb2.PrewarmTarget(
        file=prewarm_pb2.FileTarget(url=origin.url("model.bin"), sha256=sha, name="model")
    )
    with unix_channel(agent.socket) as channel:
        answer = prewarm_pb2_grpc.PrewarmServiceStub(channel).SubmitPrewarm(
            prewarm_pb2.SubmitPrewarmRequest(targets=[target], request_id="warm-model"), timeout=10
        )
        name = answer.operation.name
        ops = operations_pb2_grpc.OperationsServiceStub(channel)

        def fetching() -> bool:
            op = ops.GetOperation(operations_pb2.GetOperationRequest(name=name), timeout=10)
            items = op.operation.metadata.prewarm.items
            return op.operation.state == operations_pb2.OPERATION_STATE_RUNNING and any(
                i.done_bytes > 0 for i in items
            )

        wait_for(fetching, "the prewarm to be under way with its progress saved", 30, 0.2)
    return name


def get(agent: AgentProcess, name: str) -> operations_pb2.Operation:
    with unix_channel(agent.socket) as channel:
        ops = operations_pb2_grpc.OperationsServiceStub(channel)
        return ops.GetOperation(operations_pb2.GetOperationRequest(name=name), timeout=10).operation


def test_kill_9_during_an_operation_is_reported_after_the_restart(
    tmp_path: Path, origin: Origin
) -> None:
    agent = AgentProcess(tmp_path, agent_config(tmp_path))
    try:
        agent.start()
        name = start_slow_prewarm(agent, origin)
        agent.kill()
        agent.start()
        op = get(agent, name)
        assert op.done and op.state == operations_pb2.OPERATION_STATE_FAILED
        assert op.error.reason == "Interrupted"
        assert op.error.code == grpc.StatusCode.ABORTED.value[0]
        assert "killed or restarted" in op.error.message
        assert op.metadata.prewarm.items[0].done_bytes > 0  # the last progress it saved
        # The retried request finds the first operation instead of starting another.
        with unix_channel(agent.socket) as channel:
            prewarm = prewarm_pb2_grpc.PrewarmServiceStub(channel)
            retry = prewarm.SubmitPrewarm(
                prewarm_pb2.SubmitPrewarmRequest(
                    targets=[
                        prewarm_pb2.PrewarmTarget(
                            file=prewarm_pb2.FileTarget(
                                url=origin.url("model.bin"),
                                sha256=op_sha(origin),
                                name="model",
                            )
                        )
                    ],
                    request_id="warm-model",
                ),
                timeout=10,
            )
        assert retry.operation.name == name and retry.operation.done
    finally:
        agent.stop()


def op_sha(origin: Origin) -> str:
    import hashlib

    return hashlib.sha256((origin.root / "model.bin").read_bytes()).hexdigest()


def test_sigterm_checkpoints_the_operation_and_exits_within_the_grace_period(
    tmp_path: Path, origin: Origin
) -> None:
    agent = AgentProcess(tmp_path, agent_config(tmp_path))
    try:
        agent.start()
        name = start_slow_prewarm(agent, origin)
        started = time.monotonic()
        assert agent.terminate(timeout=30) == 0
        assert time.monotonic() - started < 20
        assert not agent.socket.exists()
        log = agent.output()
        assert f"operation {name.split('/')[1]} checkpointed at shutdown" in log
        agent.start()
        op = get(agent, name)
        assert op.done and op.error.reason == "Interrupted"
    finally:
        agent.stop()
