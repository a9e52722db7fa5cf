"""One driver per node: processes share the state file, and a killed writer cannot corrupt it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pynvml
import pytest

from agent.gpu.sim import SimControl, open_simulator
from agent.gpu.sim.store import StateStore

from .conftest import placements_of

REPO = Path(__file__).resolve().parents[3]


def run_python(code: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout


def test_a_gpu_instance_created_by_another_process_is_visible(tmp_path: Path) -> None:
    nvml = open_simulator(tmp_path, "dgx-h100")
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(handle) == [0, 0]  # this process has read the state
    run_python(
        """
        import ctypes, sys
        from pathlib import Path
        from agent.gpu.sim import open_simulator
        nvml = open_simulator(Path(sys.argv[1]))
        nvml.nvmlInit()
        h = nvml.nvmlDeviceGetHandleByIndex(0)
        nvml.nvmlDeviceSetMigMode(h, nvml.NVML_DEVICE_MIG_ENABLE)
        p = nvml.c_nvmlGpuInstancePlacement_t(start=4, size=4)
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, ctypes.byref(p))
        nvml.nvmlShutdown()
        """,
        str(tmp_path),
    )
    assert nvml.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert placements_of(nvml, handle) == [(2, 9, 4, 4)]
    nvml.nvmlShutdown()


def test_fault_counts_are_shared_between_processes(tmp_path: Path) -> None:
    nvml = open_simulator(tmp_path, "dgx-h100")
    nvml.nvmlInit()
    SimControl(tmp_path).inject_fault("nvmlDeviceGetCount", "Unknown", nth=2)
    out = run_python(
        """
        import sys
        from pathlib import Path
        from agent.gpu.sim import open_simulator
        nvml = open_simulator(Path(sys.argv[1]))
        nvml.nvmlInit()
        print(nvml.nvmlDeviceGetCount())
        """,
        str(tmp_path),
    )
    assert out.strip() == "8"  # the first call, in the other process
    with pytest.raises(pynvml.NVMLError_Unknown):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlShutdown()


def test_an_xid_raised_elsewhere_reaches_a_waiting_set(tmp_path: Path) -> None:
    nvml = open_simulator(tmp_path, "dgx-a100")
    nvml.nvmlInit()
    event_set = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(
        nvml.nvmlDeviceGetHandleByIndex(6), pynvml.nvmlEventTypeXidCriticalError, event_set
    )
    run_python(
        """
        import sys
        from pathlib import Path
        from agent.gpu.sim import SimControl
        SimControl(Path(sys.argv[1])).raise_xid(6, 94)
        """,
        str(tmp_path),
    )
    assert nvml.nvmlEventSetWait(event_set, 1000).eventData == 94
    nvml.nvmlShutdown()


def test_a_sigkilled_writer_never_leaves_a_corrupt_state(tmp_path: Path) -> None:
    open_simulator(tmp_path, "hgx-h200")
    writer = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from agent.gpu.sim import SimControl
        control = SimControl(Path(sys.argv[1]))
        print("ready", flush=True)
        i = 0
        while True:
            i += 1
            control.set_workload(i % 8, sm_active=(i % 100) / 100, pcie_tx_bytes_per_s=i)
        """
    )
    state_file = tmp_path / "sim" / "state.json"
    for delay in (0.05, 0.11, 0.17, 0.23, 0.29):
        proc = subprocess.Popen(
            [sys.executable, "-c", writer, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE
        )
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        json.loads(state_file.read_text())  # whole, parseable
        node = StateStore(tmp_path).read()
        assert len(node.gpus) == 8
    SimControl(tmp_path).clear_workload(0)  # the next writer sweeps a killed writer's temp file
    assert list((tmp_path / "sim").glob(".state.*.tmp")) == []


def test_each_call_sees_the_state_as_it_starts_in_every_thread(tmp_path: Path) -> None:
    """One state read per call, per thread: a call blocked in one thread does not pin the
    state another thread's calls answer from, and every write is seen by the next call."""
    nvml = open_simulator(tmp_path, "dgx-h100")
    nvml.nvmlInit()
    control = SimControl(tmp_path)
    event_set = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(
        nvml.nvmlDeviceGetHandleByIndex(1), pynvml.nvmlEventTypeXidCriticalError, event_set
    )
    waited: list[int] = []
    waiter = threading.Thread(
        target=lambda: waited.append(nvml.nvmlEventSetWait(event_set, 5000).eventData)
    )
    waiter.start()  # blocks in the library, from the state as its call started
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    for mode in (1, 0, 1):
        nvml.nvmlDeviceSetMigMode(handle, mode)
        assert nvml.nvmlDeviceGetMigMode(handle) == [mode, mode]
    lost = nvml.nvmlDeviceGetHandleByIndex(2)
    control.mark_lost(2)  # another store's write: the next call sees it
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetUUID(lost)
    assert waiter.is_alive()
    control.raise_xid(1, 31)
    waiter.join(5)
    assert waited == [31]
    nvml.nvmlShutdown()
