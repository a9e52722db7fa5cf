"""``gpu-agent coordinator serve``: the reconcile loop the coordinator Deployment runs; and how
every coordinator command reaches the agents (discovery and mTLS options)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from agent import logs
from agent.cli.errors import AgentGroup
from agent.errors import FieldViolation, InvalidSpec

if TYPE_CHECKING:  # the coordinator is imported when a command runs, not for --help
    from agent.coordinator.discovery import Discovery
    from agent.coordinator.fleet import Fleet
    from agent.coordinator.kube import KubeLister
    from agent.coordinator.lease import ElectionTiming, LeaderElector

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

DEFAULT_DESIRED = Path("/etc/gpu-agent/desired/desired.yaml")


# -- connecting to the fleet (every `fleet` command and `coordinator serve`) -----------------


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
        from agent.coordinator.fleet import Fleet

        discovery = self._discovery(watch)  # where the agents are is asked for first
        tls = None
        if not self.insecure:
            tls = ClientTls(
                self.tls_cert or self.tls_dir / "tls.crt",
                self.tls_key or self.tls_dir / "tls.key",
                self.tls_ca or self.tls_dir / "ca.crt",
                self.server_name or self.default_server_name(),
            )
            tls.credentials()  # a missing file is a configuration error here, not N unreachable
        return Fleet(discovery, tls, timeout_s=self.timeout)

    def elector(
        self,
        lease: str,
        *,
        identity: str | None = None,
        timing: ElectionTiming | None = None,
        required: bool = False,
    ) -> LeaderElector | None:
        """The elector on the Lease ``lease`` in --namespace, when a Kubernetes API is
        configured (in a pod, or KUBECONFIG); None without one unless ``required``."""
        from agent.coordinator.lease import LeaderElector

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
        from agent.coordinator import discovery

        chosen = sum((bool(self.agents), bool(self.dns), self.kubernetes))
        if chosen > 1:
            raise InvalidSpec(
                "give one of --agents, --dns or --kubernetes",
                [FieldViolation("discovery", "exactly one source of agents")],
            )
        if self.agents:
            return discovery.StaticDiscovery(self.agents)
        if self.dns:
            name, _, port = self.dns.partition(":")
            return discovery.DnsDiscovery(name, int(port) if port else discovery.AGENT_PORT)
        if self._kubernetes():
            from agent.coordinator.kube import KubeLister

            return discovery.KubeDiscovery(KubeLister.in_cluster(), self.namespace, watch=watch)
        raise InvalidSpec(
            "where are the agents? give --agents HOST:PORT,..., --dns NAME or --kubernetes",
            [FieldViolation("discovery", "--agents, --dns or --kubernetes")],
        )


def fleet_options(fn: F) -> F:
    """The options every fleet command (and `coordinator serve`) uses to reach the agents."""
    options = [
        click.option(
            "--agents",
            default="",
            help="Agents to use, comma-separated HOST:PORT (or unix:PATH for a local agent).",
        ),
        click.option(
            "--dns", default=None, help="A name whose every address is an agent: NAME[:PORT]."
        ),
        click.option(
            "--kubernetes",
            is_flag=True,
            help="List the agent DaemonSet's pods with the Kubernetes API (the default in a pod).",
        ),
        click.option(
            "--namespace",
            envvar="POD_NAMESPACE",
            default="gpu-agent",
            show_default=True,
            help="Namespace of the agents (env POD_NAMESPACE).",
        ),
        click.option(
            "--tls-dir",
            type=click.Path(path_type=Path, file_okay=False),
            default=Path("/etc/gpu-agent/tls"),
            show_default=True,
            help="Client certificate tls.crt, key tls.key and the agents' CA ca.crt.",
        ),
        click.option(
            "--tls-cert", type=click.Path(path_type=Path), default=None, help="Overrides TLS dir."
        ),
        click.option(
            "--tls-key", type=click.Path(path_type=Path), default=None, help="Overrides TLS dir."
        ),
        click.option(
            "--tls-ca", type=click.Path(path_type=Path), default=None, help="Overrides TLS dir."
        ),
        click.option(
            "--server-name",
            default=None,
            help="Name to verify in each agent's certificate; {pod} and {node} stand for the "
            "agent's pod and node (default {pod}.gpu-agent-grpc.NAMESPACE.svc with "
            "--kubernetes; none with --dns, which then needs it).",
        ),
        click.option(
            "--insecure", is_flag=True, help="Plaintext: Unix sockets or loopback test agents."
        ),
        click.option(
            "--timeout", type=float, default=10.0, show_default=True, help="Seconds per call."
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


_OPTION_NAMES = (
    "dns",
    "kubernetes",
    "namespace",
    "tls_dir",
    "tls_cert",
    "tls_key",
    "tls_ca",
    "server_name",
    "insecure",
    "timeout",
)


def options_from(kwargs: dict[str, Any]) -> FleetOptions:
    """The connection options out of a command's keyword arguments (they are removed)."""
    agents = tuple(a for a in kwargs.pop("agents").split(",") if a.strip())
    return FleetOptions(agents=agents, **{k: kwargs.pop(k) for k in _OPTION_NAMES})


def run_with_fleet(
    options: FleetOptions,
    work: Callable[[Fleet], Awaitable[T]],
    *,
    lease: str | None = None,
) -> T:
    """Run ``work`` on the fleet in a fresh event loop, closing every channel after.

    With ``lease`` (a change by hand), ``work`` runs holding that Lease when a Kubernetes API
    is configured, and is refused, naming the holder, while another holds it (`coordinator
    serve` acting): a human and the controller never change nodes at once.
    """

    async def main() -> T:
        fleet = options.open()
        try:
            elector = None
            if lease is not None:
                from agent.coordinator.lease import default_identity

                elector = options.elector(lease, identity="fleet-apply/" + default_identity())
            if elector is None:
                return await work(fleet)
            from agent.coordinator.lease import while_leading

            return await while_leading(elector, work(fleet))
        finally:
            await fleet.close()

    return asyncio.run(main())


