"""The GPU Operator's mig-manager label protocol, done by the agent (reference/mig.md §4, §7.11).

A user (or the coordinator) sets ``nvidia.com/mig.config=<name>`` on a node; the agent applies
that config from its mig-parted file and publishes ``nvidia.com/mig.config.state``
(pending -> success | failed | rebooting). While it works, GPU operands selected by
``nvidia.com/gpu.deploy.*=true`` are paused (``paused-for-mig-change``).

What mig-manager gets wrong and this does not (mig-parted #485, issue 20):

* Operands are always put back. Outside an apply no operand may stay paused, so every pass
  restores any ``paused-for-mig-change`` label it finds (a restore PATCH that failed, an agent
  restarted mid-apply, the config label removed), retrying a failed PATCH with back-off.
* Nothing is paused for a config that cannot apply: the dry-run plan is asked first. A config
  that cannot exist on these GPUs (or is not in the file) is ``failed`` with the reason and
  waits for the label or the file to change; one blocked by running processes is retried
  after a back-off, without pausing anything meanwhile.
* A MIG mode change that waits for a reboot of this (passthrough) VM is ``rebooting``, not
  ``success``; the operands are restored meanwhile (they serve the current layout until the
  reboot), and the next agent start applies the config again.

The decisions are pure functions; :class:`MigLabelController` does the I/O.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from agent.errors import AgentError, Busy, FieldViolation, InvalidSpec, ModeRefused
from agent.kube import KubeClient
from agent.mig.node_plan import refuse_unless_feasible
from agent.mig.service import MigService
from agent.mig.spec import load_spec
from agent.tasks import Need, Subscribe, Task

log = logging.getLogger(__name__)
#: The labels are re-read from the watched Node this often without a change (a failed config's
#: retry; a read of the cache, no request); a change of the Node wakes the pass at once.
RESYNC_S = 60.0

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
PAUSED = "paused-for-mig-change"
#: Operands mig-manager pauses; ``client`` is only ever touched when present (as mig-manager).
#: deploy/kubernetes/base/agent-node-policy.yaml lets the agent write exactly these, to true or
#: PAUSED (tests/deploy/test_node_policy.py keeps the two lists equal).
OPERAND_LABELS = tuple(
    f"nvidia.com/gpu.deploy.{name}"
    for name in (
        "device-plugin",
        "gpu-feature-discovery",
        "dcgm-exporter",
        "dcgm",
        "nvsm",
        "client",
    )
)
STATES = ("pending", "success", "failed", "rebooting")
#: First and longest wait before a label PATCH that failed is tried again.
LABEL_RETRY_S = (5.0, 300.0)


def pause_patch(labels: Mapping[str, str]) -> dict[str, str]:
    """Pause the operands that run now; an operand set to ``false`` stays ``false``."""
    return {k: PAUSED for k in OPERAND_LABELS if labels.get(k) == "true"}


def restore_patch(labels: Mapping[str, str]) -> dict[str, str]:
    """Put back every operand we paused (and only those)."""
    return {k: "true" for k in OPERAND_LABELS if labels.get(k) == PAUSED}


@dataclass(frozen=True, slots=True)
class Outcome:
    """How the last attempt at a config ended."""

    config: str
    state: str  # one of STATES
    message: str
    at: float  # monotonic seconds
    #: False when only a change of the label or of the file can help (the config cannot apply)
    retry: bool = True
    #: the config file's digest the attempt read
    digest: str = ""


def due(
    wanted: str | None, last: Outcome | None, now: float, retry_after_s: float, digest: str = ""
) -> bool:
    """Whether the label asks for work: a new config or file, or a failure worth retrying."""
    if not wanted:
        return False
    if last is None or last.config != wanted or last.digest != digest:
        return True
    return last.state == "failed" and last.retry and now - last.at >= retry_after_s


def label_retry_delay(failures: int) -> float:
    """Back-off after ``failures`` failed label PATCHes in a row: 5 s doubling to 300 s."""
    base, cap = LABEL_RETRY_S
    return float(min(cap, base * 2.0 ** min(max(failures - 1, 0), 16)))


def labels_owed(labels: Mapping[str, str], last: Outcome | None) -> dict[str, str]:
    """What the node's labels lack outside an apply: operands restored, the last state shown."""
    patch = restore_patch(labels)
    if last is not None and labels.get(STATE_LABEL) != last.state:
        patch[STATE_LABEL] = last.state
    return patch


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""  # unreadable: the attempt reports why


