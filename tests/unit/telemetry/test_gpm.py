"""GPM two-sample windows on the simulator: buffers reused, freed, and short windows skipped."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from agent.errors import AgentError
from agent.gpu.readings import GpmReadout, GpmSample, NodeReader
from agent.telemetry.gpm import GpmKey, GpmTracker
from tests.unit.telemetry.simnode import GPM_WINDOW_S, sim_node

TENSOR = 5  # NVML_GPM_METRIC_ANY_TENSOR_UTIL


class Counting:
    """The simulator-backed reader, counting GPM buffers it allocates and frees."""

    def __init__(self, reader: NodeReader) -> None:
        self.reader = reader
        self.allocated = 0
        self.freed = 0

    def gpm_sample(
        self, gpu: int, gpu_instance_id: int | None = None, into: GpmSample | None = None
    ) -> GpmSample:
        sample = self.reader.gpm_sample(gpu, gpu_instance_id, into)
        self.allocated += into is None
        return sample

    def gpm_metrics(self, first: GpmSample, second: GpmSample, ids: Iterable[int]) -> GpmReadout:
        return self.reader.gpm_metrics(first, second, ids)

    def gpm_free(self, sample: GpmSample) -> None:
        self.freed += 1
        self.reader.gpm_free(sample)


def test_steady_state_reuses_two_buffers_per_entity(tmp_path: Path) -> None:
    node = sim_node(tmp_path)
    node.control.set_workload(0, tensor_active=0.25)
    source = Counting(NodeReader(node.driver))
    source.reader.gpus()
    tracker = GpmTracker(source, [TENSOR])
    key = GpmKey(0, None, node.uuids[0])
    assert tracker.collect(key) is None, "the first sample only seeds"
    for _ in range(3):
        time.sleep(GPM_WINDOW_S)
        readout = tracker.collect(key)
        assert readout is not None
        assert readout.values[TENSOR] == pytest.approx(25.0, rel=0.01)
    assert source.allocated == 2
    tracker.close()
    assert source.freed == 2
    assert len(tracker) == 0


def test_a_window_under_100_ms_serves_the_previous_value(tmp_path: Path) -> None:
    node = sim_node(tmp_path)
    source = Counting(NodeReader(node.driver))
    source.reader.gpus()
    tracker = GpmTracker(source, [TENSOR])
    key = GpmKey(0, None, node.uuids[0])
    tracker.collect(key)
    time.sleep(GPM_WINDOW_S)
    first = tracker.collect(key)
    assert tracker.collect(key) is first
    assert source.allocated == 2


def test_entities_that_disappear_are_freed(tmp_path: Path) -> None:
    node = sim_node(tmp_path)
    source = Counting(NodeReader(node.driver))
    source.reader.gpus()
    tracker = GpmTracker(source, [TENSOR])
    keys = [GpmKey(g, None, node.uuids[g]) for g in range(3)]
    for key in keys:
        tracker.collect(key)
    tracker.retain(keys[:1])
    assert len(tracker) == 1
    assert source.freed == 2


def test_a_failed_sample_frees_the_entity(tmp_path: Path) -> None:
    node = sim_node(tmp_path)
    source = Counting(NodeReader(node.driver))
    source.reader.gpus()
    tracker = GpmTracker(source, [TENSOR])
    key = GpmKey(0, None, node.uuids[0])
    tracker.collect(key)
    node.control.inject_fault("nvmlGpmSampleGet", "UNKNOWN", gpu=0)
    time.sleep(GPM_WINDOW_S)
    with pytest.raises(AgentError):
        tracker.collect(key)
    assert len(tracker) == 0
    assert source.freed == source.allocated
