"""``gpu_agent_gpu_up`` says only what a read showed: 1 for a GPU that answered, 0 for one lost.

A GPU whose every read has failed since the agent started (a non-lost NVML error on each
tick) is not known to work: GpuAgentGpuLost keys on ``== 0``, and a 1 for it told the
dashboards it worked. Nor is it known which fields it supports.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse

from agent.gpu.nvml import NvmlError
from agent.gpu.readings import NodeReader
from agent.telemetry.exporter import MetricsExporter
from agent.telemetry.sampler import Sampler
from agent.wire.telemetry import snapshot_pb
from dcgm.counters import load_counters
from tests.unit.telemetry.simnode import SimNode, sim_node


def _series(node: SimNode, sampler: Sampler, family: str) -> dict[str, list[float]]:
    """GPU index -> the family's sample values for it, as a scrape sees them."""
    exporter = MetricsExporter(load_counters(), "dcgm", sampler.latest, node.stats)
    out: dict[str, list[float]] = {}
    for fam in parse(exporter.render("text/plain")[0].decode()):
        if fam.name == family:
            for s in fam.samples:
                out.setdefault(s.labels["gpu"], []).append(s.value)
    return out


def test_a_gpu_never_read_has_no_up_series_nor_field_support_until_it_answers(
    tmp_path: Path,
) -> None:
    node = sim_node(tmp_path)
    node.control.inject_fault("nvmlDeviceGetMigMode", "UNKNOWN", gpu=0, count=1000)
    sampler = node.sampler()
    for _ in range(3):
        snapshot = sampler.tick()
    up = _series(node, sampler, "gpu_agent_gpu_up")
    assert "0" not in up, "a GPU that never answered was published up"
    assert up == {str(i): [1.0] for i in range(1, 8)}
    (status,) = [s for s in snapshot.gpus if s.gpu.index == 0]
    assert status.up is None and "Unknown Error" in status.unread
    assert "0" not in _series(node, sampler, "gpu_agent_field_supported")
    assert snapshot.serving() == 7
    assert [g.gpu_index for g in snapshot_pb(snapshot).gpus] == list(range(1, 8))
    # Its one series, for GpuAgentGpuNotRead: a GPU nobody can read is not left unsaid.
    read = _series(node, sampler, "gpu_agent_gpu_read")
    assert read == {"0": [0.0]} | {str(i): [1.0] for i in range(1, 8)}

    node.control.clear_faults()
    snapshot = sampler.tick()
    assert _series(node, sampler, "gpu_agent_gpu_up")["0"] == [1.0]
    assert _series(node, sampler, "gpu_agent_gpu_read")["0"] == [1.0]
    assert _series(node, sampler, "gpu_agent_field_supported")["0"]
    assert snapshot.serving() == 8


def test_a_gpu_not_read_this_tick_has_no_field_support_rows_and_stays_up(
    tmp_path: Path,
) -> None:
    """It answered before: its failed tick is not a loss (no page), but nothing of it was read
    this tick, what it supports included."""
    node = sim_node(tmp_path)
    sampler = node.sampler()
    sampler.tick()
    assert _series(node, sampler, "gpu_agent_field_supported")["3"]
    node.control.inject_fault("nvmlDeviceGetMigMode", "UNKNOWN", gpu=3, count=1000)
    sampler.tick()
    assert _series(node, sampler, "gpu_agent_gpu_up")["3"] == [1.0]
    assert _series(node, sampler, "gpu_agent_gpu_read")["3"] == [0.0]  # up, but not read now
    assert "3" not in _series(node, sampler, "gpu_agent_field_supported")
    node.control.clear_faults()
    sampler.tick()
    assert _series(node, sampler, "gpu_agent_field_supported")["3"]
    assert _series(node, sampler, "gpu_agent_gpu_read")["3"] == [1.0]


def _said(caplog: pytest.LogCaptureFixture, gpu: int) -> list[str]:
    """What the log said of ``gpu``'s failing collection or readings, in order."""
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"GPU {gpu}: ")]
    kinds = ("collection failed", "readings failed", "read again")
    return [line for line in lines if any(kind in line for kind in kinds)]


def test_a_gpu_failing_every_tick_is_logged_when_it_starts_changes_and_ends_not_every_tick(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A GPU waiting for a reset (its MIG mode read failing) logged a WARNING every tick:
    86,400 lines a day at the default interval. Now once, again when the reason changes, and
    once when it is read again; the failures still count each tick."""
    node = sim_node(tmp_path)
    sampler = node.sampler()
    sampler.tick()
    caplog.set_level(logging.INFO)
    node.control.inject_fault("nvmlDeviceGetMigMode", "Unknown", gpu=0, count=1000)
    for _ in range(5):
        sampler.tick()
    assert len(_said(caplog, 0)) == 1, _said(caplog, 0)
    assert "collection failed" in _said(caplog, 0)[0] and "Unknown Error" in _said(caplog, 0)[0]
    assert dict(node.stats.view().errors)["nvml"] >= 5  # counted each tick all the same
    node.control.clear_faults()
    node.control.inject_fault("nvmlDeviceGetMigMode", "Timeout", gpu=0, count=1000)
    for _ in range(3):
        sampler.tick()
    assert len(_said(caplog, 0)) == 2 and "Timeout" in _said(caplog, 0)[1]
    node.control.clear_faults()
    for _ in range(3):
        sampler.tick()
    assert _said(caplog, 0)[2:] == ["GPU 0: collection read again"]
    assert not _said(caplog, 1)


def test_a_gpu_whose_readings_fail_every_tick_is_logged_once_and_when_read_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device readings' failure (its layout read) was logged every tick too."""
    node = sim_node(tmp_path)
    sampler = node.sampler()
    sampler.tick()
    caplog.set_level(logging.INFO)
    read = NodeReader.read
    failing = [True]

    def fails_on_gpu_2(self: NodeReader, index: int, *args: Any, **kw: Any) -> Any:
        if index == 2 and failing[0]:
            raise NvmlError("nvmlDeviceGetFieldValues: Unknown Error")
        return read(self, index, *args, **kw)

    monkeypatch.setattr(NodeReader, "read", fails_on_gpu_2)
    for _ in range(4):
        sampler.tick()
    assert len(_said(caplog, 2)) == 1 and "the readings failed" in _said(caplog, 2)[0]
    failing[0] = False
    sampler.tick()
    sampler.tick()
    assert _said(caplog, 2)[1:] == ["GPU 2: the readings read again"]