class MigLabelController:
    """Follows ``nvidia.com/mig.config`` on one node; call :meth:`reconcile` periodically."""

    def __init__(
        self,
        kube: KubeClient,
        node: str,
        service: MigService,
        config_file: Path,
        *,
        retry_after_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._node = node
        self._service = service
        self._config_file = config_file
        self._retry_after_s = retry_after_s
        self._clock = clock
        self.last: Outcome | None = None
        self._patch_failures = 0
        self._patch_next_at = 0.0

    def tasks(self, *wakes: Subscribe) -> list[Task]:
        """The label pass, woken by ``wakes`` (the Node changed, the driver attached), and only
        while the GPUs are attached: without them no state label is published (it would claim
        what nobody verified)."""
        needs = Need.LISTENER | Need.KUBE | Need.DRIVER
        return [Task("mig-labels", self.reconcile, RESYNC_S, wakes=wakes, needs=needs)]

    def reconcile(self) -> Outcome | None:
        """One pass: read the labels, apply when due, put the labels right. Returns a new
        outcome, or None when nothing was attempted."""
        labels = self._kube.node_labels(self._node)
        wanted = labels.get(CONFIG_LABEL)
        digest = _digest(self._config_file)
        outcome = None
        if due(wanted, self.last, self._clock(), self._retry_after_s, digest):
            assert wanted is not None
            outcome = self.last = self._attempt(wanted, labels, digest)
            log.info(
                "MIG config %s on %s: %s (%s)", wanted, self._node, outcome.state, outcome.message
            )
            labels = self._kube.node_labels(self._node)  # a user's edit meanwhile is kept
            self._patch_next_at = 0.0  # the end of an attempt is published at once
        self._put_right(labels)
        return outcome

    def _put_right(self, labels: Mapping[str, str]) -> None:
        """Restore paused operands and publish the state; a failed PATCH backs off."""
        patch = labels_owed(labels, self.last)
        now = self._clock()
        if not patch or now < self._patch_next_at:
            return
        try:
            self._kube.patch_node_labels(self._node, patch)
        except AgentError as exc:
            self._patch_failures += 1
            delay = label_retry_delay(self._patch_failures)
            self._patch_next_at = now + delay
            log.warning(
                "could not set %s on node %s (%s); retrying in %.0fs",
                ", ".join(f"{k}={v}" for k, v in sorted(patch.items())),
                self._node,
                exc,
                delay,
            )
            return
        self._patch_failures, self._patch_next_at = 0, 0.0

    def _attempt(self, wanted: str, labels: Mapping[str, str], digest: str) -> Outcome:
        try:
            spec = load_spec(self._config_file)
            check = self._service.check(spec, wanted)
            if check.applied:
                return self._outcome(wanted, "success", "already applied", digest)
            if check.only_lost:  # nothing to change where a change could land: no pause
                return self._outcome(wanted, "failed", "; ".join(check.mismatches), digest)
            # The dry run first: never pause the operands for a config that cannot apply now,
            # nor on a node whose allocation mode forbids MIG changes (docs/dra.md).
            self._service.refuse_by_mode("the MIG config label")
            refuse_unless_feasible(self._service.plan(spec, wanted))
        except ModeRefused as exc:  # unknown may become known: tried again like Busy
            return self._outcome(wanted, "failed", str(exc), digest)
        except Busy as exc:  # processes in the way: they may end, so try again later
            return self._outcome(wanted, "failed", str(exc), digest)
        except AgentError as exc:  # not in the file, invalid, or cannot fit these GPUs
            return self._outcome(wanted, "failed", str(exc), digest, retry=False)
        try:
            self._kube.patch_node_labels(
                self._node, {STATE_LABEL: "pending", **pause_patch(labels)}
            )
        except AgentError as exc:
            return self._outcome(wanted, "failed", f"could not pause the operands: {exc}", digest)
        self.last = self._outcome(wanted, "pending", "applying", digest)
        try:
            result = self._service.apply(spec, wanted, operation=f"label {CONFIG_LABEL}={wanted}")
        except Exception as exc:  # any failure ends in "failed"; the operands are put back
            if not isinstance(exc, AgentError):
                log.error("bug in the MIG apply for %s", wanted, exc_info=exc)
            return self._outcome(wanted, "failed", str(exc), digest)
        pending = result.pending
        if pending and all(g.reboot for g in pending):
            gpus = ", ".join(str(g.gpu) for g in pending)
            return self._outcome(
                wanted,
                "rebooting",
                f"MIG mode change on GPU {gpus} waits for a reboot of this VM",
                digest,
                retry=False,
            )
        if pending:
            why = "; ".join(g.message for g in pending)
            return self._outcome(wanted, "failed", f"MIG mode change still pending: {why}", digest)
        if result.lost:  # never "success" for a GPU nobody could change
            why = "; ".join(g.message for g in result.lost)
            return self._outcome(wanted, "failed", why, digest)
        return self._outcome(wanted, "success", "applied", digest)

    def _outcome(
        self, config: str, state: str, message: str, digest: str, *, retry: bool = True
    ) -> Outcome:
        return Outcome(config, state, message, self._clock(), retry, digest)


def label_controller(
    watch: bool, config_file: Path | None, kube: KubeClient | None, node: str, mig: MigService
) -> MigLabelController | None:
    """The controller when ``mig.watch_node_label`` is on; its settings checked first."""
    if not watch:
        return None
    if config_file is None:
        raise InvalidSpec(
            "mig.watch_node_label needs mig.config_file (the mig-parted configs the label names)",
            [FieldViolation("mig.config_file", "path of a mig-parted config file")],
        )
    if kube is None:
        raise InvalidSpec(
            "mig.watch_node_label needs the agent to run in a pod with a service account",
            [FieldViolation("mig.watch_node_label", "false outside Kubernetes")],
        )
    return MigLabelController(kube, node, mig, config_file)


class MigStateCollector(Collector):
    """``gpu_agent_mig_config_state{config,state}``: 1 for the state the label protocol is in."""

    def __init__(self, controller: MigLabelController) -> None:
        self._controller = controller

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "gpu_agent_mig_config_state",
            "1 for the state of the MIG config named by nvidia.com/mig.config "
            "(as nvidia.com/mig.config.state), 0 for the other states.",
            labels=["config", "state"],
        )
        last = self._controller.last
        if last is not None:
            for state in STATES:
                gauge.add_metric([last.config, state], 1.0 if state == last.state else 0.0)
        yield gauge
