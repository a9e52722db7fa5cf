"""The GPU facade on the simulated driver: typed records out, domain errors for NVML failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import Busy, Conflict, DeviceLost, DriverUnavailable, InvalidSpec, NotFound
from agent.gpu import GpuDriver, open_driver
from agent.gpu.sim import SimControl
from agent.gpu.types import ActivationStatus, Placement


@pytest.fixture
def h100(tmp_path: Path) -> GpuDriver:
    driver = open_driver("dgx-h100", tmp_path)
    yield driver
    driver.close()


def _profile(driver: GpuDriver, uuid: str, name: str) -> int:
    return next(p.id for p in driver.gi_profiles(uuid) if p.name == name)


def test_inventory_reports_every_gpu_with_identity(h100: GpuDriver) -> None:
    gpus = h100.gpus()
    assert len(gpus) == 8
    assert all(g.name == "NVIDIA H100 80GB HBM3" for g in gpus)
    assert all(g.pci_device_id == 0x233010DE for g in gpus)
    assert len({g.uuid for g in gpus}) == 8
    assert gpus[0].mig_mode is not None and not gpus[0].mig_mode.current
    # The MPS client limit the sharing rules apply depends on it (48 from 7.5 on).
    assert all(g.compute_capability == (9, 0) for g in gpus)


def test_gpu_selection_by_index_uuid_and_bus_id(h100: GpuDriver) -> None:
    g = h100.gpus()[3]
    assert h100.gpu(3) == g
    assert h100.gpu(g.uuid) == g
    assert h100.gpu(g.pci_bus_id.lower()) == g
    short = g.pci_bus_id.split(":", 1)[1]  # "0000:xx:00.0" style without the 8-digit domain
    assert h100.gpu(f"0000:{short}") == g
    with pytest.raises(NotFound, match="GPUs: 0="):
        h100.gpu("GPU-nope")


def test_profiles_are_discovered_with_names_computed_per_device(h100: GpuDriver) -> None:
    uuid = h100.gpus()[0].uuid
    names = {
        p.name: (p.id, p.memory_slices, tuple(pl.start for pl in p.placements))
        for p in h100.gi_profiles(uuid)
    }
    assert names["1g.10gb"] == (19, 1, (0, 1, 2, 3, 4, 5, 6))
    assert names["1g.10gb+me"][0] == 20
    assert names["1g.20gb"] == (15, 2, (0, 2, 4, 6))
    assert names["3g.40gb"] == (9, 4, (0, 4))
    assert names["7g.80gb"] == (0, 8, (0,))


def test_create_layout_and_read_it_back_with_mig_uuids(h100: GpuDriver) -> None:
    uuid = h100.gpus()[0].uuid
    assert h100.set_mig_mode(uuid, True) is ActivationStatus.APPLIED
    gi3 = h100.create_gpu_instance(uuid, _profile(h100, uuid, "3g.40gb"), Placement(4, 4))
    gi1 = h100.create_gpu_instance(uuid, _profile(h100, uuid, "1g.10gb"), Placement(0, 1))
    full = max(h100.ci_profiles(uuid, gi3.id), key=lambda c: c.slice_count)
    assert full.name == "3g.40gb"
    h100.create_compute_instance(uuid, gi3.id, full.id)
    layout = h100.layout(uuid)
    assert [(gi.profile_name, str(gi.placement)) for gi in layout.instances] == [
        ("1g.10gb", "0:1"),
        ("3g.40gb", "4:4"),
    ]
    (ci,) = next(gi for gi in layout.instances if gi.id == gi3.id).compute_instances
    assert ci.uuid is not None and ci.uuid.startswith("MIG-")
    assert next(gi for gi in layout.instances if gi.id == gi1.id).compute_instances == ()


def test_nvml_errors_become_domain_errors(tmp_path: Path) -> None:
    driver = open_driver("dgx-a100", tmp_path)
    control = SimControl(tmp_path)
    uuid = driver.gpus()[0].uuid
    driver.set_mig_mode(uuid, True)
    p3g = _profile(driver, uuid, "3g.20gb")
    gi = driver.create_gpu_instance(uuid, p3g, Placement(0, 4))
    with pytest.raises(Conflict):  # overlap -> INSUFFICIENT_RESOURCES
        driver.create_gpu_instance(uuid, _profile(driver, uuid, "2g.10gb"), Placement(2, 2))
    with pytest.raises(InvalidSpec):  # not a valid start -> INVALID_ARGUMENT
        driver.create_gpu_instance(uuid, p3g, Placement(2, 4))
    ci = driver.create_compute_instance(
        uuid, gi.id, max(c.id for c in driver.ci_profiles(uuid, gi.id))
    )
    with pytest.raises(Busy) as busy:  # a GI with a CI -> IN_USE
        driver.destroy_gpu_instance(uuid, gi.id)
    assert busy.value.nvml_code == 19  # type: ignore[attr-defined]
    lost_uuid = driver.gpus()[1].uuid
    control.mark_lost(1)
    with pytest.raises(DeviceLost):
        driver.processes(lost_uuid)
    driver.destroy_compute_instance(uuid, gi.id, ci.id)
    driver.destroy_gpu_instance(uuid, gi.id)
    assert driver.layout(uuid).instances == ()
    driver.close()


def test_real_nvml_missing_is_one_clear_error_never_the_simulator(tmp_path: Path) -> None:
    """No libnvidia-ml here: the real path must say so and how to simulate, not fall back."""
    with pytest.raises(DriverUnavailable, match="--simulate"):
        open_driver(None, tmp_path)


def test_nvml_missing_in_a_pod_names_the_runtime_class(tmp_path: Path) -> None:
    """No libnvidia-ml.so.1 here: in a pod the error says which runtime class to check."""
    with pytest.raises(DriverUnavailable) as in_pod:
        open_driver(None, tmp_path, env={"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    assert "runtimeClassName: nvidia" in str(in_pod.value)
    assert "overlays/nvidia-default-runtime" in str(in_pod.value)
    with pytest.raises(DriverUnavailable) as outside:
        open_driver(None, tmp_path, env={})
    assert "runtimeClassName" not in str(outside.value) and "--simulate" in str(outside.value)
