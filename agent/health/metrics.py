"""``gpu_agent_health_state{gpu,UUID,gpu_instance,state}``: 1 for each mark's state, 0 for the
other two, per GPU (``gpu_instance`` empty) and MIG instance. A GPU the agent has not judged yet
has no series (unknown is not healthy), and while the driver is detached no GPU has one: the
marks are kept for its return, but nothing is checked meanwhile."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from agent.health.machine import State
from agent.health.publish import Marks

__all__ = ["HealthCollector"]


class HealthCollector(Collector):
    def __init__(
        self, marks: Callable[[], Marks], driver_away: Callable[[], str | None] = lambda: None
    ) -> None:
        self._marks = marks
        #: why the GPUs are not read now (the driver detached); None while they are
        self._driver_away = driver_away

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "gpu_agent_health_state",
            "The agent's health mark of each GPU and MIG instance: 1 for its state (healthy, "
            "degraded or failed), 0 for the others (docs/health.md).",
            labels=["gpu", "UUID", "gpu_instance", "state"],
        )
        if self._driver_away() is not None:
            yield family  # unchecked: no series (docs/metrics.md), the marks kept meanwhile
            return
        for target, (index, mark, _) in sorted(
            self._marks().items(), key=lambda kv: (kv[1][0], kv[0].order())
        ):
            gi = "" if target.gpu_instance is None else str(target.gpu_instance)
            gpu = str(index) if index >= 0 else ""
            for state in State:
                value = 1.0 if mark.state is state else 0.0
                family.add_metric([gpu, target.known_uuid, gi, state.value], value)
        yield family
