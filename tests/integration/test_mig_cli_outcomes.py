"""``gpu-agent mig apply`` as a process: pending is not success, and SIGTERM rolls forward.

* A MIG mode change left pending (Ampere in a passthrough VM: the driver needs a VM reboot)
  exits 11 with "NOT applied yet", directly and through the running agent (docs/mig.md,
  "Exit codes").
* A SIGTERM before any mutation of an apply suspends it there (exit 143); the next start
  finishes it, so every GPU ends at the target (docs/mig.md, "SIGTERM during an apply").
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from agent._proto.gpuagent.v1 import mig_pb2, mig_pb2_grpc, operations_pb2, operations_pb2_grpc
from agent.cli.mig import PENDING_EXIT
from agent.gpu import open_driver
from agent.gpu.sim import SimControl
from agent.mig.apply import SCOPE, ProgressEvent, Suspended
from agent.mig.spec import parse_spec
from tests.unit.api.support import REPO, AgentProcess, agent_config, unix_channel, wait_for
from tests.unit.mig.simnode import sim_node

pytestmark = pytest.mark.integration

CONFIG = """\
version: v1
mig-configs:
  all-1g:
    - devices: all
      mig-enabled: true
      mig-devices: {1g.5gb: 7}
  all-1g-h100:
    - devices: all
      mig-enabled: true
      mig-devices: {1g.10gb: 7}
  mixed-nvl:
    - {devices: [0], mig-enabled: true, mig-devices: {3g.47gb: 1, 1g.12gb: 4}}
    - {devices: [1], mig-enabled: true, mig-devices: {4g.47gb: 1, 1c.3g.47gb: 3}}
  big-nvl:
    - {devices: all, mig-enabled: true, mig-devices: {3g.47gb: 2}}
