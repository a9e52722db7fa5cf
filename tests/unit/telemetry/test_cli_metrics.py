"""``gpu-agent metrics`` prints one scrape's worth of metrics from the simulated node."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from agent.cli.context import CliContext
from agent.cli.main import cli
from agent.cli.metrics import metrics
from agent.gpu import open_driver
from agent.gpu.sim import SimControl


def _context(state_dir: Path) -> CliContext:
    env = {"GPU_AGENT_TELEMETRY__KUBELET_SOCKET": str(state_dir / "absent.sock")}
    return CliContext(None, {"simulate": "dgx-h100", "state_dir": state_dir}, env=env)


def test_prints_dcgm_names_with_profiling_values(tmp_path: Path) -> None:
    open_driver("dgx-h100", tmp_path).close()
    SimControl(tmp_path).set_workload(0, tensor_active=0.5)
    ctx = _context(tmp_path)
    result = CliRunner().invoke(metrics, [], obj=ctx)
    ctx.close()
    assert result.exit_code == 0, result.output
    tensor = [
        line
        for line in result.output.splitlines()
        if line.startswith("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{") and 'gpu="0"' in line
    ]
    assert len(tensor) == 1 and tensor[0].endswith(" 0.5")


def test_native_openmetrics_with_a_counters_file(tmp_path: Path) -> None:
    open_driver("dgx-h100", tmp_path).close()
    csv = tmp_path / "counters.csv"
    csv.write_text("DCGM_FI_DEV_POWER_USAGE, gauge, power\n")
    ctx = _context(tmp_path)
    args = ["--metric-names", "native", "--collectors", str(csv), "--openmetrics"]
    result = CliRunner().invoke(metrics, args, obj=ctx)
    ctx.close()
    assert result.exit_code == 0, result.output
    assert "# TYPE gpu_agent_power_watts gauge" in result.output
    assert not [line for line in result.output.splitlines() if line.startswith("DCGM_FI_")]
    assert result.output.endswith("# EOF\n")


def test_a_bad_counters_file_is_a_clear_error_each_problem_once(tmp_path: Path) -> None:
    open_driver("dgx-h100", tmp_path).close()
    csv = tmp_path / "counters.csv"
    csv.write_text("DCGM_FI_DEV_GPU_TEMPERATURE, gauge, t\nDCGM_FI_DEV_SM_CLOCK, gage, c\n")
    env = {"GPU_AGENT_TELEMETRY__KUBELET_SOCKET": str(tmp_path / "absent.sock")}
    args = ["--simulate", "dgx-h100", "--state-dir", str(tmp_path), "metrics"]
    result = CliRunner().invoke(cli, [*args, "--collectors", str(csv)], env=env)
    assert result.exit_code == 2, result.output
    err = result.stderr
    assert err.count("did you mean DCGM_FI_DEV_GPU_TEMP") == 1, err
    assert err.count("unknown type 'gage'") == 1, err
    assert err.splitlines()[0].startswith("error: invalid counters CSV") and "(2 problems)" in err


def test_a_new_state_dir_gets_its_node_from_the_preset(tmp_path: Path) -> None:
    """As `serve` does: no simulated node yet is not an error when a preset is given."""
    ctx = _context(tmp_path)
    result = CliRunner().invoke(metrics, [], obj=ctx)
    ctx.close()
    assert result.exit_code == 0, result.output
    temps = [
        line for line in result.output.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")
    ]
    assert len(temps) == 8  # every GPU of the dgx-h100 preset
    assert SimControl(tmp_path).describe()["preset"] == "dgx-h100"
