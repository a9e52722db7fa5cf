"""The simulated driver's power limits: per-model ranges, set and forgotten as the driver does,
and a draw that never passes the enforced limit."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from agent.errors import InvalidSpec
from agent.gpu.sim import open_simulator
from tests.unit.sim.conftest import Opener


@pytest.mark.parametrize(
    ("preset", "low", "default"),
    [
        ("dgx-h100", 200_000, 700_000),
        ("dgx-a100", 100_000, 400_000),
        ("a30-node", 100_000, 165_000),
        ("hgx-h200", 200_000, 700_000),
    ],
)
def test_range_and_default_are_the_models(
    node: Opener, preset: str, low: int, default: int
) -> None:
    nvml, _ = node(preset)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [low, default]
    assert nvml.nvmlDeviceGetPowerManagementDefaultLimit(h) == default
    assert nvml.nvmlDeviceGetPowerManagementLimit(h) == default
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(h) == default


def test_a_limit_outside_the_range_is_invalid_and_changes_nothing(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    for milliwatts in (199_999, 700_001):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            nvml.nvmlDeviceSetPowerManagementLimit(h, milliwatts)
    assert nvml.nvmlDeviceGetPowerManagementLimit(h) == 700_000


def test_a_limit_outlives_the_process_but_not_a_reboot_or_a_driver_reload(
    node: Opener, tmp_path: Path
) -> None:
    nvml, control = node("dgx-h100")
    nvml.nvmlDeviceSetPowerManagementLimit(nvml.nvmlDeviceGetHandleByIndex(1), 450_000)
    other = open_simulator(tmp_path, "dgx-h100")  # another process, same node
    other.nvmlInit()
    try:
        h = other.nvmlDeviceGetHandleByIndex(1)
        assert other.nvmlDeviceGetPowerManagementLimit(h) == 450_000
        assert other.nvmlDeviceGetEnforcedPowerLimit(h) == 450_000
        assert (
            other.nvmlDeviceGetPowerManagementLimit(other.nvmlDeviceGetHandleByIndex(0)) == 700_000
        )
    finally:
        other.nvmlShutdown()
    control.reboot()
    assert nvml.nvmlDeviceGetPowerManagementLimit(nvml.nvmlDeviceGetHandleByIndex(1)) == 700_000
    nvml.nvmlDeviceSetPowerManagementLimit(nvml.nvmlDeviceGetHandleByIndex(1), 450_000)
    control.driver_absent()
    control.driver_present()
    assert nvml.nvmlDeviceGetPowerManagementLimit(nvml.nvmlDeviceGetHandleByIndex(1)) == 700_000


def test_the_draw_is_held_at_the_enforced_limit(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    control.set_workload(0, sm_active=1.0, tensor_active=1.0, dram_active=1.0)
    assert nvml.nvmlDeviceGetPowerUsage(h) == 700_000  # flat out: the default limit
    nvml.nvmlDeviceSetPowerManagementLimit(h, 300_000)
    assert nvml.nvmlDeviceGetPowerUsage(h) == 300_000
    control.clear_workload(0)
    assert nvml.nvmlDeviceGetPowerUsage(h) < 300_000  # idle draw is below the cap


def test_no_permission_and_not_supported_are_injectable(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    control.inject_fault("nvmlDeviceSetPowerManagementLimit", "NoPermission")
    with pytest.raises(pynvml.NVMLError_NoPermission):
        nvml.nvmlDeviceSetPowerManagementLimit(h, 500_000)
    control.inject_fault("nvmlDeviceGetPowerManagementLimitConstraints", "NotSupported")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
    assert nvml.nvmlDeviceGetPowerManagementLimit(h) == 700_000


def test_another_writer_of_the_limit_holds_its_own_value_after_each_set(node: Opener) -> None:
    """The set succeeds, as NVML's does, and the getters then say what the other writer set;
    it can only set a limit inside the range, and ends with the boot."""
    nvml, control = node("dgx-h100")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(InvalidSpec):
        control.write_power_limit(0, 150)
    control.write_power_limit(0, 400)
    assert nvml.nvmlDeviceGetPowerManagementLimit(h) == 400_000
    nvml.nvmlDeviceSetPowerManagementLimit(h, 500_000)
    assert nvml.nvmlDeviceGetPowerManagementLimit(h) == 400_000
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(h) == 400_000
    other = nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.nvmlDeviceSetPowerManagementLimit(other, 500_000)
    assert nvml.nvmlDeviceGetPowerManagementLimit(other) == 500_000  # no writer: held exactly
    control.reboot()
    nvml.nvmlDeviceSetPowerManagementLimit(nvml.nvmlDeviceGetHandleByIndex(0), 500_000)
    assert nvml.nvmlDeviceGetPowerManagementLimit(nvml.nvmlDeviceGetHandleByIndex(0)) == 500_000
