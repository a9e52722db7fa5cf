"""The asyncio client of one agent (the coordinator): its gRPC API over mTLS or a socket.

Its methods and their requests are the sync client's (agent/client/requests.py); it only
sends them. Answers are records (agent/wire), errors the agent's domain errors
(agent/wire/errors.py), a dead or unreachable agent `Unreachable`. ``set_sharing`` and
``submit_prewarm`` also take the requests a rollout record keeps as their messages' JSON
(agent.coordinator.rollout.specs).
Channels are made per agent and reused while the caller runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import TypeVar

import grpc

from agent.client.base import ClientTls, channel_options
from agent.client.errors import Unreachable, domain_error
from agent.client.requests import AsyncSender, Call, Requests
from agent.wire.operations import OperationView

__all__ = ["AsyncAgentClient"]

_WATCH_RETRY_S = 1.0
R = TypeVar("R")


class AsyncAgentClient(Requests, AsyncSender):
    """Calls on one agent (`Requests`, awaited); every method raises the agent's domain error,
    or `Unreachable`."""

    def __init__(
        self,
        address: str,
        tls: ClientTls | None,
        *,
        timeout_s: float = 10.0,
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str | None = None,
    ) -> None:
        """``server_name`` (see `ClientTls.name_for`) is what the agent's certificate must
        name; None checks the dialled host."""
        self.address = address
        self.timeout_s = timeout_s
        options = channel_options(server_name if tls is not None else None)
        if tls is None or address.startswith("unix:"):
            self._channel = grpc.aio.insecure_channel(address, options=options)
        else:
            self._channel = grpc.aio.secure_channel(
                address, credentials or tls.credentials(), options=options
            )

    async def close(self) -> None:
        await self._channel.close(None)

    async def _send(self, call: Call[R]) -> R:
        try:
            answer = await call.target(self)(call.request, timeout=call.timeout_s(self.timeout_s))
        except grpc.aio.AioRpcError as exc:
            raise domain_error(exc, self.address) from exc
        return call.decode(answer)

    async def pods_on(self, gpu_indices: Iterable[int]) -> set[tuple[str, str]]:
        """(namespace, pod) of the containers the agent attributes to those GPUs or their MIG
        instances (kubelet's pod-resources, as its telemetry labels them)."""
        wanted = set(gpu_indices)
        snapshot = await self.telemetry()
        return {
            (s.pod.namespace, s.pod.name)
            for s in snapshot.samples
            if s.entity.gpu_index in wanted and s.pod is not None and s.pod.name
        }

    async def watch_operation(self, name: str) -> AsyncIterator[OperationView]:
        """The operation at every change until it is done.

        A broken stream (the agent restarted) is watched again: operations outlive restarts.
        """
        watch = self._watch(name)
        while True:
            stream = watch.target(self)(watch.request)
            try:
                async for answer in stream:
                    op = watch.decode(answer)
                    yield op
                    if op.done:
                        return
            except grpc.aio.AioRpcError as exc:
                error = domain_error(exc, self.address)
                if not isinstance(error, Unreachable):
                    raise error from exc
            finally:
                stream.cancel()
            await asyncio.sleep(_WATCH_RETRY_S)
