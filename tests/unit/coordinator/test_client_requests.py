"""Every request of the agent's API is built once (agent/client/requests.py) and both clients
only send it: the sync and asyncio clients have the same methods, building the same calls."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent._proto.gpuagent.v1 import mig_pb2, prewarm_pb2, sharing_pb2
from agent.client import AgentClient, AsyncAgentClient
from agent.client.requests import Call, Requests, SyncSender, rpc


class Recorder(Requests, SyncSender):
    """A client that keeps each call it is asked to send instead of sending it."""

    def __init__(self) -> None:
        self._channel = grpc.insecure_channel("unix:/nonexistent/agent.sock")
        self.sent: list[Call[Any]] = []

    def _send(self, call: Call[Any]) -> Any:
        self.sent.append(call)
        return None


RPCS = sorted(name for name, value in vars(Requests).items() if isinstance(value, rpc))


def test_both_clients_send_every_request_with_the_same_signature() -> None:
    """A new RPC is one method of `Requests`; neither client defines its own."""
    assert "node" in RPCS and "reset_gpu" in RPCS
    for name in RPCS:
        for client in (AgentClient, AsyncAgentClient):
            assert name not in vars(client), f"{client.__name__} defines {name} itself"
    sync = AgentClient(Path("/nonexistent/agent.sock"))

    async def signatures() -> None:
        aio = AsyncAgentClient("unix:/nonexistent/agent.sock", None)
        try:
            for name in RPCS:
                assert inspect.signature(getattr(sync, name)) == inspect.signature(
                    getattr(aio, name)
                ), name
        finally:
            await aio.close()

    try:
        asyncio.run(signatures())
    finally:
        sync.close()


def test_a_call_carries_the_callers_arguments_to_a_real_stub_method() -> None:
    client = Recorder()
    client.apply_mig("version: v1", "all-1g", request_id="r1", claim_holder="rollout/7")
    client.set_sharing(sharing_pb2.SetSharingRequest(config_yaml="version: v1\n"))
    client.reset_gpu(3, validate_only=True)
    apply, share, reset = client.sent
    assert apply.request == mig_pb2.ApplyMigRequest(
        config_yaml="version: v1", config_name="all-1g", request_id="r1", claim_holder="rollout/7"
    )
    assert share.request == sharing_pb2.SetSharingRequest(config_yaml="version: v1\n")
    assert reset.request == mig_pb2.ResetGpuRequest(gpu_index=3, validate_only=True)
    for call in client.sent:
        assert callable(call.target(client)), (call.stub, call.method)
    # A reset may take the driver a while; other calls keep the client's timeout.
    assert (apply.timeout_s(10.0), reset.timeout_s(10.0)) == (10.0, 40.0)


@pytest.mark.parametrize(
    "targets",
    [[], [prewarm_pb2.PrewarmTarget()]],
    ids=["none", "as-a-rollout-record-keeps-them"],
)
def test_stored_prewarm_targets_are_sent_as_they_are(targets: list[Any]) -> None:
    client = Recorder()
    client.submit_prewarm(targets, request_id="r2")
    (call,) = client.sent
    assert call.request == prewarm_pb2.SubmitPrewarmRequest(targets=targets, request_id="r2")