"""


def gpu_agent(
    preset: str, state_dir: Path, *args: str, config: Path | None = None
) -> subprocess.CompletedProcess[str]:
    extra = ["--config", str(config)] if config is not None else []
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli.main",
            "--simulate",
            preset,
            "--state-dir",
            str(state_dir),
            *extra,
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def passthrough_a100(state_dir: Path) -> None:
    open_driver("dgx-a100", state_dir).close()  # the node's state file exists from here on
    SimControl(state_dir).set_passthrough_vm(True)


def test_a_pending_mode_change_is_not_success_directly(tmp_path: Path) -> None:
    state = tmp_path / "state"
    passthrough_a100(state)
    (tmp_path / "mig.yaml").write_text(CONFIG)
    done = gpu_agent(
        "dgx-a100", state, "mig", "apply", "-f", str(tmp_path / "mig.yaml"), "-c", "all-1g"
    )
    assert done.returncode == PENDING_EXIT == 14, done.stdout + done.stderr
    assert "MIG configuration applied successfully" not in done.stdout
    assert "NOT applied yet: a MIG mode change is pending" in done.stdout
    assert "reboot of this (passthrough) VM" in done.stdout
    asserted = gpu_agent(
        "dgx-a100", state, "mig", "assert", "-f", str(tmp_path / "mig.yaml"), "-c", "all-1g"
    )
    assert asserted.returncode == 1
    as_json = gpu_agent(
        "dgx-a100",
        state,
        "mig",
        "apply",
        "-f",
        str(tmp_path / "mig.yaml"),
        "-c",
        "all-1g",
        "-o",
        "json",
    )
    assert as_json.returncode == PENDING_EXIT
    assert {g["status"] for g in yaml.safe_load(as_json.stdout)["gpus"]} == {"pending"}


def test_a_pending_mode_change_is_not_success_through_the_agent(tmp_path: Path) -> None:
    root = tmp_path / "agent"
    root.mkdir()
    agent = AgentProcess(root, agent_config(root), preset="dgx-a100")
    passthrough_a100(agent.state_dir)
    (tmp_path / "mig.yaml").write_text(CONFIG)
    cli_config = tmp_path / "cli.yaml"
    cli_config.write_text(yaml.safe_dump({"socket_path": str(agent.socket)}))
    with agent:
        done = gpu_agent(
            "dgx-a100",
            agent.state_dir,
            "mig",
            "apply",
            "-f",
            str(tmp_path / "mig.yaml"),
            "-c",
            "all-1g",
            config=cli_config,
        )
        name = done.stderr.split("reconfiguring through the node's agent: ")[1].split()[0]
        ops = {
            verb: gpu_agent(
                "dgx-a100",
                agent.state_dir,
                "operations",
                verb,
                name,
                "-o",
                "json",
                config=cli_config,
            )
            for verb in ("wait", "show")
        }
    assert "reconfiguring through the node's agent" in done.stderr, done.stderr
    steps = [line for line in done.stderr.splitlines() if line.startswith(("[", "GPU "))]
    assert len(steps) == len(set(steps)), f"progress repeats lines: {steps}"
    assert steps.count("GPU 7 done") == 1, steps
    assert done.returncode == PENDING_EXIT, done.stdout + done.stderr
    assert "MIG configuration applied successfully" not in done.stdout
    assert "NOT applied yet: a MIG mode change is pending" in done.stdout
    # The operation is no success either: failed, saying what waits for what, what it did kept;
    # `operations wait` exits as the apply did (it said "succeeded" and exited 0).
    assert ops["wait"].returncode == PENDING_EXIT, ops["wait"].stdout + ops["wait"].stderr
    assert ops["show"].returncode == 0, ops["show"].stderr
    for shown in ops.values():
        op = json.loads(shown.stdout)
        assert op["state"] == "failed", op
        assert op["error"]["reason"] == "NotApplied", op
        assert (
            "MIG mode change pending: a reboot of this (passthrough) VM applies it on GPU 0, 1"
            in (op["error"]["message"])
        )
        assert {g["status"] for g in op["result"]["gpus"]} == {"pending"}, op


def test_a_checkpoint_that_cannot_be_written_whole_leaves_the_previous_one(
    tmp_path: Path,
) -> None:
    """`mig checkpoint -f FILE` truncated FILE, then wrote: a write cut short (a full disk, here
    a file size limit) left half a checkpoint where the previous, good one was, and exited 2.
    The new checkpoint goes to a temp file renamed over FILE, so FILE is the previous
    checkpoint until the new one is whole."""
    root = tmp_path / "agent"
    root.mkdir()
    agent = AgentProcess(root, agent_config(root), preset="dgx-a100")
    cli_config = tmp_path / "cli.yaml"
    cli_config.write_text(yaml.safe_dump({"socket_path": str(agent.socket)}))
    saved = tmp_path / "saved" / "checkpoint.json"
    saved.parent.mkdir()
    previous = '{"Version": "v1", "MigState": {"Devices": []}}\n'
    saved.write_text(previous)

    def small_files_only() -> None:  # the disk fills after 256 bytes (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))

    node = ["--simulate", "dgx-a100", "--state-dir", str(agent.state_dir)]
    command = ["--config", str(cli_config), "mig", "checkpoint", "-f", str(saved)]
    with agent:
        cut = subprocess.run(
            [sys.executable, "-m", "agent.cli.main", *node, *command],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=small_files_only,
        )
        assert cut.returncode == 2, cut.stdout + cut.stderr
        assert "checkpoint-file: a writable path" in cut.stderr
        assert saved.read_text() == previous
        assert sorted(p.name for p in saved.parent.iterdir()) == ["checkpoint.json"]
        whole = gpu_agent(
            "dgx-a100", agent.state_dir, "mig", "checkpoint", "-f", str(saved), config=cli_config
        )
        assert whole.returncode == 0, whole.stderr
    assert len(json.loads(saved.read_text())["MigState"]["Devices"]) == 8


SIGTERMED = """
import os, signal, sys
from pathlib import Path
from tests.unit.mig.suspend import direct_apply
from agent.mig.apply import Suspended
from agent.mig.spec import parse_spec
from tests.integration.test_mig_cli_outcomes import CONFIG
from tests.unit.mig.simnode import sim_node

node = sim_node(Path(sys.argv[1]), "h100-nvl")
term_at = int(sys.argv[2])
seen = []

def progress(event):
    seen.append(event)
    if len(seen) == term_at:
        os.kill(os.getpid(), signal.SIGTERM)  # arrives during this mutation's NVML call

