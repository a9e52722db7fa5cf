"""Fleet and coordinator numbers have an upper bound: a duration at most 7 days (as
`rightsize --window` and `--node-timeout`), a replay's --end at most 366 days. Past it is a typo
(`1e308`, `999999999999999d`), refused naming the option before any agent is dialled."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.coordinator import coordinator
from agent.cli.fleet import fleet
from tests.unit.coordinator.agents import invoke
from tests.unit.coordinator.listener import connected

WEEK = str(7 * 24 * 3600)


@pytest.mark.parametrize(
    "option",
    [
        "--interval",
        "--retry-backoff",
        "--retry-backoff-max",
        "--status-max-age",
        "--lease-duration",
        "--renew-deadline",
        "--retry-period",
    ],
)
@pytest.mark.parametrize("value", ["1e308", str(7 * 24 * 3600 + 1)])
def test_coordinator_serve_refuses_a_duration_past_a_week(
    option: str, value: str, tmp_path: Path, listener: socket.socket
) -> None:
    """`coordinator serve --interval 1e308` (or --retry-backoff 1e308) was taken: a loop that
    never runs again, a node never retried."""
    address = f"unix:{listener.getsockname()}"
    args = ["serve", "--agents", address, "--insecure", "--timeout", "1", "--once"]
    args += ["--desired", str(tmp_path / "none.yaml"), "--listen", "127.0.0.1:0", option, value]
    result = CliRunner().invoke(coordinator, args)
    assert result.exit_code == 2, result.output
    assert f"'{option}'" in result.output and f"<={WEEK}" in result.output
    assert not connected(listener)


@pytest.mark.parametrize("value", ["999999999999999d", "8d", "1e308"])
def test_fleet_status_refuses_an_idle_threshold_past_a_week(
    value: str, listener: socket.socket
) -> None:
    address = f"unix:{listener.getsockname()}"
    result = invoke(fleet, ["status", "--agents", address, "--insecure", "--idle-after", value])
    assert result.exit_code == 2, result.output
    assert "idle-after: " in result.output and "0 to 7d" in result.output
    assert not connected(listener)


def test_fleet_status_still_takes_a_week(listener: socket.socket) -> None:
    """The bound itself is a duration: refused only past it (here: the agent is dialled)."""
    address = f"unix:{listener.getsockname()}"
    args = ["status", "--agents", address, "--insecure", "--timeout", "0.2", "--idle-after", "7d"]
    result = invoke(fleet, args)
    assert "idle-after" not in result.output, result.output
    assert connected(listener)


@pytest.mark.parametrize("value", ["1e308", str(366 * 24 * 3600 + 1)])
def test_replay_refuses_an_end_past_a_year(tmp_path: Path, value: str) -> None:
    """`fleet replay --end 1e308` reported `inf` GPU-hours idle."""
    trace = tmp_path / "trace.csv"
    trace.write_text("time,profile,count\n0,3g.40gb,4\n")
    args = ["replay", "--trace", str(trace), "--offline", "--add", "dgx-h100=1", "--end", value]
    result = invoke(fleet, args)
    assert result.exit_code == 2, result.output
    assert "'--end'" in result.output and "0<=x<=31622400" in result.output
    fine = invoke(fleet, [*args[:-1], str(366 * 24 * 3600), "-o", "json"])
    assert fine.exit_code == 0, fine.output
