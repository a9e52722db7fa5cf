"""Fleet commands that write a file: one they cannot write is refused naming its option, before
any work (no agent dialled, no solver run, no node changed), as `mig generate-config -f` is."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from agent.cli.fleet import fleet
from tests.unit.coordinator.agents import invoke
from tests.unit.coordinator.listener import connected

MISSING = "no-such-dir/out"


def _refused_naming(output: str, option: str, path: Path) -> None:
    assert f"cannot write {path}: No such file or directory" in output, output
    assert f"{option}: a writable path" in output, output
    assert "Traceback" not in output and "FileNotFoundError" not in output


@pytest.mark.parametrize(("option", "name"), [("--report", "r.csv"), ("--svg", "r.svg")])
def test_replay_refuses_an_output_in_a_missing_directory_before_replaying(
    tmp_path: Path, option: str, name: str
) -> None:
    """`fleet replay --report /nonexistent-dir/r.csv` replayed the whole trace, then ended in a
    FileNotFoundError traceback."""
    trace = tmp_path / "trace.csv"
    trace.write_text("time,profile,count\n0,3g.40gb,4\n")
    out = tmp_path / MISSING / name
    args = ["replay", "--trace", str(trace), "--offline", "--add", "dgx-h100=1", option, str(out)]
    result = invoke(fleet, args)
    assert result.exit_code == 2, result.output
    _refused_naming(result.output, option.removeprefix("--"), out)
    assert "step(s) leave demand unmet" not in result.output  # refused before the replay


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["plan", "--demand", "DEMAND", "--out", "OUT"], "out"),
        (["rightsize", "--window", "0", "--demand-out", "OUT"], "demand-out"),
        (["apply", "mig", "-f", "CONFIG", "--record", "OUT"], "record"),
        (["apply", "share", "--strategy", "mps", "--replicas", "2", "--record", "OUT"], "record"),
    ],
)
def test_an_output_in_a_missing_directory_is_refused_before_any_agent_is_dialled(
    tmp_path: Path, listener: socket.socket, args: list[str], option: str
) -> None:
    """`fleet plan --out /nonexistent-dir/plan.yaml` failed only after the solver ran (a
    traceback), `rightsize --demand-out` after the whole watch, and `fleet apply mig --record`
    after nodes had changed (the record is saved as the rollout goes)."""
    demand = tmp_path / "demand.yaml"
    demand.write_text("version: v1\ndemand: {1g.10gb: 1}\n")
    config = tmp_path / "mig.yaml"
    config.write_text(
        "version: v1\nmig-configs:\n  all-1g:\n"
        "    - {devices: all, mig-enabled: true, mig-devices: {1g.10gb: 7}}\n"
    )
    out = tmp_path / MISSING / "x.yaml"
    swap = {"DEMAND": str(demand), "CONFIG": str(config), "OUT": str(out)}
    address = f"unix:{listener.getsockname()}"
    result = invoke(fleet, [*(swap.get(a, a) for a in args), "--agents", address, "--insecure"])
    assert result.exit_code == 2, result.output
    _refused_naming(result.output, option, out)
    assert not connected(listener)


def test_a_directory_that_cannot_be_written_is_refused_too(
    tmp_path: Path, listener: socket.socket
) -> None:
    """A file as the directory (ENOTDIR), as a missing one: refused before any agent."""
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "plan.yaml"
    demand = tmp_path / "demand.yaml"
    demand.write_text("version: v1\ndemand: {1g.10gb: 1}\n")
    address = f"unix:{listener.getsockname()}"
    args = ["plan", "--demand", str(demand), "--out", str(out), "--agents", address, "--insecure"]
    result = invoke(fleet, args)
    assert result.exit_code == 2, result.output
    assert f"cannot write {out}: Not a directory" in result.output
    assert not connected(listener)
