"""Who runs where (pids, pods) reaches the mig and admin roles only (docs/security.md), through
every door a reader has: here, an operation's error. A whole agent on a simulated node; the
admin on its Unix socket, a reader on the plaintext loopback listener (the read role)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent._proto.gpuagent.v1 import (
    events_pb2,
    mig_pb2,
    mig_pb2_grpc,
    operations_pb2,
    operations_pb2_grpc,
)
from agent.gpu.sim import SimControl
from tests.integration.test_api_events import Watcher
from tests.unit.api.support import InProcessAgent, agent_config, unix_channel, wait_for

pytestmark = pytest.mark.integration

GPU0_MIG = """\
version: v1
mig-configs:
  gpu0-mig:
    - devices: [0]
      mig-enabled: true
      mig-devices: {}
"""
PID = 4242


def test_a_readers_view_of_a_mig_apply_blocked_by_processes_names_none_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that starts on the GPU after ApplyMig's plan (a pod scheduled meanwhile, or
    the apply queued behind other operations) fails the operation with the processes in the
    way. Its owner and the admin read them; a reader reads that processes blocked it."""
    root = tmp_path / "agent"
    config = agent_config(root, grpc_insecure_listen="127.0.0.1:0")
    with (
        InProcessAgent(root, config) as agent,
        unix_channel(agent.socket) as admin,
        grpc.insecure_channel(f"127.0.0.1:{agent.node.ports.insecure}") as reader,
    ):
        control = SimControl(root / "state")
        service = agent.node.services.mig
        planned = service.apply

        def a_pod_starts_first(*args: Any, **kwargs: Any) -> Any:
            control.start_process(PID, 0, used_memory_mib=1024)
            return planned(*args, **kwargs)

        monkeypatch.setattr(service, "apply", a_pod_starts_first)
        watcher = Watcher(reader, [events_pb2.EVENT_TYPE_OPERATION])
        request = mig_pb2.ApplyMigRequest(config_yaml=GPU0_MIG, config_name="gpu0-mig")
        name = mig_pb2_grpc.MigServiceStub(admin).ApplyMig(request, timeout=20).operation.name
        try:
            ops = {
                who: operations_pb2_grpc.OperationsServiceStub(channel)
                for who, channel in (("admin", admin), ("reader", reader))
            }
            get = operations_pb2.GetOperationRequest(name=name)
            wait_for(lambda: ops["admin"].GetOperation(get, timeout=10).operation.done, "", 20)
            mine = ops["admin"].GetOperation(get, timeout=10).operation
            assert mine.state == operations_pb2.OPERATION_STATE_FAILED
            assert str(PID) in mine.error.message and any(
                str(PID) in b for b in mine.error.blockers
            )

            theirs = ops["reader"].GetOperation(get, timeout=10).operation
            assert theirs.state == operations_pb2.OPERATION_STATE_FAILED
            assert theirs.error.reason == mine.error.reason and theirs.error.code == mine.error.code
            assert "process" in theirs.error.message
            listed = ops["reader"].ListOperations(
                operations_pb2.ListOperationsRequest(), timeout=10
            )
            wait = operations_pb2.WaitOperationRequest(name=name)
            wait.timeout.seconds = 1
            waited = ops["reader"].WaitOperation(wait, timeout=10).operation
            (watched,) = ops["reader"].WatchOperation(
                operations_pb2.WatchOperationRequest(name=name), timeout=10
            )
            wait_for(lambda: any(e.operation.done for e in watcher.of("operation")), "", 5)
            time.sleep(0.2)
            seen = [theirs, *listed.operations, waited, watched.operation]
            seen += [e.operation for e in watcher.of("operation")]
            for op in seen:
                assert str(PID) not in str(op), op
        finally:
            watcher.close()
            control.stop_process(PID)
