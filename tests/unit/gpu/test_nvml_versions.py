"""Old drivers: the one NVML gateway falls back through a function's versions (as nvitop's
libnvml does), so `status` and `mig show` work on a driver without the ``_v3`` process list
(R450/R470, and 535.98+ per nvitop's history)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.context import CliContext
from agent.cli.mig import mig
from agent.cli.status import status
from agent.errors import NotSupported
from agent.gpu import GpuDriver, open_driver
from agent.gpu.sim import SimControl

_V3 = "nvmlDeviceGetComputeRunningProcesses_v3"
_V2 = "nvmlDeviceGetComputeRunningProcesses_v2"


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[GpuDriver]:
    gpu = open_driver("dgx-h100", tmp_path)
    yield gpu
    gpu.close()


def _drop(monkeypatch: pytest.MonkeyPatch, driver: GpuDriver, *symbols: str) -> None:
    """Take symbols out of the (simulated) libnvidia-ml, as an older driver lacks them."""
    exports = driver.nvml.module.nvmlLib._exports
    for name in symbols:
        monkeypatch.delitem(exports, name)


def test_process_list_falls_back_to_v2_and_remembers_it(
    driver: GpuDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _drop(monkeypatch, driver, _V3)
    SimControl(tmp_path).start_process(4242, 0, used_memory_mib=1024)
    uuid = driver.gpus()[0].uuid
    (proc,) = driver.processes(uuid)
    assert (proc.pid, proc.used_memory_bytes) == (4242, 1024 * 1024 * 1024)
    assert driver.nvml.versions_in_use()["nvmlDeviceGetComputeRunningProcesses"] == 1
    before = driver.calls["nvmlDeviceGetComputeRunningProcesses"]
    driver.processes(uuid)
    # Remembered: the second list is one call, not a failed _v3 try first.
    assert driver.calls["nvmlDeviceGetComputeRunningProcesses"] == before + 1


def test_no_version_at_all_is_not_supported(
    driver: GpuDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _drop(monkeypatch, driver, _V3, _V2)  # the simulator has no v1 symbol either
    with pytest.raises(NotSupported):
        driver.processes(driver.gpus()[0].uuid)


def test_status_and_mig_show_work_without_v3(tmp_path: Path) -> None:
    """535.98 has no _v3 process calls (agent/gpu/sim/generations.py): the commands answer,
    with the process list read through the older call."""
    open_driver("dgx-h100", tmp_path).close()
    control = SimControl(tmp_path)
    control.install_driver("535.98")  # 535.98 dropped the _v3 calls (535.104.05 restored them)
    control.start_process(4242, 1, used_memory_mib=2048)
    env = {
        "GPU_AGENT_SOCKET_PATH": str(tmp_path / "no-agent.sock"),
        "GPU_AGENT_TELEMETRY__KUBELET_SOCKET": str(tmp_path / "absent.sock"),
    }
    ctx = CliContext(None, {"simulate": "dgx-h100", "state_dir": tmp_path}, env=env)
    try:
        shown = CliRunner().invoke(status, ["-o", "json"], obj=ctx)
        assert shown.exit_code == 0, shown.output
        assert '"pid": 4242' in shown.output
        layout = CliRunner().invoke(mig, ["show"], obj=ctx)
        assert layout.exit_code == 0, layout.output
        assert "NVIDIA H100 80GB HBM3" in layout.output
    finally:
        ctx.close()


def test_memory_info_falls_back_to_v1_without_a_reserved_figure(
    driver: GpuDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.gpu.reading_calls import Reading
    from agent.gpu.readings import NodeReader

    _drop(monkeypatch, driver, "nvmlDeviceGetMemoryInfo_v2")
    reader = NodeReader(driver)
    reader.gpus()
    wanted = {Reading.FB_TOTAL_BYTES, Reading.FB_USED_BYTES, Reading.FB_RESERVED_BYTES}
    out = reader.read(0, wanted)
    assert out.values[Reading.FB_TOTAL_BYTES] > 0
    assert Reading.FB_RESERVED_BYTES not in out.values  # unknown, not 0


def test_a_driver_with_only_the_v1_process_list_is_read_with_the_v1_struct(
    driver: GpuDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R450-era drivers export only the unversioned symbol, whose records have no GI/CI ids.
    The simulator has no v1 symbol, so this test gives it one that speaks the v1 ABI."""
    import pynvml

    calls: list[bool] = []

    def v1(handle: object, count_ref: object, array: object) -> int:
        count = count_ref._obj  # type: ignore[attr-defined]  # ctypes.byref's target
        calls.append(array is None)
        if array is None:
            count.value = 2
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        array[0].pid, array[0].usedGpuMemory = 11, 1 << 30  # type: ignore[index]
        array[1].pid = 12  # type: ignore[index]
        array[1].usedGpuMemory = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value  # type: ignore[index]
        count.value = 2
        return pynvml.NVML_SUCCESS

    _drop(monkeypatch, driver, _V3, _V2)
    monkeypatch.setitem(
        driver.nvml.module.nvmlLib._exports, "nvmlDeviceGetComputeRunningProcesses", v1
    )
    procs = driver.processes(driver.gpus()[0].uuid)
    assert [(p.pid, p.used_memory_bytes, p.gpu_instance_id) for p in procs] == [
        (11, 1 << 30, None),
        (12, None, None),  # "not available" is unknown, not a huge number
    ]
    assert calls == [True, False]
    assert driver.nvml.versions_in_use()["nvmlDeviceGetComputeRunningProcesses"] == 2


def test_clock_event_reasons_fall_back_to_the_pre_r535_name(
    driver: GpuDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.gpu.reading_calls import Reading
    from agent.gpu.readings import NodeReader

    exports = driver.nvml.module.nvmlLib._exports
    old_name = "nvmlDeviceGetCurrentClocksThrottleReasons"
    monkeypatch.setitem(exports, old_name, exports["nvmlDeviceGetCurrentClocksEventReasons"])
    _drop(monkeypatch, driver, "nvmlDeviceGetCurrentClocksEventReasons")
    reader = NodeReader(driver)
    reader.gpus()
    out = reader.read(0, {Reading.CLOCK_EVENT_REASONS})
    assert out.values[Reading.CLOCK_EVENT_REASONS] == 0x1  # idle: nothing runs on the GPU
    assert driver.nvml.versions_in_use()["nvmlDeviceGetCurrentClocksEventReasons"] == 1
