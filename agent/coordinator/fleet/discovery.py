"""Where the agents are: a static list, a DNS name, or the agent DaemonSet's pods.

Discovery answers each time it is asked and remembers nothing, so a node that joins or leaves
shows up in the next sweep (the thin-coordinator rule: Kubernetes and DNS hold the fleet).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agent.coordinator.kube import AgentPod, KubeLister, agent_pod, labels_by_node
from agent.errors import AgentError, FieldViolation, InvalidSpec
from agent.safeyaml import ascii_int

log = logging.getLogger(__name__)

__all__ = [
    "AGENT_PORT",
    "AGENT_SELECTOR",
    "Discovery",
    "DnsDiscovery",
    "KubeDiscovery",
    "StaticDiscovery",
    "Target",
    "join_host_port",
]

AGENT_PORT = 9401
AGENT_SELECTOR = "app.kubernetes.io/name=gpu-agent,app.kubernetes.io/component=agent"


@dataclass(frozen=True, slots=True)
class Target:
    """One agent to dial. ``node`` is known up front only from Kubernetes."""

    address: str
    node: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    #: why this agent cannot be dialled (e.g. its pod has no IP yet); None when it can.
    problem: str | None = None
    #: the agent pod running on ``node`` (Kubernetes discovery): its serving certificate names
    #: this pod, and the coordinator checks that it does.
    pod: str | None = None
    #: False when the node's labels could not be read (an API outage): ``labels`` is then
    #: empty for want of an answer, not because the node has none.
    labels_known: bool = True


class Discovery(Protocol):
    async def targets(self) -> tuple[Target, ...]:
        """The agents now."""
        ...


def join_host_port(host: str, port: int) -> str:
    try:
        is_v6 = ipaddress.ip_address(host).version == 6
    except ValueError:
        is_v6 = False
    return f"[{host}]:{port}" if is_v6 else f"{host}:{port}"


def _check_address(address: str) -> str:
    if address.startswith("unix:") and address.removeprefix("unix:"):
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not host or not 0 < (ascii_int(port, 5) or 0) < 65536:
        raise InvalidSpec(
            f"agent address {address!r} is not HOST:PORT (or unix:PATH)",
            [FieldViolation("agents", "HOST:PORT, [IPv6]:PORT or unix:PATH, e.g. node-1:9401")],
        )
    return address


class StaticDiscovery:
    def __init__(self, addresses: Sequence[str]) -> None:
        # One address given twice is one agent, dialled once.
        given = dict.fromkeys(_check_address(a.strip()) for a in addresses if a.strip())
        self._targets = tuple(Target(a) for a in given)
        if not self._targets:
            raise InvalidSpec(
                "no agent addresses given", [FieldViolation("agents", "at least one HOST:PORT")]
            )

    async def targets(self) -> tuple[Target, ...]:
        return self._targets


Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


async def _getaddrinfo(host: str, port: int) -> Sequence[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class DnsDiscovery:
    """Every address of a name is an agent: a headless Service returns one per ready pod."""

    def __init__(self, name: str, port: int = AGENT_PORT, resolve: Resolver = _getaddrinfo) -> None:
        self._name = name
        self._port = port
        self._resolve = resolve

    async def targets(self) -> tuple[Target, ...]:
        try:
            addresses = await self._resolve(self._name, self._port)
        except OSError as exc:
            raise AgentError(f"cannot resolve {self._name}: {exc}") from exc
        unique = sorted(set(addresses))
        return tuple(Target(join_host_port(a, self._port)) for a in unique)


#: How long a first list may take before discovery answers without it.
SYNC_TIMEOUT_S = 30.0


class KubeDiscovery:
    """The agent DaemonSet's pods, read from the Kubernetes API, with their nodes' labels.

    One-shot commands list both each time. With ``watch`` (`coordinator serve`) both are
    kept by list+watch (`agent.kube.Informer`): after the first list a pass costs the API
    server nothing, and a change lands as it happens.
    """

    def __init__(
        self,
        lister: KubeLister,
        namespace: str,
        selector: str = AGENT_SELECTOR,
        port: int = AGENT_PORT,
        *,
        watch: bool = False,
    ) -> None:
        self._lister = lister
        self._namespace = namespace
        self._selector = selector
        self._port = port
        self._pods = lister.pod_informer(namespace, selector) if watch else None
        self._nodes = lister.node_informer() if watch else None
        self._started = False

    def close(self) -> None:
        for informer in (self._pods, self._nodes):
            if informer is not None:
                informer.stop()

    async def _watched(self) -> tuple[tuple[AgentPod, ...], Mapping[str, Mapping[str, str]] | None]:
        assert self._pods is not None and self._nodes is not None
        if not self._started:
            self._started = True
            self._pods.start()
            self._nodes.start()
        for informer in (self._pods, self._nodes):
            await asyncio.to_thread(informer.synced.wait, SYNC_TIMEOUT_S)
        if not self._pods.synced.is_set():
            raise AgentError(f"cannot list the agent pods: {self._pods.error or 'no answer'}")
        pods = tuple(agent_pod(item) for item in self._pods.objects())
        if not (self._nodes.synced.is_set() and self._nodes.healthy):
            # A cache that may be stale is not read as current labels.
            log.warning("node labels unavailable, nodes are marked unknown: %s", self._nodes.error)
            return pods, None
        return pods, labels_by_node(self._nodes.objects())

    async def _listed(self) -> tuple[tuple[AgentPod, ...], Mapping[str, Mapping[str, str]] | None]:
        pods = await asyncio.to_thread(self._lister.agent_pods, self._namespace, self._selector)
        try:
            return pods, await asyncio.to_thread(self._lister.node_labels_all)
        except AgentError as exc:
            # Unknown, not empty: rules on labels hold these nodes (no change) until it reads.
            log.warning("node labels unavailable, nodes are marked unknown: %s", exc)
            return pods, None

    async def targets(self) -> tuple[Target, ...]:
        pods, read = await (self._watched() if self._pods is not None else self._listed())
        known = read is not None
        labels = read or {}
        out = []
        for pod in sorted(pods, key=lambda p: (p.node, p.name)):
            problem = None
            if pod.ip is None:
                problem = f"agent pod {pod.name} is {pod.phase} with no IP"
            elif pod.invalid is not None:
                problem = f"agent pod {pod.name}: {pod.invalid}"
            elif pod.terminating:  # stopping: no change through it, nor a second node entry
                problem = f"agent pod {pod.name} is terminating"
            elif not pod.ready:
                problem = f"agent pod {pod.name} is not ready ({pod.phase})"
            address = join_host_port(pod.ip, pod.grpc_port or self._port) if pod.ip else ""
            if pod.ip and pod.invalid is not None:
                address = pod.ip  # no port is known: its field is invalid, the default no guess
            node_labels = labels.get(pod.node, {})
            out.append(
                Target(
                    address,
                    pod.node or None,
                    node_labels,
                    problem,
                    pod=pod.name or None,
                    labels_known=known,
                )
            )
        return tuple(out)
