"""The numbers a fleet command (and `coordinator serve`) takes are checked before any node is
contacted: a rollout's --node-timeout and --max-unavailable (its dry run too), every command's
--timeout, serve's intervals. Out of range or not finite, the command exits 2 naming the
option, and no agent is dialled (a --node-timeout of -1 started each node's apply and
cancelled it at once, failing the node 'timed out after -1 s')."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli.fleet import fleet
from tests.unit.coordinator.listener import connected
from tests.unit.mig.layouts import MIG_HALVES

COMMANDS = {
    "mig": ["apply", "mig", "-f", "{mig}", "-c", "halves"],
    "share": ["apply", "share", "--strategy", "time-slicing", "--replicas", "2"],
}


def _run(tmp_path: Path, listener: socket.socket, args: list[str]) -> str:
    mig = tmp_path / "mig.yaml"
    mig.write_text(MIG_HALVES)
    args = [a.format(mig=mig) for a in args]
    address = f"unix:{listener.getsockname()}"
    result = CliRunner().invoke(fleet, [*args, "--agents", address, "--insecure"])
    assert result.exit_code == 2, result.output
    assert not connected(listener)
    return result.output


@pytest.mark.parametrize("kind", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--node-timeout", "-1"),
        ("--node-timeout", "0"),
        ("--node-timeout", "nan"),
        ("--node-timeout", "inf"),
        ("--timeout", "-1"),
        ("--timeout", "0"),
        ("--timeout", "nan"),
    ],
)
def test_a_rollout_refuses_a_time_out_of_range_before_contacting_a_node(
    kind: str, option: str, value: str, tmp_path: Path, listener: socket.socket
) -> None:
    output = _run(tmp_path, listener, [*COMMANDS[kind], option, value])
    assert option in output


@pytest.mark.parametrize("kind", sorted(COMMANDS))
@pytest.mark.parametrize("value", ["0", "-1", "abc", "150%", "1.5"])
def test_a_dry_run_refuses_a_bad_max_unavailable_as_the_rollout_does(
    kind: str, value: str, tmp_path: Path, listener: socket.socket
) -> None:
    """A dry run is how a change is checked before it is made: it takes no limit the real
    rollout would refuse."""
    output = _run(tmp_path, listener, [*COMMANDS[kind], "--dry-run", "--max-unavailable", value])
    assert "max-unavailable" in output


@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_fleet_status_refuses_a_call_timeout_out_of_range(
    value: str, listener: socket.socket
) -> None:
    """A --timeout of -1 showed every node `unreachable: Deadline Exceeded`: a bad flag read
    as a fleet that is down."""
    address = f"unix:{listener.getsockname()}"
    result = CliRunner().invoke(
        fleet, ["status", "--agents", address, "--insecure", "--timeout", value]
    )
    assert result.exit_code == 2 and "--timeout" in result.output, result.output
    assert not connected(listener)


@pytest.mark.parametrize(
    ("option", "value"),
    [("--interval", "inf"), ("--interval", "nan"), ("--status-max-age", "inf")],
)
def test_coordinator_serve_refuses_a_number_that_is_not_finite(
    option: str, value: str, tmp_path: Path, listener: socket.socket
) -> None:
    """`--interval inf` ran a pass and then would sleep for ever (its liveness window,
    3 x --interval, never closing); click's FloatRange lets inf through a bound on one side
    and nan through any."""
    from agent.cli.coordinator import coordinator

    address = f"unix:{listener.getsockname()}"
    args = ["serve", "--agents", address, "--insecure", "--timeout", "1", "--once"]
    args += ["--desired", str(tmp_path / "none.yaml"), "--listen", "127.0.0.1:0", option, value]
    result = CliRunner().invoke(coordinator, args)
    assert result.exit_code == 2 and option in result.output, result.output
    assert not connected(listener)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("node_timeout_s", -1),
        ("node_timeout_s", "soon"),
        ("max_failures", -2),
        ("max_failures", True),
        ("max_unavailable", "0"),
    ],
)
def test_a_resumed_record_with_a_limit_out_of_range_is_refused_before_any_node(
    field: str, value: object, tmp_path: Path, listener: socket.socket
) -> None:
    """The record is the user's file (kept with the change ticket, edited by hand): a
    node_timeout_s of -1 in it started the failed node's apply again and cancelled it at once.
    Its limits are checked as the flags are, naming the record's field; a flag that replaces
    the bad value is taken."""
    import json

    from agent.coordinator.rollout.record import RolloutRecord

    record = RolloutRecord.start(
        "share", {}, ["a"], selector="", max_unavailable="1", max_failures=1, node_timeout_s=60
    )
    record.nodes["a"].state = "failed"
    data = record.to_dict() | {field: value}
    path = tmp_path / "rollout.json"
    path.write_text(json.dumps(data))
    address = f"unix:{listener.getsockname()}"
    result = CliRunner().invoke(fleet, ["resume", str(path), "--agents", address, "--insecure"])
    assert result.exit_code == 2, result.output
    assert f"record.{field}" in result.output, result.output
    assert not connected(listener)
    flag = {
        "node_timeout_s": ["--node-timeout", "60"],
        "max_failures": ["--max-failures", "1"],
        "max_unavailable": ["--max-unavailable", "1"],
    }[field]
    fixed = CliRunner().invoke(
        fleet,
        [
            "resume",
            str(path),
            *flag,
            "--dry-run",
            "--agents",
            address,
            "--insecure",
            "--timeout",
            "1",
        ],
    )
    assert f"record.{field}" not in fixed.output, fixed.output


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["apply", "mig", "-c", "halves", "-f"], "file"),
        (["apply", "mig", "--plan"], "plan"),
        (["apply", "share", "-f"], "file"),
    ],
)
def test_a_record_naming_the_rollouts_input_file_is_refused(
    args: list[str], flag: str, tmp_path: Path, listener: socket.socket
) -> None:
    """`fleet apply mig -f mig.yaml --record mig.yaml` wrote the rollout record over the MIG
    config it applied. Refused naming --record, before the file is read or an agent dialled;
    the file is left as it was."""
    given = tmp_path / "input.yaml"
    given.write_text(MIG_HALVES)
    address = f"unix:{listener.getsockname()}"
    for record in (given, tmp_path / "." / "input.yaml"):
        result = CliRunner().invoke(
            fleet, [*args, str(given), "--record", str(record), "--agents", address, "--insecure"]
        )
        assert result.exit_code == 2, result.output
        assert f"--record {record} is the input --{flag} file" in result.output, result.output
    assert given.read_text() == MIG_HALVES
    assert not connected(listener)


@pytest.mark.parametrize(("given", "said"), [([], "missing"), (["-c", "halfs"], "not present")])
def test_a_config_name_fleet_apply_cannot_use_is_refused_naming_its_own_flag(
    given: list[str], said: str, tmp_path: Path, listener: socket.socket
) -> None:
    """`fleet apply mig -f two-configs.yaml` without -c said `missing required flag
    'selected-config'`, a flag of `gpu-agent mig apply` that fleet apply does not take (its
    flag is -c/--config)."""
    two = tmp_path / "two.yaml"
    two.write_text(MIG_HALVES + "  whole:\n    - {devices: all, mig-enabled: false}\n")
    address = f"unix:{listener.getsockname()}"
    args = ["apply", "mig", "-f", str(two), *given, "--agents", address, "--insecure"]
    result = CliRunner().invoke(fleet, args)
    assert result.exit_code == 2, result.output
    assert said in result.output and "selected-config" not in result.output, result.output
    assert "config: one of: halves, whole" in result.output, result.output
    assert not connected(listener)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["apply", "mig", "-c", "halves", "-f", "{missing}"], "file"),
        (["apply", "share", "-f", "{missing}"], "file"),
        (["apply", "share", "--strategy", "mps", "--replicas", "4294967296"], "--replicas"),
    ],
)
def test_a_missing_file_or_an_oversized_count_is_one_line_naming_it(
    args: list[str], said: str, tmp_path: Path, listener: socket.socket
) -> None:
    """A -f file that does not exist (FileNotFoundError) and a --replicas past what the API
    holds (protobuf's 'Value out of range') ended in tracebacks."""
    missing = tmp_path / "nope.yaml"
    address = f"unix:{listener.getsockname()}"
    args = [a.format(missing=missing) for a in args]
    result = CliRunner().invoke(fleet, [*args, "--agents", address, "--insecure"])
    assert result.exit_code == 2, (result.output, result.exception)
    assert said in result.output, result.output
    assert not connected(listener)


def test_remediate_refuses_a_wait_that_is_not_a_number(listener: socket.socket) -> None:
    """`fleet remediate NODE --apply --wait nan` was taken: its deadline (now + nan) compares
    with nothing, so the waits for processes to end and for the GPU to turn healthy never
    ended. Refused naming --wait, before any agent is dialled."""
    address = f"unix:{listener.getsockname()}"
    result = CliRunner().invoke(
        fleet, ["remediate", "n1", "--wait", "nan", "--agents", address, "--insecure"]
    )
    assert result.exit_code == 2 and "--wait" in result.output, result.output
    assert not connected(listener)


class _Stderr(io.StringIO):
    """stderr as a terminal or as a pipe."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize(
    ("output", "tty", "said"),
    [
        ("table", False, True),
        ("json", True, True),  # a person at a terminal with -o json: the rollout is seen to move
        ("json", False, False),  # a script reading stdout: the document alone, no chatter
    ],
)
def test_rollout_progress_goes_to_a_terminal_whatever_the_output(
    output: str, tty: bool, said: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-o json` was silent for a whole rollout, even at a terminal: progress went to stderr
    with table output only (docs/coordinator.md, "Rollouts")."""
    from agent.cli.fleet import rollout
    from agent.coordinator.rollout.schedule import NodeState

    stderr = _Stderr(tty)
    monkeypatch.setattr(rollout.sys, "stderr", stderr)  # click.echo(err=True) writes there too
    rollout.progress_report(output)("node-a", NodeState.RUNNING, "started")
    assert stderr.getvalue() == ("node-a: running: started\n" if said else "")


@pytest.mark.parametrize(
    ("given", "field"),
    [
        (["--strategy", "mps", "--replicas", "100"], "sharing.mps.resources[0].replicas"),
        (
            ["--strategy", "time-slicing", "--replicas", "2", "--resource", "nvidia.com/Bad_Name"],
            "sharing.timeSlicing.resources[0].name",
        ),
        (["-f", "{file}"], "sharing.timeSlicing.resources[0].replicas"),
    ],
)
def test_a_sharing_config_every_node_would_refuse_is_refused_before_contacting_a_node(
    given: list[str], field: str, tmp_path: Path, listener: socket.socket
) -> None:
    """`fleet apply share --strategy mps --replicas 100` went to every node, and each agent
    refused it the same way (an MPS server takes 48 clients at most), failing the rollout node
    by node. The agents' own checks refuse it once, here, naming the field, with exit 2."""
    file = tmp_path / "plugin.yaml"
    file.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - {name: nvidia.com/gpu, replicas: 1}\n"
    )
    args = ["apply", "share", *(a.format(file=file) for a in given)]
    output = _run(tmp_path, listener, args)
    assert f"every node would refuse this sharing config: {field}: " in output, output


def test_a_sharing_config_some_nodes_take_is_left_to_the_nodes() -> None:
    """MPS on a MIG device: the device plugin refuses it, a DRA driver takes it. Not refused
    up front: each node says for itself (the dry run shows which)."""
    from agent.coordinator.rollout.specs import sharing_spec

    spec = sharing_spec(None, "mps", ["nvidia.com/mig-1g.10gb"], 4)
    (resource,) = spec["request"]["spec"]["resources"]
    assert resource == {"name": "nvidia.com/mig-1g.10gb", "replicas": 4}
