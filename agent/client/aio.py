"""The asyncio client of one agent (the coordinator): its gRPC API over mTLS or a socket.

Its methods and their requests are the sync client's (agent/client/requests.py); it only
sends them. Answers are records (agent/wire), errors the agent's domain errors
(agent/wire/errors.py), a dead or unreachable agent `Unreachable`. ``set_sharing`` and
``submit_prewarm`` also take the requests a rollout record keeps as their messages' JSON
(agent.coordinator.rollout.specs).
Channels are made per agent and reused while the caller runs. Given a credentials source
(`agent.client.rotation.ReloadingClientTls.current`, asked before each call) a client whose
certificate was rotated moves to a new channel; the old one closes once its calls are done.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import grpc

from agent.client.base import ClientTls, channel_options
from agent.client.errors import Unreachable, domain_error
from agent.client.requests import AsyncSender, Call, Requests
from agent.wire.operations import OperationView

__all__ = ["AsyncAgentClient"]

_WATCH_RETRY_S = 1.0
#: An old channel closes once its calls are done, or after this many times the client's timeout:
#: the longest deadline a call gets (ResetGpu's, agent/client/requests.py). So no call is cut
#: but a watch, which opens again on the new channel.
RETIRE_AFTER_TIMEOUTS = 4
R = TypeVar("R")


class _Connection:
    """A channel, the credentials it was made with, and its calls in flight."""

    def __init__(
        self, channel: grpc.aio.Channel, credentials: grpc.ChannelCredentials | None = None
    ) -> None:
        self.channel = channel
        self.credentials = credentials
        self._calls = 0
        self._idle = asyncio.Event()
        self._idle.set()
        #: Closed by `retire` with calls still on it: gRPC cancels them (asyncio.CancelledError
        #: in their task, not an RPC error), and a watch opens again on the new channel.
        self.cut = False

    @contextmanager
    def call(self) -> Iterator[None]:
        self._calls += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._calls -= 1
            if not self._calls:
                self._idle.set()

    async def retire(self, grace_s: float) -> None:
        """Close once no call is in flight, or after ``grace_s``."""
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
        except TimeoutError:
            self.cut = True  # what is left is a watch
        await self.channel.close(None)

    def was_cut(self) -> bool:
        """Whether a call's asyncio.CancelledError came from `retire`, not its task's own
        cancellation (which always wins)."""
        task = asyncio.current_task()
        return self.cut and not (task is not None and task.cancelling())


class AsyncAgentClient(Requests, AsyncSender):
    """Calls on one agent (`Requests`, awaited); every method raises the agent's domain error,
    or `Unreachable`."""

    def __init__(
        self,
        address: str,
        tls: ClientTls | None,
        *,
        timeout_s: float = 10.0,
        credentials: Callable[[], grpc.ChannelCredentials] | None = None,
        server_name: str | None = None,
    ) -> None:
        """``server_name`` (see `ClientTls.name_for`) is what the agent's certificate must
        name; None checks the dialled host. ``credentials`` gives the credentials for the next
        call (the same object while they hold); without it ``tls``'s files are read once."""
        self.address = address
        self.timeout_s = timeout_s
        self._options = channel_options(server_name if tls is not None else None)
        self._source: Callable[[], grpc.ChannelCredentials] | None = None
        if tls is None or address.startswith("unix:"):
            self._live = _Connection(grpc.aio.insecure_channel(address, options=self._options))
        else:
            self._source = credentials
            self._live = self._connect(credentials() if credentials else tls.credentials())
        self._channel = self._live.channel
        self._retiring: dict[asyncio.Task[None], _Connection] = {}

    def _connect(self, credentials: grpc.ChannelCredentials) -> _Connection:
        channel = grpc.aio.secure_channel(self.address, credentials, options=self._options)
        return _Connection(channel, credentials)

    def _connection(self) -> _Connection:
        """The channel for the next call: a new one when the credentials changed, the old one
        retired (closed when its calls are done)."""
        now = self._source() if self._source is not None else None
        if now is not None and now is not self._live.credentials:
            old, self._live = self._live, self._connect(now)
            self._channel = self._live.channel
            self._stubs.clear()  # made over the old channel
            grace_s = RETIRE_AFTER_TIMEOUTS * self.timeout_s
            task = asyncio.get_running_loop().create_task(old.retire(grace_s))
            self._retiring[task] = old
            task.add_done_callback(lambda done: self._retiring.pop(done, None))
        return self._live

    async def close(self) -> None:
        retiring = dict(self._retiring)
        for task in retiring:
            task.cancel()
        await asyncio.gather(*retiring, return_exceptions=True)
        for old in retiring.values():
            await old.channel.close(None)
        await self._live.channel.close(None)

    async def _send(self, call: Call[R]) -> R:
        with self._connection().call():
            try:
                answer = await call.target(self)(
                    call.request, timeout=call.timeout_s(self.timeout_s)
                )
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
            connection = self._connection()
            with connection.call():
                stream = watch.target(self)(watch.request)
                try:
                    async for answer in stream:
                        op = watch.decode(answer)
                        yield op
                        if op.done:
                            return
                except grpc.aio.AioRpcError as exc:
                    error = domain_error(exc, self.address)
                    if connection is self._live and not isinstance(error, Unreachable):
                        raise error from exc
                except asyncio.CancelledError:
                    if not connection.was_cut():
                        raise
                finally:
                    stream.cancel()
            if connection is self._live:  # not moved to a rotated certificate: wait a little
                await asyncio.sleep(_WATCH_RETRY_S)
