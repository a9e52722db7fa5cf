"""The GPU Operator's mig-manager label protocol, done by the agent (reference/mig.md §4, §7.11).

A user (or the coordinator) sets ``nvidia.com/mig.config=<name>`` on a node; the agent applies
that config from its mig-parted file and publishes ``nvidia.com/mig.config.state``
(pending -> success | failed). While it works, GPU operands selected by
``nvidia.com/gpu.deploy.*=true`` are paused (``paused-for-mig-change``) and they are always put
back afterwards, on failure too: mig-manager leaving them paused is a known wedge (mig-parted #485).
Unlike mig-manager, a failed config is retried after a back-off instead of waiting for the label
to change, and only the instances that must change are touched (the planner's job).

The decisions are pure functions; :class:`MigLabelController` does the I/O.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from agent.errors import AgentError
from agent.kube import KubeClient
from agent.mig.service import MigService
from agent.mig.spec import load_spec

log = logging.getLogger(__name__)

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
PAUSED = "paused-for-mig-change"
#: Operands mig-manager pauses; ``client`` is only ever touched when present (as mig-manager).
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
STATES = ("pending", "success", "failed")


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


def due(wanted: str | None, last: Outcome | None, now: float, retry_after_s: float) -> bool:
    """Whether the label asks for work: a new config, or a failed one whose back-off is over."""
    if not wanted:
        return False
    if last is None or last.config != wanted:
        return True
    return last.state == "failed" and now - last.at >= retry_after_s


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

    def reconcile(self) -> Outcome | None:
        """One pass: read the labels, apply when due, publish the state. Returns a new outcome."""
        labels = self._kube.node_labels(self._node)
        wanted = labels.get(CONFIG_LABEL)
        if not due(wanted, self.last, self._clock(), self._retry_after_s):
            return None
        assert wanted is not None
        self.last = self._attempt(wanted, labels)
        log.info(
            "MIG config %s on %s: %s %s", wanted, self._node, self.last.state, self.last.message
        )
        return self.last

    def _attempt(self, wanted: str, labels: Mapping[str, str]) -> Outcome:
        try:
            spec = load_spec(self._config_file)
            if self._service.check(spec, wanted).applied:
                self._kube.patch_node_labels(self._node, {STATE_LABEL: "success"})
                return self._outcome(wanted, "success", "already applied")
        except AgentError as exc:
            self._kube.patch_node_labels(self._node, {STATE_LABEL: "failed"})
            return self._outcome(wanted, "failed", str(exc))
        self._kube.patch_node_labels(self._node, {STATE_LABEL: "pending", **pause_patch(labels)})
        self.last = self._outcome(wanted, "pending", "applying")
        state, message = "failed", "interrupted"
        try:
            result = self._service.apply(spec, wanted, operation=f"label {CONFIG_LABEL}={wanted}")
            pending = [f"GPU {o.gpu}" for o in result.pending]
            if pending:
                state, message = "failed", f"MIG mode change still pending on {', '.join(pending)}"
            else:
                state, message = "success", "applied"
        except AgentError as exc:
            message = str(exc)
        finally:
            # Always restore, whatever happened: read the labels again so a user's edit while we
            # worked (say, an operand switched to false) is not overwritten.
            current = self._kube.node_labels(self._node)
            self._kube.patch_node_labels(self._node, {STATE_LABEL: state, **restore_patch(current)})
        return self._outcome(wanted, state, message)

    def _outcome(self, config: str, state: str, message: str) -> Outcome:
        return Outcome(config, state, message, self._clock())


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
