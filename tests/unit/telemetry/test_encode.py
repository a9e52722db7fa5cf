"""The fast encoder writes exactly what prometheus_client's encoders write."""

from __future__ import annotations

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.samples import Sample

from agent.telemetry.encode import ClassicCounter, encode
from agent.telemetry.exporter import families
from agent.telemetry.stats import TelemetryStats
from tests.unit.telemetry.test_exporter import COUNTERS, SNAPSHOT


class _Registry:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


def _library(metrics: list[Metric], openmetrics: bool) -> bytes:
    if openmetrics:
        return generate_openmetrics(_Registry(metrics))
    body = generate_latest(_Registry(metrics))
    for m in metrics:  # the one deliberate difference: DCGM-named counters
        if isinstance(m, ClassicCounter):
            body = body.replace(
                f"# TYPE {m.name} untyped\n".encode(), f"# TYPE {m.name} counter\n".encode()
            )
    return body


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("openmetrics", [False, True])
def test_exporter_families_encode_like_the_library(native: bool, openmetrics: bool) -> None:
    stats = TelemetryStats()
    stats.observe_collection(0.02)
    stats.error("nvml")
    metrics = families(SNAPSHOT, COUNTERS, native, stats)
    assert encode(metrics, openmetrics) == _library(metrics, openmetrics)


def test_awkward_values_are_escaped_like_the_library() -> None:
    metric = Metric("x", 'help with \\ and "quotes"\nand a newline', "gauge")
    metric.samples.append(Sample("x", {"b": 'a "q" \\ \n', "a": "ü"}, float("nan")))
    metric.samples.append(Sample("x", {}, float("inf")))
    metric.samples.append(Sample("x", {"a": "1"}, 1e21))
    for openmetrics in (False, True):
        assert encode([metric], openmetrics) == _library([metric], openmetrics)


def test_dcgm_counter_keeps_its_name_in_both_formats() -> None:
    metric = ClassicCounter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "mJ")
    metric.samples.append(Sample(metric.name, {"gpu": "0"}, 5.0))
    classic = encode([metric], openmetrics=False).decode()
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in classic
    assert 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"} 5.0\n' in classic
    om = encode([metric], openmetrics=True).decode()
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown\n" in om
