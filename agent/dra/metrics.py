"""``gpu_agent_allocation_mode{mode}``: the node's allocation mode as one series set to 1."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from agent.dra.mode import Allocation

__all__ = ["AllocationCollector"]


class AllocationCollector(Collector):
    def __init__(self, current: Callable[[], Allocation]) -> None:
        self._current = current

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "gpu_agent_allocation_mode",
            "1 for the mode that hands this node's GPUs to pods: device-plugin, dra, "
            "dra-dynamic-mig, none, or unknown (not detected yet); it decides which MIG changes "
            "the agent makes (docs/dra.md).",
            labels=["mode"],
        )
        family.add_metric([self._current().mode.value], 1.0)
        yield family
