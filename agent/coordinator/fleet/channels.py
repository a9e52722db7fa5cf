"""The fleet: discovery plus one reused client per agent, and concurrent calls across it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from agent.client import AsyncAgentClient as AgentClient
from agent.client import ClientTls
from agent.client.rotation import ReloadingClientTls
from agent.coordinator.fleet.discovery import Discovery, Target
from agent.coordinator.fleet.inventory import NodeView, node_view, unreachable_view
from agent.errors import AgentError

__all__ = ["Fleet", "Outcome"]

T = TypeVar("T")

#: Calls in flight at once across the fleet: enough to sweep 1,000 agents in well under a
#: second, few enough to keep the coordinator's file descriptors and memory small.
DEFAULT_CONCURRENCY = 256


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    target: Target
    value: T | None = None
    error: AgentError | None = None


class Fleet:
    """The agents now, and a client for each (made on first use, reused, closed at the end).

    The client certificate is re-read when its files change (agent/client/rotation.py): every
    client, made or to be made, then calls with the new one."""

    def __init__(
        self,
        discovery: Discovery,
        tls: ClientTls | None,
        *,
        timeout_s: float = 10.0,
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        self._discovery = discovery
        self._tls = tls
        self._timeout_s = timeout_s
        self._limit = asyncio.Semaphore(concurrency)
        self._clients: dict[tuple[str, str | None], AgentClient] = {}
        # One set of credentials for every channel (grpc then shares the TLS context), re-read
        # when cert-manager rotates the files: each client then moves to a new channel.
        self._credentials = ReloadingClientTls(tls) if tls is not None else None

    async def targets(self) -> tuple[Target, ...]:
        return await self._discovery.targets()

    def client(self, target: Target) -> AgentClient:
        """Raises InvalidSpec when the name the agent's certificate must carry is unknown."""
        server_name = self._tls.name_for(target) if self._tls is not None else None
        # Keyed by the name checked too: a pod IP reused by another agent pod gets a new channel.
        key = (target.address, server_name)
        found = self._clients.get(key)
        if found is None:
            found = AgentClient(
                target.address,
                self._tls,
                timeout_s=self._timeout_s,
                credentials=self._credentials.current if self._credentials else None,
                server_name=server_name,
            )
            self._clients[key] = found
        return found

    async def each(
        self, targets: Sequence[Target], call: Callable[[AgentClient], Awaitable[T]]
    ) -> list[Outcome[T]]:
        """``call`` on every target at once (at most ``concurrency`` in flight), in order."""

        async def one(target: Target) -> Outcome[T]:
            if target.problem is not None:
                return Outcome(target, error=AgentError(target.problem))
            async with self._limit:
                try:
                    return Outcome(target, await call(self.client(target)))
                except AgentError as exc:
                    return Outcome(target, error=exc)

        return list(await asyncio.gather(*(one(t) for t in targets)))

    async def views(
        self, targets: Sequence[Target] | None = None, *, idle_after_s: float | None = None
    ) -> tuple[NodeView, ...]:
        """Every node's inventory (one GetNode each), unreachable ones included.

        With ``idle_after_s`` also each node's count of GPUs idle that long, from the idle
        seconds the agent puts on each GPU of its inventory.
        """
        chosen = await self.targets() if targets is None else targets
        by_address = {t.address: t for t in chosen}

        async def read(client: AgentClient) -> NodeView:
            return node_view(by_address[client.address], await client.node(), idle_after_s)

        outcomes = await self.each(chosen, read)
        views = [
            o.value if o.value is not None else unreachable_view(o.target, str(o.error))
            for o in outcomes
        ]
        return tuple(sorted(views, key=lambda v: v.name))

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
