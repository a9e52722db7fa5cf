"""The DCGM profiling backend: absent bindings mean no backend; DCGM's values are re-keyed."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent.telemetry.dcgm_backend import DcgmProfiling, entity_values, load_dcgm_backend
from dcgm.counters import parse_counters
from tests.unit.telemetry.simnode import GPM_WINDOW_S, entity, sim_node


def test_without_the_bindings_there_is_no_backend_and_one_line_says_how_to_add_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def importer(name: str) -> object:
        raise ImportError(f"No module named {name!r}")

    with caplog.at_level(logging.INFO, logger="agent.telemetry.dcgm_backend"):
        assert load_dcgm_backend([1004], 1.0, importer=importer) is None
    (record,) = [r for r in caplog.records if r.name == "agent.telemetry.dcgm_backend"]
    assert "datacenter-gpu-manager-4/bindings/python3" in record.getMessage()


def test_installed_but_unusable_dcgm_is_no_backend(caplog: pytest.LogCaptureFixture) -> None:
    """E.g. nv-hostengine not running: DcgmReader's Init swallows the refused connection and
    keeps no handle; the log says so, not "'NoneType' object has no attribute 'handle'"."""
    dcgm = _FakeDcgm(["GPU-a"])
    dcgm.down = True
    with caplog.at_level(logging.WARNING, logger="agent.telemetry.dcgm_backend"):
        assert load_dcgm_backend([1004], 1.0, importer=dcgm.modules.__getitem__) is None
    message = next(
        r for r in caplog.records if r.name == "agent.telemetry.dcgm_backend"
    ).getMessage()
    assert "unusable" in message and "nv-hostengine cannot be reached" in message


def test_values_are_keyed_by_gpu_uuid_and_nvml_instance_id() -> None:
    latest = {
        1: {0: {1004: 0.5, 1005: 0.25}, 1: {1004: 0.0}},  # DCGM_FE_GPU by DCGM gpu id
        4: {7: {1004: 0.75}, 9: {1004: 0.1}},  # DCGM_FE_GPU_I by DCGM entity id
        5: {3: {1004: 0.2}},  # compute instances are not exported on their own
    }
    values = entity_values(
        latest,
        gpu_uuids={0: "GPU-a", 1: "GPU-b"},
        instances={7: ("GPU-b", 2)},
    )
    assert values == {
        ("GPU-a", None): {1004: 0.5, 1005: 0.25},
        ("GPU-b", None): {1004: 0.0},
        ("GPU-b", 2): {1004: 0.75},
    }


class _FakeDcgm:
    """DCGM's Python bindings as far as DcgmProfiling uses them: the GPUs by DCGM id, the MIG
    hierarchy (GPU-instance entity id -> parent UUID, NVML GI id) and the values of the
    entities a reader watches (0.5 for every field of a watched GPU DCGM profiles, or of a
    watched, living instance; no field of a GPU it does not, DCGM's blanks being dropped).

    As NVIDIA's ``DcgmReader`` (testing/python3/DcgmReader.py), a reader neither connects in
    its constructor nor raises on a refused or lost connection: ``Init`` logs it and keeps no
    handle, and a read disconnects and answers ``{}``, reconnecting on the next read."""

    def __init__(self, uuids: list[str]) -> None:
        self.hierarchy: dict[int, tuple[str, int]] = {}
        self.watches = 0  # readers made to watch entities (one per connect)
        self.unprofiled: set[int] = set()  # DCGM GPU ids it cannot profile
        self.broken = False  # the hierarchy query fails (the hostengine went away)
        self.down = False  # nv-hostengine unreachable: no connection is made or kept
        self.open = 0  # readers Init()ed and not Shutdown()
        fake = self

        class Reader:
            def __init__(
                self, fieldIds: list[int], updateFrequency: int, entities: Any = None
            ) -> None:
                self.fields, self.entities = fieldIds, entities or []
                fake.watches += entities is not None
                self.m_dcgmHandle: Any = None
                self.m_dcgmGroup = SimpleNamespace(GetGpuIds=lambda: list(range(len(uuids))))
                self.m_gpuIdToUUId = dict(enumerate(uuids))

            def Init(self) -> None:
                self._reconnect()

            def _reconnect(self) -> None:
                if self.m_dcgmHandle is None and not fake.down:
                    self.m_dcgmHandle = SimpleNamespace(handle=object())
                    fake.open += 1

            def Shutdown(self) -> None:
                if self.m_dcgmHandle is not None:
                    self.m_dcgmHandle = None
                    fake.open -= 1

            def GetLatestEntityValuesAsFieldIdDict(self) -> dict[int, dict[int, Any]]:
                self._reconnect()
                if fake.down:  # CONNECTION_NOT_VALID caught: disconnected, nothing answered
                    self.Shutdown()
                    return {}
                values = {f: 0.5 for f in self.fields}
                gpus = {e.entityId for e in self.entities if e.entityGroupId == 1}
                watched = {e.entityId for e in self.entities if e.entityGroupId == 4}
                alive = watched & set(fake.hierarchy)
                return {
                    1: {g: {} if g in fake.unprofiled else dict(values) for g in gpus},
                    4: {e: dict(values) for e in alive},
                }

        def hierarchy(handle: object) -> SimpleNamespace:
            if fake.broken or fake.down:
                raise RuntimeError("DCGM_ST_CONNECTION_NOT_VALID")
            items = [
                SimpleNamespace(
                    entity=SimpleNamespace(entityGroupId=4, entityId=entity),
                    info=SimpleNamespace(gpuUuid=uuid, nvmlInstanceId=gi),
                )
                for entity, (uuid, gi) in fake.hierarchy.items()
            ]
            return SimpleNamespace(count=len(items), entityList=items)

        def groups(handle: object, gpu: int) -> SimpleNamespace:
            if gpu in fake.unprofiled:
                raise RuntimeError("DCGM_ST_PROFILING_NOT_SUPPORTED")
            group = SimpleNamespace(fieldIds=[1001, 1004], numFieldIds=2)
            return SimpleNamespace(numMetricGroups=1, metricGroups=[group])

        self.modules = {
            "DcgmReader": SimpleNamespace(DcgmReader=Reader),
            "dcgm_agent": SimpleNamespace(
                dcgmGetGpuInstanceHierarchy=hierarchy, dcgmProfGetSupportedMetricGroups=groups
            ),
            "dcgm_structs": SimpleNamespace(
                c_dcgmGroupEntityPair_t=lambda g, e: SimpleNamespace(entityGroupId=g, entityId=e)
            ),
            "dcgm_fields": SimpleNamespace(DCGM_FE_GPU=1),
        }


def test_an_instance_made_after_dcgm_was_connected_gets_its_profiling_values(
    tmp_path: Path,
) -> None:
    """On Ampere a MIG instance's DCP fields, and the GR-engine activity its idle time is
    counted from, come from DCGM. The agent read DCGM's MIG hierarchy once, when it connected:
    an instance made later (by the agent's own MIG apply) was neither watched nor mapped, so
    its tensor activity and idle seconds stayed absent until the agent restarted."""
    node = sim_node(tmp_path, "dgx-a100")
    first = node.create_instance(0, "3g.20gb", slot=0)
    dcgm = _FakeDcgm(node.uuids)
    dcgm.hierarchy = {100: (node.uuids[0], first.id)}
    backend = DcgmProfiling(dcgm.modules, [1001, 1004], 1.0)
    counters = parse_counters("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, t\n")
    sampler = node.sampler(counters, profiling=backend)
    assert entity(sampler.tick(), 0, first.id).values[1004] == 0.5
    second = node.create_instance(0, "3g.20gb", slot=1)
    dcgm.hierarchy[101] = (node.uuids[0], second.id)
    snapshot = sampler.tick()
    assert entity(snapshot, 0, second.id).values[1004] == 0.5
    assert entity(snapshot, 0, second.id).idle_seconds is not None
    assert entity(snapshot, 0, first.id).values[1004] == 0.5


def test_an_instance_dcgm_does_not_list_is_asked_for_again_only_now_and_then(
    tmp_path: Path,
) -> None:
    """DCGM may list a new instance late: asked again at the layout change, then not on
    every tick (a reconnect each second would load the hostengine); meanwhile the instance's
    DCP fields are absent, never 0."""
    node = sim_node(tmp_path, "dgx-a100")
    dcgm = _FakeDcgm(node.uuids)
    backend = DcgmProfiling(dcgm.modules, [1001, 1004], 1.0)
    sampler = node.sampler(
        parse_counters("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, t\n"), profiling=backend
    )
    sampler.tick()
    assert dcgm.watches == 1
    late = node.create_instance(0, "3g.20gb")
    sampler.tick()
    snapshot = sampler.tick()
    assert dcgm.watches == 2
    assert 1004 not in entity(snapshot, 0, late.id).values


def test_an_instance_re_made_under_the_same_id_is_watched_as_the_new_dcgm_entity(
    tmp_path: Path,
) -> None:
    """A GI destroyed and made again gets the same NVML GI id but is another DCGM entity: the
    old entity's mapping must not stand for it."""
    node = sim_node(tmp_path, "dgx-a100")
    gi = node.create_instance(0, "3g.20gb")
    dcgm = _FakeDcgm(node.uuids)
    dcgm.hierarchy = {100: (node.uuids[0], gi.id)}
    backend = DcgmProfiling(dcgm.modules, [1001, 1004], 0.001)  # read each tick
    counters = parse_counters("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, t\n")
    sampler = node.sampler(counters, profiling=backend)
    assert entity(sampler.tick(), 0, gi.id).values[1004] == 0.5
    uuid = node.uuids[0]
    node.driver.destroy_compute_instance(uuid, gi.id, 0)
    node.driver.destroy_gpu_instance(uuid, gi.id)
    again = node.create_instance(0, "3g.20gb")
    assert again.id == gi.id
    dcgm.hierarchy = {101: (uuid, again.id)}
    assert entity(sampler.tick(), 0, again.id).values[1004] == 0.5


def test_a_gpu_dcgm_does_not_profile_is_not_a_reason_to_reconnect(tmp_path: Path) -> None:
    """DCGM lists no instance of a GPU it cannot profile, so that GPU's instances were "missing"
    for good: the whole connection was rebuilt every 30 s for as long as the agent ran."""
    node = sim_node(tmp_path, "dgx-a100")
    node.create_instance(0, "3g.20gb")
    dcgm = _FakeDcgm(node.uuids)
    dcgm.unprofiled = {0}
    backend = DcgmProfiling(dcgm.modules, [1001, 1004], 1.0)
    now = [0.0]
    counters = parse_counters("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, t\n")
    sampler = node.sampler(counters, clock=lambda: now[0], profiling=backend)
    for _ in range(4):
        sampler.tick()
        now[0] += 31.0
    assert dcgm.watches == 1, dcgm.watches
    assert dcgm.open == 1  # the probe was let go, the one reader stays


def test_a_reconnect_that_fails_keeps_the_old_watch_and_the_tick(tmp_path: Path) -> None:
    """A layout change asks DCGM again; when that fails (the hostengine restarting) the error
    left the tick with no DCGM values at all, and the probe connection open. The old watch
    stays, its values are read, and no connection is left behind."""
    node = sim_node(tmp_path, "dgx-a100")
    first = node.create_instance(0, "3g.20gb", slot=0)
    dcgm = _FakeDcgm(node.uuids)
    dcgm.hierarchy = {100: (node.uuids[0], first.id)}
    backend = DcgmProfiling(dcgm.modules, [1001, 1004], 0.001)
    counters = parse_counters("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, t\n")
    sampler = node.sampler(counters, profiling=backend)
    sampler.tick()
    dcgm.broken = True
    node.create_instance(0, "3g.20gb", slot=1)  # a layout change: DCGM is asked again
    assert entity(sampler.tick(), 0, first.id).values[1004] == 0.5
    assert dcgm.open == 1


def test_a_gpu_whose_gpm_probe_failed_is_not_called_one_dcgm_must_profile(
    tmp_path: Path,
) -> None:
    """A Hopper GPU whose GPM probe failed once is not a GPU without GPM: DCGM, which does not
    profile it, must not mark its DCP fields unsupported; GPM serves them once the probe answers."""
    node = sim_node(tmp_path)
    node.control.set_workload(0, tensor_active=0.5)
    dcgm = _FakeDcgm(node.uuids)
    dcgm.unprofiled = {0}
    backend = DcgmProfiling(dcgm.modules, [1001, 1004], 1.0)
    node.control.inject_fault("nvmlGpmQueryDeviceSupport", "UNKNOWN", gpu=0)
    counters = parse_counters("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, t\n")
    sampler = node.sampler(counters, profiling=backend)
    snapshots = [sampler.tick()]
    for _ in range(3):
        time.sleep(GPM_WINDOW_S)
        snapshots.append(sampler.tick())
    for snapshot in snapshots:
        assert [s.supported for s in snapshot.support if s.gpu.index == 0] == [True]
    assert entity(snapshots[-1], 0).values[1004] == pytest.approx(0.5, abs=0.05)


def test_a_hostengine_that_stops_answering_degrades_the_dcgm_source_until_it_answers(
    tmp_path: Path,
) -> None:
    """DcgmReader answers {} on a lost connection (it does not raise): the DCP series vanished
    while gpu_agent_collection_source_up{source="dcgm"} said 1."""
    node = sim_node(tmp_path, "dgx-a100")  # Ampere: no GPM, DCP fields come from DCGM
    dcgm = _FakeDcgm(node.uuids)
    backend = DcgmProfiling(dcgm.modules, [1001, 1004], 0.001)  # read each tick
    counters = parse_counters(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, t\nDCGM_FI_DEV_GPU_TEMP, gauge, temp\n"
    )
    sampler = node.sampler(counters, profiling=backend)
    assert entity(sampler.tick(), 0).values[1004] == 0.5
    dcgm.down = True
    snapshot = sampler.tick()
    reason = {s.source: s.degraded for s in snapshot.sources}["dcgm"]
    assert reason is not None and "no value for any of its GPUs" in reason
    assert 1004 not in entity(snapshot, 0).values, "absent, never 0"
    assert 150 in entity(snapshot, 0).values  # DCGM_FI_DEV_GPU_TEMP: NVML goes on
    dcgm.down = False
    snapshot = sampler.tick()
    assert {s.source: s.degraded for s in snapshot.sources}["dcgm"] is None
    assert entity(snapshot, 0).values[1004] == 0.5
