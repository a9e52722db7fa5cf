"""``gpu-agent coordinator serve``: the reconcile loop the coordinator Deployment runs; and how
every coordinator command reaches the agents (discovery and mTLS options)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from agent import logs
from agent.cli.errors import AgentGroup
from agent.cli.options import choice_option, file_option, float_option
from agent.coordinator.control.connect import FleetOptions
from agent.coordinator.fleet.query import DURATION_MAX_S

if TYPE_CHECKING:  # the coordinator is imported when a command runs, not for --help
    from agent.coordinator.fleet.channels import Fleet

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

DEFAULT_DESIRED = Path("/etc/gpu-agent/desired/desired.yaml")


# -- connecting to the fleet (every `fleet` command and `coordinator serve`) -----------------


def fleet_options(fn: F) -> F:
    """The options every fleet command (and `coordinator serve`) uses to reach the agents."""
    options = [
        click.option(
            "--agents",
            default="",
            help="Agents to use, comma-separated HOST:PORT (or unix:PATH for a local agent: its "
            "socket serves without TLS, so no client files are needed).",
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
        float_option(
            "--timeout", low=0.0, low_open=True, high=3600.0, default=10.0, help="Seconds per call."
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
                from agent.coordinator.control.lease import default_identity

                elector = options.elector(lease, identity="fleet-apply/" + default_identity())
            if elector is None:
                return await work(fleet)
            from agent.coordinator.control.lease import while_leading

            return await while_leading(elector, work(fleet))
        finally:
            await fleet.close()

    return asyncio.run(main())


_LEASE_HELP = (
    "coordination.k8s.io Lease (in --namespace) held while changing nodes, shared with "
    "`coordinator serve`; taken when a Kubernetes API is configured (pod or KUBECONFIG)."
)


def lease_option(fn: F, help: str = _LEASE_HELP) -> F:
    """--lease: the Lease a change takes (the coordinator's, so they never act at once)."""
    return click.option(
        "--lease", "lease_name", default="gpu-agent-coordinator", show_default=True, help=help
    )(fn)


def _serve_lease_option(fn: F) -> F:
    """--lease as `coordinator serve` holds it: the one its replicas take turns on."""
    return lease_option(
        fn,
        help="coordination.k8s.io Lease (in --namespace) the replicas take turns on (see "
        "--leader-elect); changes by hand (`fleet apply`, `fleet resume`) are refused while "
        "it is held.",
    )


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
@file_option(
    "--desired",
    "desired_path",
    default=DEFAULT_DESIRED,
    show_default=True,
    help="Desired state YAML (a mounted ConfigMap); re-read every pass. Missing: watch only.",
)
@float_option(
    "--interval",
    low=1.0,
    high=DURATION_MAX_S,
    default=60.0,
    help="Seconds between reconcile passes.",
)
@click.option(
    "--listen",
    default="0.0.0.0:9400",
    show_default=True,
    help="HOST:PORT for /metrics, /healthz and /fleet/status.",
)
@float_option(
    "--retry-backoff",
    low=0.0,
    high=DURATION_MAX_S,
    default=None,
    help="Seconds a node whose change failed is held back before its retry; doubles with "
    "every failure in a row.  [default: --interval]",
)
@float_option(
    "--retry-backoff-max",
    low=0.0,
    high=DURATION_MAX_S,
    default=None,
    help="The longest hold.  [default: 30 x --interval]",
)
@float_option(
    "--retry-jitter",
    low=0.0,
    high=1.0,
    default=0.2,
    help="Each hold is shortened by up to this fraction at random, spreading the retries of "
    "nodes that failed together; 0 for none.",
)
@float_option(
    "--status-max-age",
    low=0.0,
    high=DURATION_MAX_S,
    default=60.0,
    help="GET /fleet/status answers from the latest sweep (a pass's, or a request's) up to "
    "this many seconds old, else sweeps; 0: always sweep. `fleet status --fresh` asks anew.",
)
@click.option(
    "--once",
    is_flag=True,
    help="Run one pass and exit: 1 if it failed, 2 if the desired file does not parse, 10 if it "
    "left nodes failed or left out, or a rollout halted.",
)
@_serve_lease_option
@click.option(
    "--leader-elect/--no-leader-elect",
    default=None,
    help="Act only while holding --lease, so replicas take turns.  "
    "[default: on when a Kubernetes API is configured]",
)
@float_option(
    "--lease-duration",
    low=1.0,
    high=DURATION_MAX_S,
    default=15.0,
    help="Seconds a Lease not renewed stays its holder's (client-go LeaseDuration).",
)
@float_option(
    "--renew-deadline",
    low=0.1,
    high=DURATION_MAX_S,
    default=10.0,
    help="Seconds the leader acts without a successful renewal; < --lease-duration.",
)
@float_option(
    "--retry-period",
    low=0.1,
    high=DURATION_MAX_S,
    default=2.0,
    help="Seconds between attempts to take or renew the Lease.",
)
@choice_option(
    "--log-level",
    choices=["debug", "info", "warning", "error"],
    default="info",
    help="The least severe log lines written to stderr.",
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
    from agent.coordinator.control.app import CoordinatorSettings, run_coordinator

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
