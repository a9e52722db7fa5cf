"""How the coordinator reaches the fleet: discovery, mTLS, the Kubernetes API and the Lease.

The one place these are built, for every `fleet` command (the CLI parses its flags into
`FleetOptions`) and for `coordinator serve` (agent.coordinator.control.app). Each part is
imported when it is first built, so a command's --help loads none of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import FieldViolation, InvalidSpec
from agent.safeyaml import ascii_int

if TYPE_CHECKING:
    from agent.coordinator.control.lease import ElectionTiming, LeaderElector
    from agent.coordinator.fleet.channels import Fleet
    from agent.coordinator.fleet.discovery import Discovery
    from agent.coordinator.kube import KubeLister

__all__ = ["FleetOptions"]


@dataclass(frozen=True)
class FleetOptions:
    agents: tuple[str, ...]
    dns: str | None
    kubernetes: bool
    namespace: str
    tls_dir: Path
    tls_cert: Path | None
    tls_key: Path | None
    tls_ca: Path | None
    server_name: str | None
    insecure: bool
    timeout: float

    def open(self, *, watch: bool = False) -> Fleet:
        """The fleet; ``watch`` keeps Kubernetes discovery current by list+watch (serve)."""
        from agent.client import ClientTls
        from agent.coordinator.fleet.channels import Fleet

        discovery = self._discovery(watch)  # where the agents are is asked for first
        tls = None
        if not self.insecure:
            tls = ClientTls(
                self.tls_cert or self.tls_dir / "tls.crt",
                self.tls_key or self.tls_dir / "tls.key",
                self.tls_ca or self.tls_dir / "ca.crt",
                self.server_name or self.default_server_name(),
            )
            if not self._local_only():
                # A missing file is a configuration error here, not N unreachable agents.
                tls.credentials()
        return Fleet(discovery, tls, timeout_s=self.timeout)

    def _local_only(self) -> bool:
        """Every agent is named by its Unix socket (``unix:PATH``), which serves without TLS:
        the client files are not needed and may be absent."""
        listed = self.agents and not self.dns and not self.kubernetes
        return bool(listed) and all(a.startswith("unix:") for a in self.agents)

    def elector(
        self,
        lease: str,
        *,
        identity: str | None = None,
        timing: ElectionTiming | None = None,
        required: bool = False,
    ) -> LeaderElector | None:
        """The elector on the Lease ``lease`` in --namespace, when a Kubernetes API is
        configured (in a pod, or KUBECONFIG); None without one unless ``required``. It gets a
        client of its own (its renewals run on its own thread: agent.coordinator.control.lease),
        sharing no credentials cache or connection with discovery and the reports."""
        from agent.coordinator.control.lease import LeaderElector

        kube = self.kube(required=required)
        return (
            None if kube is None else LeaderElector(kube, self.namespace, lease, identity, timing)
        )

    def kube(self, *, required: bool = False) -> KubeLister | None:
        """The Kubernetes API client (in a pod, or KUBECONFIG); None without one unless
        ``required`` (then NotSupported says why)."""
        from agent.coordinator.kube import KubeLister
        from agent.errors import NotSupported

        try:
            return KubeLister.in_cluster()
        except NotSupported:
            if required:
                raise
            return None

    def default_server_name(self) -> str | None:
        """The name each agent's certificate must carry, when --server-name is not given."""
        # Pod IPs are dialled. Each agent's certificate names its own pod (cert-manager's CSI
        # driver, agent-daemonset.yaml), and Kubernetes discovery knows which pod runs on the
        # node, so the handshake checks this agent is that node's. DNS discovery knows no pods:
        # it needs an explicit --server-name.
        if self._kubernetes():
            return "{pod}.gpu-agent-grpc." + self.namespace + ".svc"
        return None

    def _kubernetes(self) -> bool:
        """Kubernetes discovery: asked for, or in a pod when no other source is given."""
        if self.agents or self.dns:
            return False
        return self.kubernetes or bool(os.environ.get("KUBERNETES_SERVICE_HOST"))

    def _discovery(self, watch: bool = False) -> Discovery:
        from agent.coordinator.fleet import discovery

        chosen = sum((bool(self.agents), bool(self.dns), self.kubernetes))
        if chosen > 1:
            raise InvalidSpec(
                "give one of --agents, --dns or --kubernetes",
                [FieldViolation("discovery", "exactly one source of agents")],
            )
        if self.agents:
            return discovery.StaticDiscovery(self.agents)
        if self.dns:
            name, sep, port = self.dns.partition(":")
            if not name or (sep and not 0 < (ascii_int(port, 5) or 0) < 65536):
                raise InvalidSpec(
                    f"--dns {self.dns!r} is not NAME[:PORT]",
                    [FieldViolation("dns", "NAME[:PORT], e.g. gpu-agent-grpc.gpu-agent.svc:9401")],
                )
            return discovery.DnsDiscovery(name, int(port) if port else discovery.AGENT_PORT)
        if self._kubernetes():
            from agent.coordinator.kube import KubeLister

            return discovery.KubeDiscovery(KubeLister.in_cluster(), self.namespace, watch=watch)
        raise InvalidSpec(
            "where are the agents? give --agents HOST:PORT,..., --dns NAME or --kubernetes",
            [FieldViolation("discovery", "--agents, --dns or --kubernetes")],
        )
