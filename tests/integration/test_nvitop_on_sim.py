"""nvitop and gpustat, unmodified, read the simulated node through pynvml, started the supported
way: ``gpu-agent sim exec -- PROGRAM``.

The external check that the simulator speaks pynvml rather than a dialect of our own: nvitop calls
pynvml's wrappers and, for process lists and memory, C symbols directly with its own structs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent.gpu.sim import SimControl, open_simulator

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

BIN = Path(sys.executable).parent


def sim_exec(state_dir: Path, *program: str) -> subprocess.CompletedProcess[str]:
    """``gpu-agent --simulate dgx-h100 --state-dir STATE sim exec -- PROGRAM...``"""
    node = ["--simulate", "dgx-h100", "--state-dir", str(state_dir)]
    return subprocess.run(
        [sys.executable, "-m", "agent.cli.main", *node, "sim", "exec", "--", *program],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
    )


def nvitop(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return sim_exec(state_dir, "nvitop", *args)


#: GPU 0's process: a pid past the kernel's pid_max, which no host process can have, so gpustat
#: (which shows only processes psutil finds) must leave it out. A fixed small pid (4242) was once
#: a live pytest worker of the same run, and gpustat listed it.
SIMULATED_ONLY_PID = int(Path("/proc/sys/kernel/pid_max").read_text()) + 4242


@pytest.fixture
def busy_node(tmp_path: Path) -> Path:
    """A DGX H100: GPU 0 busy with one process, GPU 1 in MIG mode with a process on a 3g."""
    nvml = open_simulator(tmp_path, "dgx-h100")
    nvml.nvmlInit()
    control = SimControl(tmp_path)
    control.set_workload(0, sm_active=0.75, dram_active=0.4)
    control.start_process(SIMULATED_ONLY_PID, 0, used_memory_mib=12345)
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.nvmlDeviceSetMigMode(handle, nvml.NVML_DEVICE_MIG_ENABLE)
    gi = nvml.nvmlDeviceCreateGpuInstance(handle, 9)
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, nvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    gi_id = nvml.nvmlGpuInstanceGetInfo(gi).id
    control.start_process(4343, 1, gpu_instance=gi_id, used_memory_mib=2000)
    nvml.nvmlShutdown()
    return tmp_path


def test_nvitop_lists_gpus_memory_utilisation_and_processes(busy_node: Path) -> None:
    result = nvitop(busy_node, "--once")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Driver Version: 550.90.07" in out
    assert out.count("H100 80GB HBM3") == 8
    gpu0 = next(line for line in out.splitlines() if "12345MiB / 79.65GiB" in line)
    assert "75%" in gpu0  # utilisation of the injected workload
    assert "3g.40gb @ GI/CI: 2/0" in out  # the MIG device
    assert "2000MiB / 39.50GiB" in out  # its memory
    assert str(SIMULATED_ONLY_PID) in out and "4343" in out  # both processes
    assert "FunctionNotFound" not in result.stderr


_RUN_EXPORTER = textwrap.dedent(
    """
    import json
    import time

    from nvitop import Device
    from nvitop.api import libnvml
    from nvitop_exporter.exporter import PrometheusExporter
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    device = Device(0)
    exporter = PrometheusExporter([device], "node", registry=registry)
    # One scrape loop iteration twice (collect() loops forever): the NVLink rate is the counter
    # difference between two updates.
    exporter.update_device(device)
    time.sleep(0.2)
    exporter.update_device(device)
    labels = {"hostname": "node", "index": "0", "devicename": device.name(), "uuid": device.uuid()}
    tx = registry.get_sample_value("gpu_nvlink_total_tx_throughput_MiBps", labels)
    print(json.dumps({"unknown": sorted(libnvml.UNKNOWN_FUNCTIONS), "nvlink_tx_mib_s": tx}))
    """
)


def test_nvitop_exporter_reads_nvlink_through_field_values(tmp_path: Path) -> None:
    """nvitop-exporter's NVLink gauges come from nvmlDeviceGetFieldValues: no FunctionNotFound."""
    open_simulator(tmp_path, "dgx-h100")
    SimControl(tmp_path).set_workload(0, nvlink_tx_bytes_per_s=18 * 2**30)  # 18 GiB/s, 18 links
    result = sim_exec(tmp_path, sys.executable, "-c", _RUN_EXPORTER)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert "nvmlDeviceGetFieldValues" not in out["unknown"]
    assert "FunctionNotFound" not in result.stderr
    assert out["nvlink_tx_mib_s"] == pytest.approx(18 * 1024, rel=0.05)


def test_gpustat_lists_the_simulated_gpus_and_processes(busy_node: Path) -> None:
    # gpustat shows only processes psutil finds on the host: give GPU 2 this test's own pid.
    SimControl(busy_node).start_process(os.getpid(), 2, used_memory_mib=512)
    result = sim_exec(busy_node, "gpustat", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["driver_version"] == "550.90.07"
    gpus = report["gpus"]
    assert [g["name"] for g in gpus] == ["NVIDIA H100 80GB HBM3"] * 8
    assert gpus[0]["memory.used"] == 12345 and gpus[0]["utilization.gpu"] == 75
    assert gpus[0]["processes"] == []  # simulated only: gpustat leaves it out
    (mine,) = gpus[2]["processes"]
    assert mine["pid"] == os.getpid() and mine["gpu_memory_usage"] == 512


def test_sim_exec_puts_the_simulator_under_plain_import_pynvml(tmp_path: Path) -> None:
    """Any Python program, not only the tools tested above: ``import pynvml`` is the simulator of
    the node named on the command line, which exec creates from the preset."""
    code = (
        "import pynvml; pynvml.nvmlInit(); "
        "print(type(pynvml).__name__, pynvml.nvmlDeviceGetCount(), "
        "pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(7)))"
    )
    result = sim_exec(tmp_path / "node", sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["SimNvml", "8", "NVIDIA", "H100", "80GB", "HBM3"]


def test_sim_exec_names_a_program_it_cannot_run(tmp_path: Path) -> None:
    result = sim_exec(tmp_path, "no-such-program-here")
    assert result.returncode != 0
    assert "cannot run 'no-such-program-here'" in result.stderr
