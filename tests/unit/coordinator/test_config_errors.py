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


def test_serve_once_exits_10_when_its_rollout_left_a_node_failed(tmp_path: Path) -> None:
    """A CI job running `coordinator serve --once` got 0 after a pass whose rollout failed a
    node and halted (`share rollout halted after 1 failed node(s)`): the pass ran, but the
    fleet was not brought to the desired state. It exits 10, as `fleet apply` does; 0 once
    the nodes are in sync."""
    from tests.unit.coordinator.agents import invoke_process
    from tests.unit.coordinator.fakeagents import FakeAgent, fake_agents, mark, node

    desired = tmp_path / "desired.yaml"
    desired.write_text(
        "version: v1\nsharing:\n  - selector: name=a\n    strategy: time-slicing\n"
        "    replicas: 4\n    resources: [nvidia.com/gpu]\n"
    )
    broken = {"on": True}

    def refuse(agent: FakeAgent, method: str) -> None:
        if method == "SharingService/SetSharing" and broken["on"]:
            raise RuntimeError("the device plugin's config cannot be written")

    with fake_agents() as agents:
        agents.add(node("a", mark("healthy")), on_call=refuse)
        serve = ["coordinator", "serve", "--once", "--desired", str(desired)]
        serve += [*agents.args(), "--listen", "127.0.0.1:0"]
        failed = invoke_process(serve, 60)
        broken["on"] = False
        fixed = invoke_process(serve, 60)
    assert failed.exit_code == 10, failed.output
    assert "halted" in failed.output
    assert fixed.exit_code == 0, fixed.output


def test_serve_refuses_a_listen_address_it_cannot_use_in_one_line(tmp_path: Path) -> None:
    """`--listen 127.0.0.1:99999` ended in a traceback (OverflowError from bind), `--listen
    nope` exited 1 as a runtime failure, and a port already taken was a traceback too: each
    is now one line naming --listen, a bad address with exit 2."""
    import socket

    from tests.unit.coordinator.agents import invoke_process

    base = ["coordinator", "serve", "--agents", "127.0.0.1:1", "--insecure"]
    base += ["--desired", str(tmp_path / "none.yaml"), "--interval", "5"]
    for bad in ("127.0.0.1:99999", "nope", "127.0.0.1:", ":80x", "127.0.0.1:\u00b2"):
        result = invoke_process([*base, "--listen", bad], 60)
        assert result.exit_code == 2, (bad, result.output)
        assert "--listen" in result.output and "Traceback" not in result.output, result.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = invoke_process([*base, "--listen", f"127.0.0.1:{port}"], 60)
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert f"--listen 127.0.0.1:{port}" in result.output, result.output


def test_serve_help_says_what_its_lease_is_for_it() -> None:
    """`coordinator serve --help` described --lease as the Lease 'held while changing nodes,
    shared with `coordinator serve`' (the text of the changes by hand): serve's own Lease is
    the one its replicas take turns on."""
    result = invoke(coordinator, ["serve", "--help"])
    text = " ".join(result.output.split())
    assert "shared with `coordinator serve`" not in text, text
    lease = text.split("--lease TEXT")[1].split("--leader-elect /")[0]
    assert "replicas take turns" in lease, lease


def test_serve_does_not_forget_a_node_of_a_model_rule_whose_driver_is_not_ready(
    tmp_path: Path,
) -> None:
    """A rule `selector: model=*H100*` never picked a node whose driver is not ready (no GPU
    read, so no model matched): the pass said nothing of it and `--once` exited 0, as if the
    pool were in sync. The node is picked, its agent's refusal said, and the pass exits 10."""
    import grpc

    from tests.unit.coordinator.agents import invoke_process
    from tests.unit.coordinator.fakeagents import driverless_node, fake_agents, mark, node

    desired = tmp_path / "desired.yaml"
    desired.write_text(
        "version: v1\nsharing:\n  - selector: model=*H100*\n    strategy: time-slicing\n"
        "    replicas: 4\n    resources: [nvidia.com/gpu]\n"
    )
    driverless = driverless_node("d")
    with fake_agents() as agents:
        agents.add(node("a", mark("healthy")))
        # As the real agent's SetSharing refuses it (DriverNotReady -> FAILED_PRECONDITION).
        refused = (grpc.StatusCode.FAILED_PRECONDITION, "share set needs the GPUs: no module")
        agents.add(driverless, errors={"SharingService/SetSharing": refused})
        serve = ["coordinator", "serve", "--once", "--desired", str(desired)]
        result = invoke_process([*serve, *agents.args(), "--listen", "127.0.0.1:0"], 60)
    assert result.exit_code == 10, result.output
    assert "no module" in result.output, result.output


def test_a_dns_name_that_is_not_name_and_port_is_refused_naming_dns() -> None:
    """`--dns svc:abc` ended in a traceback (int('abc')), `--dns svc:99999` dialled no agent
    and `--dns :9401` tried to resolve an empty name: each is refused naming --dns."""
    # "\u00b2" passes str.isdigit() and int() refuses it
    for bad in (
        "gpu-agent-grpc:abc",
        "gpu-agent-grpc:99999",
        ":9401",
        "gpu-agent-grpc:",
        "s:\u00b2",
    ):
        result = invoke(fleet, ["status", "--dns", bad, "--insecure", "--timeout", "1"])
        assert result.exit_code == 2, (bad, result.output)
        assert "dns: " in result.output, result.output
