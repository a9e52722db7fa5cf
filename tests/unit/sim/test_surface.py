"""The simulator is pynvml: same objects, same calling conventions, same failure modes."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pynvml
import pytest

from agent.errors import Conflict, InvalidSpec
from agent.gpu.sim import SimNvml, install_as_pynvml, open_simulator

from .conftest import Opener


def test_constants_structs_and_exceptions_are_pynvmls_own(tmp_path: Path) -> None:
    nvml = open_simulator(tmp_path, "dgx-h100")
    assert nvml.NVMLError is pynvml.NVMLError
    assert nvml.NVMLError_InUse is pynvml.NVMLError_InUse
    assert nvml.nvmlExceptionClass is pynvml.nvmlExceptionClass
    assert nvml.c_nvmlGpuInstancePlacement_t is pynvml.c_nvmlGpuInstancePlacement_t
    assert nvml.NVML_DEVICE_MIG_ENABLE == pynvml.NVML_DEVICE_MIG_ENABLE
    assert nvml.nvmlDeviceGetCount is not pynvml.nvmlDeviceGetCount


def test_every_call_before_init_raises_uninitialized(tmp_path: Path) -> None:
    nvml = open_simulator(tmp_path, "dgx-h100")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlShutdown()


def test_init_is_reference_counted(tmp_path: Path) -> None:
    nvml = open_simulator(tmp_path, "dgx-h100")
    nvml.nvmlInit()
    nvml.nvmlInitWithFlags(0)
    nvml.nvmlShutdown()
    assert nvml.nvmlDeviceGetCount() == 8
    nvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def test_unimplemented_functions_raise_function_not_found(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetPowerManagementMode(handle)


def test_simulator_never_touches_the_real_library(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    nvml.nvmlDeviceGetCount()
    assert pynvml.nvmlLib is None  # the real module never loaded libnvidia-ml
    assert nvml.nvmlLib is not None


def test_two_simulators_in_one_process_are_independent(tmp_path: Path) -> None:
    a = open_simulator(tmp_path / "a", "dgx-h100")
    b = open_simulator(tmp_path / "b", "a30-node")
    a.nvmlInit()
    b.nvmlInit()
    assert (a.nvmlDeviceGetCount(), b.nvmlDeviceGetCount()) == (8, 4)
    a.nvmlShutdown()
    assert b.nvmlDeviceGetCount() == 4
    b.nvmlShutdown()


def test_handles_are_pynvml_pointer_types(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(3)
    assert isinstance(handle, pynvml.c_nvmlDevice_t)
    assert nvml.nvmlDeviceGetIndex(handle) == 3
    by_uuid = nvml.nvmlDeviceGetHandleByUUID(nvml.nvmlDeviceGetUUID(handle))
    by_bus = nvml.nvmlDeviceGetHandleByPciBusId(nvml.nvmlDeviceGetPciInfo(handle).busId)
    value = ctypes.cast(handle, ctypes.c_void_p).value
    assert ctypes.cast(by_uuid, ctypes.c_void_p).value == value
    assert ctypes.cast(by_bus, ctypes.c_void_p).value == value


def test_strings_come_back_as_str(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    assert nvml.nvmlDeviceGetUUID(handle).startswith("GPU-")
    assert nvml.nvmlSystemGetDriverVersion() == "550.90.07"
    assert nvml.nvmlSystemGetCudaDriverVersion_v2() == 12040


def test_is_mig_device_handle_returns_a_c_uint_object(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    answer = nvml.nvmlDeviceIsMigDeviceHandle(nvml.nvmlDeviceGetHandleByIndex(0))
    assert isinstance(answer, ctypes.c_uint)
    assert answer.value == 0


def test_bad_handles_are_invalid_arguments(node: Opener) -> None:
    nvml, _ = node("dgx-h100")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetName(pynvml.c_nvmlDevice_t())
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(8)


def test_pci_info_packs_device_and_vendor(node: Opener) -> None:
    nvml, _ = node("hgx-h200")
    info = nvml.nvmlDeviceGetPciInfo_v3(nvml.nvmlDeviceGetHandleByIndex(1))
    assert isinstance(info, pynvml.nvmlPciInfo_t)
    assert info.pciDeviceId == 0x233510DE
    assert info.busId == "00000000:2A:00.0"
    assert info.busIdLegacy == "0000:2A:00.0"


def test_open_creates_then_reuses_the_node(tmp_path: Path) -> None:
    first = open_simulator(tmp_path, "dgx-a100")
    first.nvmlInit()
    uuid = first.nvmlDeviceGetUUID(first.nvmlDeviceGetHandleByIndex(0))
    again = open_simulator(tmp_path)
    again.nvmlInit()
    assert again.nvmlDeviceGetUUID(again.nvmlDeviceGetHandleByIndex(0)) == uuid


def test_open_never_replaces_a_node_with_another_preset(tmp_path: Path) -> None:
    open_simulator(tmp_path, "dgx-a100")
    with pytest.raises(Conflict, match=r"'dgx-a100'.*'dgx-h100'"):
        open_simulator(tmp_path, "dgx-h100")


def test_open_without_node_or_preset_asks_for_one(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match="--simulate PRESET"):
        open_simulator(tmp_path)


def test_open_rejects_an_unknown_preset(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpec, match="dgx-h100"):
        open_simulator(tmp_path, "dgx-z9000")
    assert not (tmp_path / "sim" / "state.json").exists()


def test_install_as_pynvml_replaces_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    module = install_as_pynvml(tmp_path, "a30-node")
    import pynvml as imported

    assert imported is module
    assert isinstance(module, SimNvml)
    module.nvmlInit()
    assert module.nvmlDeviceGetName(module.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA A30"
    module.nvmlShutdown()


def test_errors_read_the_drivers_text_not_a_bare_code(node: Opener) -> None:
    """A simulated NVMLError_InUse reads as the driver's text, not "NVML Error with code 19"."""
    nvml, _ = node("dgx-h100")
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetMigMode(handle, nvml.NVML_DEVICE_MIG_ENABLE)
    gi = nvml.nvmlDeviceCreateGpuInstance(handle, 9)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, nvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    with pytest.raises(pynvml.NVMLError_InUse) as busy:
        nvml.nvmlGpuInstanceDestroy(gi)  # its compute instance is still there
    assert str(busy.value) == "In use by another client"
    with pytest.raises(pynvml.NVMLError_InsufficientResources) as full:
        nvml.nvmlDeviceCreateGpuInstance(handle, 0)  # a 7g beside the 3g
    assert str(full.value) == "Insufficient Resources"
