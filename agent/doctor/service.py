"""The doctor: every check in one run (agent/doctor/runner.py), its latest answer as the
``gpu_agent_doctor_check_state`` gauge, and its summary in the log.

The agent runs it at start-up (the log then begins with what does not work and the fix), every
``REFRESH_S`` after, and for every ``Doctor`` call; the gauge shows the latest run's states.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from agent.doctor import api_checks, gpu_checks, kube_checks, node_checks
from agent.doctor.facts import NEEDS_NVML, ApiServer, Facts
from agent.doctor.runner import DEADLINE_S, Probe, run_checks
from agent.mig.journal import reboot_waits
from agent.tasks import Need, Task
from agent.wire.doctor import Check, CheckState, DoctorReport

if TYPE_CHECKING:
    from agent.config import AgentConfig
    from agent.dra.mode import Allocation
    from agent.gpu.attach import DriverLink
    from agent.health.monitor import HealthMonitor
    from agent.kube_edge import KubeEdge
    from agent.mig.service import MigService
    from agent.power.service import PowerService
    from agent.state import StateStore
    from agent.telemetry.service import TelemetryService

__all__ = ["CHECKS", "REFRESH_S", "Doctor", "build_doctor", "check_line", "count_line"]

log = logging.getLogger(__name__)

#: How often a running agent runs its checks again for the gauge (each run makes one
#: SelfSubjectAccessReview per verb in a cluster: rare, so a fleet does not load the API).
REFRESH_S = 3600.0
#: How often the agent looks (in its own informers: no request) whether its Kubernetes watches
#: came back, to ask the API checks again that were answered while they were away.
KUBE_RECHECK_S = 30.0

#: (duty, name, check) in the order they are shown.
CHECKS: tuple[tuple[str, str, Callable[[Facts], Check]], ...] = (
    ("telemetry", "nvml", gpu_checks.telemetry_nvml),
    ("telemetry", "profiling", gpu_checks.telemetry_profiling),
    ("telemetry", "pod-resources", gpu_checks.telemetry_pod_resources),
    ("mig", "capability", gpu_checks.mig_capability),
    ("mig", "allocation-mode", gpu_checks.mig_allocation_mode),
    ("mig", "pending", gpu_checks.mig_pending),
    ("mig", "journal", gpu_checks.mig_journal),
    ("mig", "operand-labels", gpu_checks.mig_operand_labels),
    ("sharing", "plugin-config", node_checks.sharing_plugin_config),
    ("sharing", "reload", node_checks.sharing_reload),
    ("sharing", "mig-strategy", node_checks.sharing_mig_strategy),
    ("prewarm", "cache-volume", node_checks.prewarm_cache_volume),
    ("prewarm", "in-use", node_checks.prewarm_in_use),
    ("prewarm", "containerd", node_checks.prewarm_containerd),
    ("prewarm", "nydus", node_checks.prewarm_nydus),
    ("prewarm", "dragonfly", node_checks.prewarm_dragonfly),
    ("prewarm", "egress", node_checks.prewarm_egress),
    ("prewarm", "private-images", node_checks.prewarm_private_images),
    ("power", "limits", gpu_checks.power_limits),
    ("health", "xid", gpu_checks.health_xid),
    ("api", "socket-dir", api_checks.api_socket_dir),
    ("api", "tls", api_checks.api_tls),
    ("api", "roles", api_checks.api_roles),
    ("kubernetes", "reachable", kube_checks.kube_reachable),
    ("kubernetes", "rbac", kube_checks.kube_rbac),
    ("kubernetes", "api-versions", kube_checks.kube_api_versions),
    ("state", "dir", node_checks.state_dir),
)
_GAUGE_VALUE = {CheckState.OK: 0, CheckState.DEGRADED: 1, CheckState.FAILED: 2}


def check_line(check: Check) -> str:
    return (
        f"doctor: {check.duty}/{check.name} {check.state.value}: {check.evidence}; fix: {check.fix}"
    )


def count_line(report: DoctorReport) -> str:
    counts = {s: sum(1 for c in report.checks if c.state is s) for s in CheckState}
    return (
        f"doctor: {len(report.checks)} checks: {counts[CheckState.OK]} ok, "
        f"{counts[CheckState.DEGRADED]} degraded, {counts[CheckState.FAILED]} failed "
        "(gpu-agent doctor for the table)"
    )


class Doctor(Collector):
    """Runs the checks over ``facts``; thread-safe. Never raises from a run."""

    def __init__(
        self,
        facts: Facts,
        deadline_s: float = DEADLINE_S,
        kube_current: Callable[[], bool] | None = None,
    ) -> None:
        """``kube_current``: whether the agent's Kubernetes watches are current (the edge)."""
        self.facts = facts
        self._deadline_s = deadline_s
        self._kube_current = kube_current
        #: whether the watches were current when the kept API answers were asked
        self._asked_current = True
        self._lock = threading.Lock()
        self._latest: DoctorReport | None = None
        #: the latest answers of the checks that asked the API server, by (duty, name)
        self._asked: Mapping[tuple[str, str], Check] = {}
        self._logged = False
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each run (on the running thread; /metrics republishes)."""
        self._listeners.append(listener)

    @property
    def latest(self) -> DoctorReport | None:
        return self._latest

    def run(self, *, ask_api: bool = True) -> DoctorReport:
        """Every check now (blocking: up to the deadline); without ``ask_api``, the checks that
        asked the API server at their last run keep that answer (when there is one)."""
        facts = self.facts
        kept = {} if ask_api else self._asked
        current = self._kube_current() if ask_api and self._kube_current is not None else True
        asking: dict[tuple[str, str], _Asking] = {}
        probes = []
        for duty, name, check in CHECKS:
            if (duty, name) in kept:
                probes.append(Probe(duty, name, _kept(kept[(duty, name)])))
                continue
            own = facts
            if facts.kube is not None:  # each its own, so that what asked is known
                asking[(duty, name)] = _Asking(facts.kube)
                own = dataclasses.replace(facts, kube=asking[(duty, name)])
            probes.append(Probe(duty, name, _bind(check, own)))
        report = DoctorReport(facts.config.node_name, run_checks(probes, self._deadline_s))
        keys = [((c.duty, c.name), c) for c in report.checks]
        asked = {k: c for k, c in keys if k in kept or (k in asking and asking[k].asked)}
        with self._lock:
            self._latest, self._asked = report, asked
            if ask_api:
                self._asked_current = current
        for listener in self._listeners:
            listener()
        return report

    def tasks(self) -> list[Task]:
        """In the agent itself: its log starts with the summary."""
        tasks = [Task("doctor", self.refresh, REFRESH_S, needs=Need.LISTENER)]
        if self._kube_current is not None:
            needs = Need.LISTENER | Need.KUBE
            tasks.append(Task("doctor recheck", self.recheck, KUBE_RECHECK_S, (), needs, True))
        return tasks

    def recheck(self) -> bool:
        """Ask the API server again (a whole run) when the kept answers were asked while the
        watches were not current, they are now, and an answer is not ok: an agent started in
        an API outage said kubernetes/reachable failed until the next `gpu-agent doctor`, the
        watches long back. Answers all ok, or watches still away: nothing is sent."""
        if self._kube_current is None or self._asked_current or not self._logged:
            return False
        if not self._kube_current():
            return False
        if all(c.state is CheckState.OK for c in self._asked.values()):
            self._asked_current = True  # nothing a recovery would change
            return False
        report = self.run()
        log.info("the Kubernetes watches are current again: %s", count_line(report))
        return True

    def refresh(self) -> None:
        """A run for the gauge; the first one logs the summary (the agent's start-up), and the
        later ones keep the answers of the checks that asked the API server (about 26
        SelfSubjectAccessReviews and two GETs a run: kubernetes/*, sharing/reload with
        restart-pod), so a steady node sends nothing; the first run and every `Doctor` call
        ask again."""
        report = self.run(ask_api=not self._logged)
        if self._logged:
            return
        self._logged = True
        waiting = [f"{c.duty}/{c.name}" for c in report.checks if c.fix == NEEDS_NVML]
        for check in report.checks:
            if check.state is not CheckState.OK and check.fix != NEEDS_NVML:
                level = logging.ERROR if check.state is CheckState.FAILED else logging.WARNING
                log.log(level, "%s", check_line(check))
        if waiting:  # one cause, said once above (telemetry/nvml): not an ERROR each
            log.warning("doctor: %d checks wait for NVML: %s", len(waiting), ", ".join(waiting))
        log.info("%s", count_line(report))

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "gpu_agent_doctor_check_state",
            "State of each gpu-agent doctor check at its latest run: 0 ok, 1 degraded, 2 failed.",
            labels=["duty", "check"],
        )
        report = self._latest
        for check in report.checks if report is not None else ():
            gauge.add_metric([check.duty, check.name], _GAUGE_VALUE[check.state])
        yield gauge


def _bind(check: Callable[[Facts], Check], facts: Facts) -> Callable[[], Check]:
    return lambda: check(facts)


def _kept(check: Check) -> Callable[[], Check]:
    return lambda: check


class _Asking:
    """The API server as one check's run sees it: whether the check asked it is noted."""

    def __init__(self, kube: ApiServer) -> None:
        self._kube = kube
        self.asked = False

    @property
    def server(self) -> str:
        return self._kube.server

    def get(self, path: str, query: Mapping[str, str] | None = None) -> object:
        self.asked = True
        return self._kube.get(path, query)

    def request(self, method: str, path: str, **options: Any) -> Any:
        self.asked = True
        return self._kube.request(method, path, **options)


def build_doctor(
    config: AgentConfig,
    driver: DriverLink,
    edge: KubeEdge | None,
    allocation: Callable[[], Allocation],
    state: StateStore,
    telemetry: TelemetryService,
    health: HealthMonitor,
    power: PowerService,
    mig: MigService,
    namespace_proc: Path | None = None,
) -> Doctor:
    """The checks over the agent's own parts, as the composition root hands them in."""
    facts = Facts(
        config=config,
        driver=driver,
        kube=edge.client if edge is not None else None,
        allocation=allocation,
        snapshot=telemetry.latest,
        xids=telemetry.xid_totals,
        xid_unwatched=telemetry.xid_unwatched,
        power_out_of_force=power.out_of_force,
        mig_unrolled=mig.unrolled,
        mig_reboot=lambda: reboot_waits(state),
        marks=health.shown,
        state_read_only=lambda: state.read_only,
        socket_path=config.socket_path,
        namespace_proc=namespace_proc,
    )
    # Its watches say when the API server is back: the kept API answers are asked again.
    return Doctor(facts, kube_current=edge.current if edge is not None else None)
