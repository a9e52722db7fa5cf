"""Configuration errors are refused up front, in one line with exit 2, instead of looking like
an unreachable fleet or a pass that succeeded."""

from __future__ import annotations

from pathlib import Path

from agent.cli.coordinator import coordinator
from agent.cli.fleet import fleet
from tests.unit.coordinator.agents import invoke


def test_a_missing_tls_file_is_a_configuration_error_not_an_unreachable_fleet(
    tmp_path: Path,
) -> None:
    result = invoke(fleet, ["status", "--agents", "127.0.0.1:1", "--tls-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output == (
        f"error: cannot read the client TLS file {tmp_path / 'ca.crt'} (--tls-ca or --tls-dir): "
        "No such file or directory\n"
    )


def test_serve_once_with_a_desired_file_that_does_not_parse_exits_2(tmp_path: Path) -> None:
    desired = tmp_path / "desired.yaml"
    desired.write_text("version: v1\nmig: [\n")
    result = invoke(
        coordinator,
        ["serve", "--once", "--desired", str(desired), "--agents", "127.0.0.1:1", "--insecure"],
    )
    assert result.exit_code == 2, result.output
    assert "desired.yaml" in result.output


def test_unsafe_election_timings_are_refused(tmp_path: Path) -> None:
    result = invoke(
        coordinator,
        [
            "serve", "--once", "--desired", str(tmp_path / "none.yaml"),
            "--agents", "127.0.0.1:1", "--insecure",
            "--lease-duration", "5", "--renew-deadline", "5",
        ],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "the lease duration must be longer than the renew deadline" in result.output
