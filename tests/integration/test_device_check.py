"""scripts/device-check.py, run against the simulator standing in for a real GPU's pynvml.

The script is meant for a machine with a real GPU; here the simulator is installed as the
``pynvml`` module of the script's process, so the script cannot tell. It must find no difference
(the simulator agrees with itself through the real read path) and must change nothing.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = ROOT / "scripts" / "device-check.py"
_RUN = (
    "import runpy, sys; from pathlib import Path;"
    "from agent.gpu.sim import install_as_pynvml;"
    "install_as_pynvml(Path(sys.argv[1]), sys.argv[2]);"
    "sys.argv = ['device-check.py', '--gpu', *sys.argv[3:]];"
    f"runpy.run_path({str(_SCRIPT)!r}, run_name='__main__')"
)


def _state_digest(state_dir: Path) -> str:
    files = sorted(p for p in (state_dir / "sim").rglob("*") if p.is_file() and p.suffix != ".lock")
    return hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()


@pytest.mark.parametrize(("preset", "gpu"), [("hgx-h200", 0), ("a30-node", 1), ("mixed", 5)])
def test_device_check_reads_only_and_agrees_with_the_simulator(
    tmp_path: Path, preset: str, gpu: int
) -> None:
    from agent.gpu import open_driver

    open_driver(preset, tmp_path).close()  # create the node
    before = _state_digest(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, str(tmp_path), preset, str(gpu), "--skip-agent"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["record"]["differences"] == []
    assert report["record"]["real"]["facts"]["gi_profiles"], "no MIG profile facts were read"
    assert _state_digest(tmp_path) == before, "device-check changed the GPU's state"


def test_device_check_runs_the_agent_under_load_and_its_doctor(tmp_path: Path) -> None:
    """The whole conformance run, its agent and load on the simulator: every moving series
    (tensor, DRAM, SM, PCIe, power under dcgm-exporter's names) is exported and moves with the
    load, the agent stops cleanly on SIGTERM, doctor answers, and nothing of the GPU's setup
    (MIG mode, instances, power limit) changed."""
    from agent.gpu import open_driver

    preset = "hgx-h200"
    driver = open_driver(preset, tmp_path)
    layout_before = driver.layout(driver.gpus()[0].uuid)
    limits_before = driver.power_limits(driver.gpus()[0].uuid)
    driver.close()
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, str(tmp_path), preset, "0", "--phase-s", "3",
         "--sim-preset", preset, "--sim-state", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=240,
    )  # fmt: skip
    report = json.loads(proc.stdout)
    agent = report["agent"]
    assert {name: v["state"] for name, v in agent["series"].items()} == {
        name: "moved" for name in agent["series"]
    }, agent["series"]
    assert len(agent["series"]) == 6 and agent["load"] == "simulated"
    assert agent["agent_exit"] == 0
    assert agent["doctor"]["checks"], agent["doctor"]  # doctor answered through that agent
    assert proc.returncode == (1 if report["failures"] else 0) and report["failures"] == []
    driver = open_driver(preset, tmp_path)
    try:
        uuid = driver.gpus()[0].uuid
        assert driver.layout(uuid).instances == layout_before.instances
        assert driver.gpus()[0].mig_mode == layout_before.gpu.mig_mode
        assert driver.power_limits(uuid) == limits_before
    finally:
        driver.close()
