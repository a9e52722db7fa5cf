"""One owner of the node (issue 14): while an agent runs it alone changes node state; with none
running, a CLI command runs on an agent embedded for it, and one owner at a time holds the
node (`agent/ownership.py`): a second command, or a starting ``serve``, waits and says for whom.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.ownership import SERVE_ROLE, NodeOwnership
from tests.integration.prewarm_fixtures.origin import Origin
from tests.integration.test_api_cli import cli, cli_config
from tests.unit.api.support import REPO, AgentProcess, agent_config, wait_for

pytestmark = pytest.mark.integration


def _interruptible() -> None:
    # A shell starts background jobs (a CI runner's, say) with SIGINT ignored, which every child
    # inherits and Python then leaves alone: the command gets SIGINT as from a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_cli(state_dir: Path, config: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent.cli.main",
            "--simulate",
            "dgx-h100",
            "--state-dir",
            str(state_dir),
            "--config",
            str(config),
            *args,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interruptible,
    )


def test_without_an_agent_a_command_runs_on_an_embedded_one_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    config = cli_config(tmp_path, tmp_path / "no-agent")
    state = tmp_path / "state"
    done = cli(state, config, "share", "set", "--mps", "nvidia.com/gpu=2", "-o", "json")
    assert done.returncode == 0, done.stderr
    # The command's own warning (reload is off in this config), none of the agent's log.
    assert [line.split(":")[0] for line in done.stderr.splitlines()] == ["warning"]
    assert json.loads(done.stdout)["config_path"] == str(tmp_path / "cli-plugin" / "config.yaml")
    # The same validation as the running agent's (one path): the plugin's rule, exit 2.
    refused = cli(state, config, "share", "set", "--time-slicing", "nvidia.com/gpu=1")
    assert refused.returncode == 2 and "replicas" in refused.stderr
    assert NodeOwnership(state).try_acquire("test"), "the command released the node"
    assert not (tmp_path / "no-agent" / "agent.sock").exists()


def test_a_command_waits_for_the_nodes_owner_naming_it(tmp_path: Path) -> None:
    config = cli_config(tmp_path, tmp_path / "no-agent")
    state = tmp_path / "state"
    owner = NodeOwnership(state)
    assert owner.try_acquire("gpu-agent prewarm file")
    proc = _start_cli(state, config, "share", "show", "-o", "json")
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.strip() == (
            f"waiting for gpu-agent prewarm file (pid {os.getpid()}), which owns this node's state"
        )
        assert proc.poll() is None  # still waiting, nothing done beside the owner
        owner.release()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert json.loads(out)["strategy"] == "none"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_ends_a_command_that_waits_for_the_nodes_owner_at_once(tmp_path: Path) -> None:
    """A stop interrupts every wait: a command waiting for the node's owner exits 143 on
    SIGTERM within a second, having taken nothing."""
    config = cli_config(tmp_path, tmp_path / "no-agent")
    state = tmp_path / "state"
    owner = NodeOwnership(state)
    assert owner.try_acquire("gpu-agent prewarm file")
    proc = _start_cli(state, config, "share", "show")
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("waiting for gpu-agent prewarm file")
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert proc.wait(timeout=10) == 143
        assert time.monotonic() - started < 1.0
        assert owner.holder() == f"gpu-agent prewarm file (pid {os.getpid()})"
    finally:
        owner.release()
        if proc.poll() is None:
            proc.kill()


def test_a_command_on_another_socket_than_the_serve_owning_its_node_is_refused_at_once(
    tmp_path: Path,
) -> None:
    """A `serve` owns the node for its whole life: a command whose socket_path misses it (no
    agent there) is refused at once (exit 4), naming the serve's pid and the socket it serves
    on, and never waits. Before, it said "waiting for gpu-agent serve (pid N)" and waited
    forever."""
    agent_root = tmp_path / "agent"
    agent_root.mkdir()
    with AgentProcess(agent_root, agent_config(agent_root)) as agent:
        assert agent.proc is not None
        config = cli_config(tmp_path, tmp_path / "elsewhere")
        refused = cli(agent.state_dir, config, "status", "-o", "json")  # 120 s: never reached
        assert refused.returncode == 4, refused.stderr
        assert refused.stderr.splitlines() == [
            f"error: the agent serving the state dir {agent.state_dir}, gpu-agent serve (pid "
            f"{agent.proc.pid}), does not answer on {tmp_path / 'elsewhere' / 'agent.sock'}: "
            f"it serves on {agent.socket}; point socket_path (--config or "
            "GPU_AGENT_SOCKET_PATH) at that socket"
        ]
        assert refused.stdout == ""


def test_a_command_waits_for_a_serve_starting_on_its_socket(tmp_path: Path) -> None:
    """A `serve` owns the node before it listens: a command on the socket it will serve waits
    for it, saying so, rather than being refused."""
    config = cli_config(tmp_path, tmp_path / "agent")
    state = tmp_path / "state"
    owner = NodeOwnership(state)
    assert owner.try_acquire(SERVE_ROLE, tmp_path / "agent" / "agent.sock")
    proc = _start_cli(state, config, "share", "show", "-o", "json")
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.strip() == (
            f"waiting for gpu-agent serve (pid {os.getpid()}), which owns this node's state"
        )
        assert proc.poll() is None
        owner.release()  # it never came up: the command runs on its own agent then
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert json.loads(out)["strategy"] == "none"
    finally:
        owner.release()
        if proc.poll() is None:
            proc.kill()


@pytest.fixture
def waiting_serve(tmp_path: Path) -> Iterator[tuple[NodeOwnership, AgentProcess]]:
    """A command's embedded agent owns the node, and `serve` started beside it waits, saying
    for whom."""
    owner = NodeOwnership(tmp_path / "state")
    assert owner.try_acquire("gpu-agent mig apply")
    agent = AgentProcess(tmp_path, agent_config(tmp_path))
    try:
        with pytest.raises(AssertionError, match="timed out"):
            agent.start(timeout=3)  # it waits rather than serving beside the owner
        waiting = f"waiting for gpu-agent mig apply (pid {os.getpid()}) to finish"
        wait_for(lambda: waiting in agent.output(), "the agent to say whom it waits for", 60)
        assert "agent serving:" not in agent.output()
        yield owner, agent
    finally:
        owner.release()
        agent.stop()


def test_serve_waits_for_a_commands_embedded_agent_to_finish(
    waiting_serve: tuple[NodeOwnership, AgentProcess],
) -> None:
    owner, agent = waiting_serve
    owner.release()
    wait_for(lambda: "agent serving:" in agent.output(), "the agent to serve once free", 60)


def test_sigterm_ends_a_serve_that_waits_for_the_owner_at_once(
    waiting_serve: tuple[NodeOwnership, AgentProcess],
) -> None:
    """A stop interrupts every wait: `serve` waiting for a command's embedded agent exits 0 on
    SIGTERM (as the kubelet sends it) within a second, having started nothing."""
    owner, agent = waiting_serve
    assert agent.proc is not None
    agent.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert agent.proc.wait(timeout=10) == 0, agent.output()
    assert time.monotonic() - started < 1.0
    assert "agent serving:" not in agent.output()
    assert owner.holder() == f"gpu-agent mig apply (pid {os.getpid()})"  # not taken


def _agent_with_origin(tmp_path: Path) -> tuple[AgentProcess, Path]:
    agent_root = tmp_path / "agent"
    agent_root.mkdir()
    agent = AgentProcess(agent_root, agent_config(agent_root)).start()
    return agent, cli_config(tmp_path, agent_root)


def test_a_manifest_applied_beside_the_running_agent_is_warmed_by_it(tmp_path: Path) -> None:
    """The DaemonSet case of issue 14: `prewarm apply` in the agent's pod went to the database
    beside the agent, whose queue scan took items 2..N while the CLI fetched item 1 (exit 5,
    "being fetched by process"). Now the agent does all of it and the command follows."""
    root = tmp_path / "origin"
    root.mkdir()
    with Origin(root) as origin:
        digests = {f"h{i}": origin.add(f"h{i}.bin", os.urandom(256 * 1024)) for i in range(6)}
        manifest = tmp_path / "models.yaml"
        manifest.write_text(
            "version: 1\nitems:\n"
            + "".join(
                f"  - url: {origin.url(name + '.bin')}\n    name: {name}\n    sha256: {sha}\n"
                for name, sha in digests.items()
            )
        )
        agent, config = _agent_with_origin(tmp_path)
        try:
            done = cli(agent.state_dir, config, "prewarm", "apply", str(manifest), "-o", "json")
            assert done.returncode == 0, done.stderr
            items = json.loads(done.stdout)
            assert {(i["name"], i["state"], i["sha256"]) for i in items} == {
                (name, "ready", sha) for name, sha in digests.items()
            }
            assert (agent.root / "cache" / "by-name" / "h5").exists()  # the agent's own cache
        finally:
            agent.stop()


def test_two_requests_for_one_url_share_one_download_and_its_result(tmp_path: Path) -> None:
    """A second request for an item being fetched joins it: one download, both exit 0 with the
    same digest."""
    root = tmp_path / "origin"
    root.mkdir()
    with Origin(root) as origin:
        sha = origin.add("big.bin", os.urandom(4 * 1024 * 1024))
        origin.faults.rate_bps["/big.bin"] = 2 * 1024 * 1024  # about 2 s: both land mid-fetch
        agent, config = _agent_with_origin(tmp_path)
        try:
            args = ("prewarm", "file", origin.url("big.bin"), "--name", "big", "-o", "json")
            first = _start_cli(agent.state_dir, config, *args)
            wait_for(lambda: origin.ranges("big.bin"), "the first request's download", 30)
            second = cli(agent.state_dir, config, *args)
            out, err = first.communicate(timeout=60)
            assert first.returncode == 0, err
            assert second.returncode == 0, second.stderr
            assert json.loads(out)[0]["sha256"] == json.loads(second.stdout)[0]["sha256"] == sha
            assert origin.ranges("big.bin") == [None]  # one download, from the start
        finally:
            agent.stop()


def test_sigterm_to_a_command_stops_its_embedded_agent_as_serve_stops(tmp_path: Path) -> None:
    """A SIGTERM to `mig apply` running on its embedded agent suspends the apply before its
    next mutation (exit 143), as the agent does; the next command's agent finishes it."""
    config = cli_config(tmp_path, tmp_path / "no-agent")
    state = tmp_path / "state"
    mig_file = tmp_path / "mig.yaml"
    mig_file.write_text(
        "version: v1\nmig-configs:\n  all-1g:\n    - devices: all\n      mig-enabled: true\n"
        "      mig-devices: {1g.10gb: 7}\n"
    )
    proc = _start_cli(state, config, "mig", "apply", "-f", str(mig_file), "-c", "all-1g")
    try:
        assert proc.stderr is not None
        while "] apply: " not in (line := proc.stderr.readline()):
            assert line, f"the apply ended before any step: {proc.communicate()}"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, err
    finally:
        if proc.poll() is None:
            proc.kill()
    # The next command's agent (this assert's) finishes the suspended apply as it starts, as
    # `serve` does; the apply after it has nothing left to do.
    check = cli(state, config, "mig", "assert", "-f", str(mig_file), "-c", "all-1g")
    assert check.returncode == 0, check.stdout + check.stderr
    done = cli(state, config, "mig", "apply", "-f", str(mig_file), "-c", "all-1g", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert {g["status"] for g in json.loads(done.stdout)["gpus"]} == {"unchanged"}


_GPU0 = (
    "version: v1\nmig-configs:\n"
    "  gpu0-1g:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {1g.10gb: 7}\n"
)


def _mig_operations(agent: AgentProcess) -> list[str]:
    from agent.client import AgentClient

    client = AgentClient(agent.socket)
    try:
        return [op.mig_progress.config_name for op in client.list_operations("mig.apply")]
    finally:
        client.close()


def test_mig_apply_skip_reset_beside_the_running_agent_is_its_operation(tmp_path: Path) -> None:
    """Issue 14: `mig apply --skip-reset` beside a running agent applied directly, with no
    operation record, under the agent's feet. Now the agent does it and the command follows
    (an H100 on bare metal switches MIG mode at once, so nothing is left pending), and the
    agent lists the operation. Every field of the result is printed, GPU 0's index too."""
    mig_file = tmp_path / "mig.yaml"
    mig_file.write_text(_GPU0)
    agent, config = _agent_with_origin(tmp_path)
    try:
        args = ("mig", "apply", "--skip-reset", "-f", str(mig_file), "-c", "gpu0-1g", "-o", "json")
        done = cli(agent.state_dir, config, *args)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "reconfiguring through the node's agent: operations/" in done.stderr
        gpus = json.loads(done.stdout)["gpus"]
        assert [(g["gpu_index"], g["status"], g["created"]) for g in gpus] == [(0, "applied", 7)]
        assert _mig_operations(agent) == ["gpu0-1g"]
    finally:
        agent.stop()


def test_checkpoint_and_restore_go_through_the_running_agent(tmp_path: Path) -> None:
    """`mig checkpoint` reads the GPUs as the agent read them; `mig restore` is the agent's
    operation (config name "checkpoint"), and brings the layout back exactly."""
    mig_file = tmp_path / "mig.yaml"
    mig_file.write_text(_GPU0)
    saved = tmp_path / "before.json"
    agent, config = _agent_with_origin(tmp_path)
    try:
        taken = cli(agent.state_dir, config, "mig", "checkpoint", "-f", str(saved))
        assert taken.returncode == 0, taken.stderr
        devices = json.loads(saved.read_text())["MigState"]["Devices"]
        assert len(devices) == 8 and not any(d["MigMode"] for d in devices)
        applied = cli(agent.state_dir, config, "mig", "apply", "-f", str(mig_file), "-c", "gpu0-1g")
        assert applied.returncode == 0, applied.stderr
        restored = cli(agent.state_dir, config, "mig", "restore", "-f", str(saved), "-o", "json")
        assert restored.returncode == 0, restored.stderr
        statuses = {g["gpu_index"]: g["status"] for g in json.loads(restored.stdout)["gpus"]}
        assert statuses[0] == "applied" and set(statuses.values()) <= {"applied", "unchanged"}
        assert _mig_operations(agent) == ["checkpoint", "gpu0-1g"]
        again = cli(agent.state_dir, config, "mig", "checkpoint", "-f", str(tmp_path / "now.json"))
        assert again.returncode == 0, again.stderr
        assert json.loads((tmp_path / "now.json").read_text()) == json.loads(saved.read_text())
    finally:
        agent.stop()


def test_metrics_beside_the_running_agent_are_its_scrape(tmp_path: Path) -> None:
    """`metrics` prints the running agent's exposition (GetMetrics), and refuses options that
    would need another agent's configuration rather than ignoring them."""
    agent, config = _agent_with_origin(tmp_path)
    try:
        done = cli(agent.state_dir, config, "metrics")
        assert done.returncode == 0, done.stderr
        temps = [
            line for line in done.stdout.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")
        ]
        assert len(temps) == 8
        csv = tmp_path / "counters.csv"
        csv.write_text("DCGM_FI_DEV_POWER_USAGE, gauge, power\n")
        refused = cli(agent.state_dir, config, "metrics", "--collectors", str(csv))
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "--collectors: the running agent exports with its own configured fields" in (
            refused.stderr
        )
    finally:
        agent.stop()


def test_no_cli_module_opens_the_database_or_nvml() -> None:
    """Issue 14: the CLI parses, calls the agent and renders; only the agent (agent/node.py's
    composition root) opens the state database and the GPU driver."""
    import ast

    forbidden = {
        "agent.state",
        "agent.gpu.nvml",
        "agent.gpu.nvml_gateway",
        "agent.prewarm.index",
        "agent.mig.lock",
        "agent.mig.reset",
        "pynvml",
        "sqlite3",
    }
    forbidden_names = {("agent.gpu", "open_driver"), ("agent.mig.service", "MigService")}

    def opens(module: str) -> bool:  # the module or one inside it (agent.state is a package)
        return any(module == f or module.startswith(f + ".") for f in forbidden)

    found = []
    for path in sorted((REPO / "agent" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(path.name, a.name) for a in node.names if opens(a.name)]
            elif isinstance(node, ast.ImportFrom) and node.module:
                if opens(node.module):
                    found.append((path.name, node.module))
                found += [
                    (path.name, f"{node.module}.{a.name}")
                    for a in node.names
                    if (node.module, a.name) in forbidden_names
                ]
    assert found == []


def test_ctrl_c_detaches_from_the_running_agents_apply_which_goes_on(tmp_path: Path) -> None:
    """Ctrl-C while `mig apply` follows the running agent's operation leaves it to the agent
    (exit 130, naming the operation); the agent finishes the apply. The user follows it again
    with `gpu-agent operations wait NAME`, which the detach line names: there was no command
    for it, only the WaitOperation RPC."""
    mig_file = tmp_path / "mig.yaml"
    mig_file.write_text(
        "version: v1\nmig-configs:\n  all-1g:\n    - devices: all\n      mig-enabled: true\n"
        "      mig-devices: {1g.10gb: 7}\n"
    )
    agent, config = _agent_with_origin(tmp_path)
    try:
        proc = _start_cli(
            agent.state_dir, config, "mig", "apply", "-f", str(mig_file), "-c", "all-1g"
        )
        try:
            assert proc.stderr is not None
            while "] apply: " not in (line := proc.stderr.readline()):
                assert line, f"the apply ended before any step: {proc.communicate()}"
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130, err
        assert "detached from operations/" in err and "the node's agent carries on" in err
        name = err.split("detached from ", 1)[1].split(";", 1)[0]
        assert f"gpu-agent operations wait {name}" in err
        listed = cli(agent.state_dir, config, "operations", "list", "--all", "-o", "json")
        assert name in [op["name"] for op in json.loads(listed.stdout)], listed.stdout
        waited = cli(agent.state_dir, config, "operations", "wait", name, "-o", "json")
        assert waited.returncode == 0, waited.stderr
        assert json.loads(waited.stdout)["state"] == "succeeded"
        check = cli(agent.state_dir, config, "mig", "assert", "-f", str(mig_file), "-c", "all-1g")
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        agent.stop()


def test_a_serve_that_says_it_serves_but_does_not_answer_is_refused_not_waited_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve` records that its API serves once it does. A command on its socket that then
    finds nothing answering (the socket file removed, the agent hung) waited for it for ever;
    it now waits `SILENT_SERVE_S` (past the agent's shutdown budget, so a stopping one lets
    go first) and exits 9 naming the serve. A serve that has not said so is still waited for
    (`test_a_command_waits_for_a_serve_starting_on_its_socket`)."""
    from agent.cli import context
    from agent.cli.context import CliContext
    from agent.client.errors import Unreachable

    agent_root = tmp_path / "agent"
    agent_root.mkdir()
    with AgentProcess(agent_root, agent_config(agent_root)) as agent:
        assert agent.proc is not None
        owner = NodeOwnership(agent.state_dir)
        wait_for(lambda: owner.says_serving(SERVE_ROLE), "the serve to say it serves")
        agent.socket.unlink()  # what a cleaner of /run, or a hand, does
        monkeypatch.setattr(context, "SILENT_SERVE_S", 0.5)
        env = {"GPU_AGENT_SOCKET_PATH": str(agent.socket)}
        obj = CliContext(None, {"state_dir": agent.state_dir}, env=env)
        started = time.monotonic()
        try:
            with pytest.raises(Unreachable) as refused:
                obj.agent()
        finally:
            obj.close()
        assert time.monotonic() - started < 10
        assert f"gpu-agent serve (pid {agent.proc.pid}), says it serves on {agent.socket}" in (
            str(refused.value)
        )
        assert "its socket file was removed, or the agent hangs" in str(refused.value)