try:
    direct_apply(node.service, parse_spec(CONFIG), "mixed-nvl", force=False, skip_reset=False,
                 progress=progress)
except Suspended as exc:
    print(exc)
    sys.exit(exc.exit_code)
sys.exit(0)
"""


def _mutations(tmp_path: Path) -> list[ProgressEvent]:
    node = sim_node(tmp_path / "dry-run", "h100-nvl")
    node.service.apply(parse_spec(CONFIG), "big-nvl")
    events: list[ProgressEvent] = []
    node.service.apply(parse_spec(CONFIG), "mixed-nvl", progress=events.append)
    node.close()
    return events


def test_sigterm_at_any_mutation_is_finished_after_the_restart(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    spec = parse_spec(CONFIG)
    points = _mutations(tmp_path)
    suspended = 0
    for i, point in enumerate(points, start=1):
        state_dir = tmp_path / f"term-{i}"
        node = sim_node(state_dir, "h100-nvl")
        node.service.apply(spec, "big-nvl")
        node.close()
        done = subprocess.run(
            [sys.executable, "-c", SIGTERMED, str(state_dir), str(i)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        where = f"SIGTERM at point {i} ({point.phase}: {point.message})"
        node = sim_node(state_dir, "h100-nvl")
        try:
            if done.returncode == Suspended.exit_code:
                suspended += 1
                assert "SIGTERM: suspended before" in done.stdout, where
                assert node.store.journal_entries(SCOPE), f"{where}: no journal to finish"
                outcomes = node.service.recover()
                assert outcomes and {o.action for o in outcomes} == {"completed"}, (where, outcomes)
            else:  # the signal came during the last mutation: the apply had nothing left to do
                assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stderr}"
                assert i >= len(points) - 1, where
            assert node.service.check(spec, "mixed-nvl").applied, where
            assert not node.store.journal_entries(SCOPE), f"{where}: journal left"
            for gpu in node.driver.gpus():
                assert all(gi.compute_instances for gi in node.driver.layout(gpu.uuid).instances)
        finally:
            node.close()
    record_property("sigterm_points", len(points))
    assert suspended >= len(points) - 2


def test_sigterm_of_the_agent_mid_apply_is_finished_by_the_next_start(tmp_path: Path) -> None:
    """The DaemonSet update case: SIGTERM (not a kill) during an apply, then the new agent."""
    agent = AgentProcess(tmp_path, agent_config(tmp_path))
    try:
        agent.start()
        with unix_channel(agent.socket) as channel:
            mig = mig_pb2_grpc.MigServiceStub(channel)
            ops = operations_pb2_grpc.OperationsServiceStub(channel)
            op = mig.ApplyMig(
                mig_pb2.ApplyMigRequest(config_yaml=CONFIG, config_name="all-1g-h100"), timeout=30
            ).operation

            def under_way() -> bool:
                now = ops.GetOperation(
                    operations_pb2.GetOperationRequest(name=op.name), timeout=10
                ).operation
                return now.done or now.metadata.mig_apply.steps_done > 0

            wait_for(under_way, "the apply to be under way", 60, 0.01)
        assert agent.terminate() == 0
        stopped = agent.output()
        agent.start()
        with unix_channel(agent.socket) as channel:
            ops = operations_pb2_grpc.OperationsServiceStub(channel)
            ended = ops.GetOperation(
                operations_pb2.GetOperationRequest(name=op.name), timeout=10
            ).operation
            check = mig_pb2_grpc.MigServiceStub(channel).AssertMig(
                mig_pb2.AssertMigRequest(config_yaml=CONFIG, config_name="all-1g-h100"), timeout=30
            )
        assert ended.done and ended.state == operations_pb2.OPERATION_STATE_SUCCEEDED, (
            f"{ended}\n{agent.output()}"
        )
        assert check.matches, check.mismatches
        if "suspended" in stopped:
            assert "finished after the restart" in agent.output()
        for line in agent.output().splitlines():  # issue 20: the stop line said it all twice
            assert line.count("suspended") <= 1 and line.count("rolled back") <= 1, line
    finally:
        agent.stop()
