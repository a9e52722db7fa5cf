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
    "sys.argv = ['device-check.py', '--gpu', sys.argv[3]];"
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
        [sys.executable, "-c", _RUN, str(tmp_path), preset, str(gpu)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["differences"] == []
    assert report["real"]["gi_profiles"], "no MIG profile facts were read"
    assert _state_digest(tmp_path) == before, "device-check changed the GPU's state"
