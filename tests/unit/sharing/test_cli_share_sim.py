"""``gpu-agent share`` on a simulated node (an embedded agent): what it says of GPUs it cannot
read."""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.testing import CliRunner, Result

from agent.cli.context import CliContext
from agent.cli.mig import mig
from agent.cli.share import share
from agent.gpu.sim import SimControl

ALL_7G = """\
version: v1
mig-configs:
  all-7g:
    - devices: all
      mig-enabled: true
      mig-devices: {7g.80gb: 1}
"""


def _share(tmp_path: Path, *args: str, command: click.Command = share) -> Result:
    flags = {
        "simulate": "dgx-h100",
        "state_dir": tmp_path,
        "sharing.config_path": tmp_path / "plugin" / "config.yaml",
        "sharing.reload": "none",
    }
    obj = CliContext(None, flags, env={})
    try:
        return CliRunner().invoke(command, list(args), obj=obj)
    finally:
        obj.close()


def test_a_gpu_that_cannot_be_read_is_not_counted_as_advertised_and_is_named(
    tmp_path: Path,
) -> None:
    """Every GPU has MIG on (one 7g.80gb each); GPU 1 answers NVML's list but its MIG-mode read
    fails (it needs a reset): `share set` counted it as a whole GPU the plugin advertises
    ("nvidia.com/gpu 1, nvidia.com/mig-7g.80gb 7" under mixed), and under single found a
    mixed-MIG problem ("some GPUs have MIG enabled and others not"), though the plugin's own
    read of it fails too. What is advertised is not known, naming the GPU and the call, as for
    a lost GPU, and the GPUs read raise no problem."""
    (tmp_path / "plugin").mkdir()
    config = tmp_path / "mig.yaml"
    config.write_text(ALL_7G)
    applied = _share(tmp_path, "apply", "-f", str(config), "-c", "all-7g", command=mig)
    assert applied.exit_code == 0, applied.output
    SimControl(tmp_path).inject_fault("nvmlDeviceGetMigMode", "Unknown", gpu=1, count=10**6)
    for strategy in ("mixed", "single"):
        result = _share(tmp_path, "set", "--mig-strategy", strategy, "-o", "json")
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["advertised"] is None, data
        assert str(data["advertised_unknown"]).startswith(
            "GPU 1 cannot be read (nvmlDeviceGetMigMode: Unknown Error)"
        ), data
        assert data["problems"] == [], data
