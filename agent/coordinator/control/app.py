"""The coordinator's composition root: builds the fleet, leader election, reconciler and HTTP
endpoints from its settings and runs them until SIGTERM (``coordinator serve``).

The CLI command only parses flags into `CoordinatorSettings` and calls `run_coordinator`; how
the agents are found and dialled, and the Lease, come from the fleet options (`FleetOptions`,
agent.coordinator.control.connect: the one place those are built).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from agent.backoff import BackoffPolicy
from agent.coordinator.control import status_http
from agent.coordinator.control.cluster import ClusterReport
from agent.coordinator.control.connect import FleetOptions
from agent.coordinator.control.desired import load_desired
from agent.coordinator.control.lease import ElectionTiming, default_identity, while_leading
from agent.coordinator.control.reconcile import Reconciler, Stats
from agent.coordinator.fleet.query import STATUS_PATH
from agent.errors import AgentError, FieldViolation, InvalidSpec
from agent.http import HttpServer
from agent.safeyaml import ascii_int

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CoordinatorSettings:
    desired_path: Path
    interval_s: float
    listen: str
    retry_backoff_s: float | None
    retry_backoff_max_s: float | None
    retry_jitter: float
    status_max_age_s: float
    once: bool
    lease_name: str
    leader_elect: bool | None
    lease_duration_s: float
    renew_deadline_s: float
    retry_period_s: float

    def backoff(self) -> BackoffPolicy:
        base = self.interval_s if self.retry_backoff_s is None else self.retry_backoff_s
        cap = 30 * self.interval_s if self.retry_backoff_max_s is None else self.retry_backoff_max_s
        return BackoffPolicy(base_s=base, max_s=max(base, cap), jitter=self.retry_jitter)


def run_coordinator(settings: CoordinatorSettings, source: FleetOptions) -> int:
    """Run the coordinator; the exit code (non-zero when ``once`` and the pass failed)."""
    host, sep, port = settings.listen.rpartition(":")
    number = ascii_int(port, 5)
    if not sep or number is None or number > 65535:
        raise InvalidSpec(
            f"--listen {settings.listen!r} is not HOST:PORT with a port 0-65535",
            [FieldViolation("listen", "HOST:PORT, e.g. 0.0.0.0:9400")],
        )
    if settings.once and settings.desired_path.exists():
        load_desired(settings.desired_path)  # one run: a file that does not parse is the answer
    return asyncio.run(_main(settings, source, host.strip("[]") or "0.0.0.0", number))


async def _main(settings: CoordinatorSettings, source: FleetOptions, host: str, port: int) -> int:
    once = settings.once
    fleet = source.open(watch=not once)
    kube = source.kube(required=bool(settings.leader_elect))
    identity = default_identity()
    timing = ElectionTiming(
        settings.lease_duration_s, settings.renew_deadline_s, settings.retry_period_s
    )
    elector = None
    if kube is not None and settings.leader_elect is not False:
        elector = source.elector(settings.lease_name, identity=identity, timing=timing)
    cluster = None if kube is None else ClusterReport(kube, source.namespace, identity)
    if elector is None:
        log.warning(
            "no leader election (no Kubernetes API, or --no-leader-elect): replicas keep "
            "max-unavailable by claiming each node on its agent as %s",
            identity,
        )
    status = status_http.StatusEndpoint(fleet, max_age_s=settings.status_max_age_s)
    reconciler = Reconciler(
        fleet,
        settings.desired_path,
        interval_s=settings.interval_s,
        backoff=settings.backoff(),
        elector=None if once else elector,
        cluster=cluster,
        on_sweep=status.observe,
        identity=identity,
    )
    try:
        if once:
            if elector is None:
                await reconciler.pass_once()
            else:
                await while_leading(elector, reconciler.pass_once())
            await reconciler.flush_reports()
            return _once_exit_code(reconciler.stats)
        http = HttpServer(
            {
                "/metrics": reconciler.metrics,
                "/healthz": reconciler.healthz,
                "/readyz": reconciler.readyz,
                STATUS_PATH: status,
            }
        )
        try:
            bound = await http.start(host, port)
        except OSError as exc:  # taken, or an address this host does not have
            raise AgentError(f"cannot serve on --listen {settings.listen}: {exc}") from None
        log.info(
            "coordinator serving /metrics, /healthz and %s on %s:%d; desired state %s",
            STATUS_PATH,
            host,
            bound,
            settings.desired_path,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await reconciler.run(stop)
        finally:
            await http.stop()
        return 0
    finally:
        await fleet.close()


def _once_exit_code(stats: Stats) -> int:
    """--once: 1 when the pass failed; 10 when it ran but left the fleet short of the desired
    state (a rollout halted, a node failed, or nodes that differ left out), as `fleet apply`."""
    if stats.passes["error"]:
        return 1
    failed = sum(n for (_, result), n in stats.changes.items() if result == "failed")
    halted = sorted(kind for kind, on in stats.halted.items() if on)
    left_out = sum(stats.left_out.values())
    if not (failed or halted or left_out):
        return 0
    log.error(
        "the pass left the fleet short of the desired state: %d node(s) failed, %d left out "
        "(unhealthy, not allowed or unreachable)%s",
        failed,
        left_out,
        f"; rollouts halted: {', '.join(halted)}" if halted else "",
    )
    return 10
