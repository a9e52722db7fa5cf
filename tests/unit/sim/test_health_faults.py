"""Faults the health marks judge, injected into the simulator and read through pynvml as the
agent reads them: XIDs attributed to a MIG GPU instance, ECC counts (volatile ones restart at a
reset, a pending row remap takes effect there), a failed remap, clocks held down."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from agent.errors import InvalidSpec
from agent.gpu.sim import SimControl, open_simulator

from .conftest import Opener, create_at, enable_mig

_ECC = (
    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
)


def _ecc(nvml: object, handle: object) -> dict[str, int]:
    get = nvml.nvmlDeviceGetTotalEccErrors  # type: ignore[attr-defined]
    return {
        f"{kind}_{span}": get(handle, error_type, counter)
        for kind, error_type in zip(("dbe", "sbe"), _ECC, strict=True)
        for span, counter in (
            ("volatile", pynvml.NVML_VOLATILE_ECC),
            ("aggregate", pynvml.NVML_AGGREGATE_ECC),
        )
    }


def test_an_xid_inside_a_gpu_instance_carries_its_id(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    handle = enable_mig(nvml, 1)
    gi = create_at(nvml, handle, 19, 0, 1)  # 1g.10gb
    gi_id = nvml.nvmlGpuInstanceGetInfo(gi).id
    event_set = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    control.raise_xid(1, 13, gpu_instance=gi_id)
    event = nvml.nvmlEventSetWait(event_set, 1000)
    assert (event.eventData, event.gpuInstanceId) == (13, gi_id)
    with pytest.raises(InvalidSpec):
        control.raise_xid(0, 13, gpu_instance=1)  # GPU 0 has no MIG
    nvml.nvmlEventSetFree(event_set)


def test_ecc_errors_count_and_a_reset_applies_the_pending_remap(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert _ecc(nvml, handle) == dict.fromkeys(_ecc(nvml, handle), 0)
    assert nvml.nvmlDeviceGetRemappedRows(handle) == (0, 0, 0, 0)
    control.memory_errors(0, sbe=5, dbe=2)
    assert _ecc(nvml, handle) == {
        "dbe_volatile": 2, "dbe_aggregate": 2, "sbe_volatile": 5, "sbe_aggregate": 5,
    }  # fmt: skip
    assert nvml.nvmlDeviceGetRemappedRows(handle) == (0, 0, 1, 0)  # pending until a reset
    control.reset_gpu(0)
    assert _ecc(nvml, handle) == {
        "dbe_volatile": 0, "dbe_aggregate": 2, "sbe_volatile": 0, "sbe_aggregate": 5,
    }  # fmt: skip
    assert nvml.nvmlDeviceGetRemappedRows(handle) == (0, 2, 0, 0)
    control.memory_errors(0, remap_failure=True)
    assert nvml.nvmlDeviceGetRemappedRows(handle)[3] == 1
    with pytest.raises(InvalidSpec):
        control.memory_errors(0, dbe=-1)


def test_clocks_held_down_add_to_the_computed_idle_reason(node: Opener) -> None:
    nvml, control = node("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(3)
    idle = pynvml.nvmlClocksEventReasonGpuIdle
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == idle
    thermal = pynvml.nvmlClocksEventReasonHwThermalSlowdown
    control.hold_clocks(3, ["hw_thermal"])
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == idle | thermal
    control.hold_clocks(3, [])
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == idle
    with pytest.raises(InvalidSpec, match="allowed: sw_power_cap"):
        control.hold_clocks(3, ["gpu_idle"])


def test_the_sim_commands_inject_them(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from agent.cli.main import cli

    def sim(*args: str) -> None:
        base = ["--simulate", "dgx-h100", "--state-dir", str(tmp_path), "sim"]
        result = CliRunner().invoke(cli, [*base, *args])
        assert result.exit_code == 0, result.output

    sim("ecc", "2", "--dbe", "1", "--sbe", "3")
    sim("clocks", "2", "hw_thermal", "hw_power_brake")
    sim("xid", "2", "48")
    nvml = open_simulator(tmp_path, "dgx-h100")
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(2)
        assert _ecc(nvml, handle)["dbe_volatile"] == 1
        reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        held = pynvml.nvmlClocksEventReasonHwThermalSlowdown
        assert reasons & held and reasons & pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    finally:
        nvml.nvmlShutdown()
    assert SimControl(tmp_path).describe()["pending_xids"][-1]["xid"] == 48
    sim("clocks", "2")  # none: clocks run free