def lease_option(fn: F) -> F:
    """--lease: the Lease a change takes (the coordinator's, so they never act at once)."""
    return click.option(
        "--lease",
        "lease_name",
        default="gpu-agent-coordinator",
        show_default=True,
        help="coordination.k8s.io Lease (in --namespace) held while changing nodes, shared with "
        "`coordinator serve`; taken when a Kubernetes API is configured (pod or KUBECONFIG).",
    )(fn)


# -- coordinator serve ---------------------------------------------------------------------------


@click.group(cls=AgentGroup)
def coordinator() -> None:
    """The thin central coordinator: keeps the fleet at a desired state.

    \b
    Example:
      gpu-agent coordinator serve --desired desired.yaml --agents n1:9401,n2:9401
    """


@coordinator.command("serve")
@fleet_options
@click.option(
    "--desired",
    "desired_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=DEFAULT_DESIRED,
    show_default=True,
    help="Desired state YAML (a mounted ConfigMap); re-read every pass. Missing: watch only.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=1.0),
    default=60.0,
    show_default=True,
    help="Seconds between reconcile passes.",
)
@click.option(
    "--listen",
    default="0.0.0.0:9400",
    show_default=True,
    help="HOST:PORT for /metrics, /healthz and /fleet/status.",
)
@click.option(
    "--retry-backoff",
    type=click.FloatRange(min=0.0),
    default=None,
    help="Seconds a node whose change failed is held back before its retry; doubles with "
    "every failure in a row.  [default: --interval]",
)
@click.option(
    "--retry-backoff-max",
    type=click.FloatRange(min=0.0),
    default=None,
    help="The longest hold.  [default: 30 x --interval]",
)
@click.option(
    "--retry-jitter",
    type=click.FloatRange(min=0.0, max=1.0),
    default=0.2,
    show_default=True,
    help="Each hold is shortened by up to this fraction at random, spreading the retries of "
    "nodes that failed together; 0 for none.",
)
@click.option(
    "--status-max-age",
    type=click.FloatRange(min=0.0),
    default=60.0,
    show_default=True,
    help="GET /fleet/status answers from the latest sweep (a pass's, or a request's) up to "
    "this many seconds old, else sweeps; 0: always sweep. `fleet status --fresh` asks anew.",
)
@click.option("--once", is_flag=True, help="Run one pass and exit (non-zero if it failed).")
@lease_option
@click.option(
    "--leader-elect/--no-leader-elect",
    default=None,
    help="Act only while holding --lease, so replicas take turns.  "
    "[default: on when a Kubernetes API is configured]",
)
@click.option(
    "--lease-duration",
    type=click.FloatRange(min=1.0),
    default=15.0,
    show_default=True,
    help="Seconds a Lease not renewed stays its holder's (client-go LeaseDuration).",
)
@click.option(
    "--renew-deadline",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds the leader acts without a successful renewal; < --lease-duration.",
)
@click.option(
    "--retry-period",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between attempts to take or renew the Lease.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
def serve(
    desired_path: Path,
    interval: float,
    listen: str,
    retry_backoff: float | None,
    retry_backoff_max: float | None,
    retry_jitter: float,
    status_max_age: float,
    once: bool,
    lease_name: str,
    leader_elect: bool | None,
    lease_duration: float,
    renew_deadline: float,
    retry_period: float,
    log_level: str,
    **kwargs: Any,
) -> None:
    """Reconcile the fleet to --desired every --interval seconds, serving /metrics and /healthz.

    It also answers GET /fleet/status (what `fleet status -o json` prints) over its open
    channels: `gpu-agent fleet status --coordinator http://HOST:PORT`.

    Each pass: find the agents, compare each node with the desired MIG layout, sharing and
    warm items, and roll the differences out with the desired max-unavailable and
    max-failures. A node whose change failed is held back from the next passes, twice as long
    after every failure in a row (--retry-backoff, --retry-backoff-max); it is retried at once
    when the desired change for it changes. Nothing else is kept between passes but metrics:
    the agents and the file are the state.

    With leader election (on wherever a Kubernetes API is configured), replicas take turns
    on the coordination.k8s.io Lease --lease: only the holder reconciles; a replica that
    cannot renew it for --renew-deadline stops before another may take it (--lease-duration).
    /healthz says the loop makes progress; /readyz says it leads or is a working standby.

    \b
    Example:
      gpu-agent coordinator serve --kubernetes --desired /etc/gpu-agent/desired/desired.yaml
    """
    from agent.coordinator.app import CoordinatorSettings, run_coordinator

    logs.configure(log_level)
    settings = CoordinatorSettings(
        desired_path=desired_path,
        interval_s=interval,
        listen=listen,
        retry_backoff_s=retry_backoff,
        retry_backoff_max_s=retry_backoff_max,
        retry_jitter=retry_jitter,
        status_max_age_s=status_max_age,
        once=once,
        lease_name=lease_name,
        leader_elect=leader_elect,
        lease_duration_s=lease_duration,
        renew_deadline_s=renew_deadline,
        retry_period_s=retry_period,
    )
    code = run_coordinator(settings, options_from(kwargs))
    if code:
        raise SystemExit(code)
