"""GPM two-sample windows on the simulator: buffers reused, freed, and short windows skipped;
whether a GPU has GPM, decided only by what NVML answers."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from agent.errors import AgentError, DeviceLost
from agent.gpu.readings import GpmReadout, GpmSample, NodeReader
from agent.telemetry.gpm import GpmKey, GpmTracker
from dcgm.fields import BY_NAME
from tests.unit.telemetry.simnode import GPM_WINDOW_S, entity, sim_node

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


def test_the_gpm_probe_says_no_only_when_nvml_does(tmp_path: Path) -> None:
    node = sim_node(tmp_path)
    reader = NodeReader(node.driver)
    reader.gpus()
    assert reader.gpm_supported(0)
    node.control.inject_fault("nvmlGpmQueryDeviceSupport", "NOT_SUPPORTED", gpu=0)
    assert not reader.gpm_supported(0)
    node.control.inject_fault("nvmlGpmQueryDeviceSupport", "UNKNOWN", gpu=0)
    with pytest.raises(AgentError) as failed:
        reader.gpm_supported(0)
    assert not isinstance(failed.value, DeviceLost)
    node.control.inject_fault("nvmlGpmQueryDeviceSupport", "GPU_IS_LOST", gpu=0)
    with pytest.raises(DeviceLost):
        reader.gpm_supported(0)


def test_a_failed_gpm_probe_is_asked_again_not_taken_for_a_gpu_without_gpm(
    tmp_path: Path,
) -> None:
    tensor = BY_NAME["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].id
    node = sim_node(tmp_path)
    for gpu in (0, 1):
        node.control.set_workload(gpu, tensor_active=0.5)
    node.control.inject_fault("nvmlGpmQueryDeviceSupport", "UNKNOWN", gpu=0)
    sampler = node.sampler()
    first = sampler.tick()
    # Unknown meanwhile: no value, and not refused (no "no GPM" for the agent's life).
    assert tensor not in entity(first, 0).values
    assert {(s.gpu.index, s.supported) for s in first.support if s.field_id == tensor} >= {
        (0, True)
    }
    assert dict(node.stats.view().errors).get("nvml", 0) >= 1
    # Its series absent, said: the gpm source is degraded naming the GPU and the probe's error.
    (gpm,) = [s for s in first.sources if s.source == "gpm"]
    assert gpm.degraded is not None and "GPU 0: " in gpm.degraded, gpm
    assert "Unknown Error" in gpm.degraded
    snapshot = first
    for _ in range(3):
        time.sleep(GPM_WINDOW_S)
        snapshot = sampler.tick()
    assert entity(snapshot, 0).values[tensor] == pytest.approx(0.5, abs=0.05)
    assert entity(snapshot, 1).values[tensor] == pytest.approx(0.5, abs=0.05)
