"""The CLI talks to the running agent over its Unix socket; without one it runs on an agent
embedded for the command (tests/integration/test_one_owner.py), through the same API."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.cli.status import status_view
from agent.client import AgentClient
from agent.dra.detect import NO_API
from agent.errors import Conflict, InvalidSpec
from agent.gpu import GpuDriver, open_driver
from agent.gpu.sim import SimControl
from agent.gpu.types import GpuLayout, LostGpu
from tests.unit.api.support import REPO, AgentProcess, agent_config, wait_for

pytestmark = pytest.mark.integration


def node_status(gpu: GpuDriver) -> dict[str, Any]:
    """The node read straight from the driver: the oracle `status_view` must match. A lost
    GPU is listed with ``health: lost`` and what is known of it."""
    scan = gpu.scan()
    views = [_gpu_view(gpu.layout(g.uuid)) for g in scan.gpus]
    views += [_lost_view(g) for g in scan.lost]
    return {
        "driver_version": gpu.driver_version(),
        "driver": {
            "ready": True,
            "cause": None,
            "detail": None,
        },  # attached: the driver answered above
        # No Kubernetes API here: nothing hands out the GPUs (docs/dra.md).
        "allocation": {"mode": "none", "evidence": NO_API.evidence, "driver": None},
        "degraded": [],
        "processes_withheld": False,  # the admin socket sees them
        "gpus": sorted(views, key=lambda v: int(v["index"])),
    }


def _marks_apart(view: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``status_view`` without the health marks, and the marks' states."""
    view = copy.deepcopy(view)
    states = []
    for gpu in view["gpus"]:
        for part in [gpu, *(gpu["instances"] or ())]:
            mark = part.pop("condition")
            states.append(mark["state"] if mark else "none")
    return view, states


def _lost_view(lost: LostGpu) -> dict[str, Any]:
    g = lost.last_known
    empty = GpuLayout(g, (), (), ()) if g is not None else None
    view = _gpu_view(empty) if empty is not None else _unknown_view(lost.index)
    view.update(health="lost", detail=lost.detail)
    return view


def _unknown_view(index: int) -> dict[str, Any]:
    """A GPU lost before anything could be read of it: NVML gives only its index."""
    return {
        "index": index,
        "uuid": None,
        "name": None,
        "pci_bus_id": None,
        "pci_device_id": None,
        "memory_total_bytes": None,
        "mig": None,
        "instances": None,  # never read: unknown, not none
        "processes": None,
    }


def _gpu_view(layout: GpuLayout) -> dict[str, Any]:
    g = layout.gpu
    return {
        "index": g.index,
        "health": "ok",
        "detail": "",
        "unread": None,  # its layout and processes read in the latest sample
        "uuid": g.uuid,
        "name": g.name,
        "pci_bus_id": g.pci_bus_id,
        "pci_device_id": f"0x{g.pci_device_id:08X}",
        "memory_total_bytes": g.memory_total_bytes,
        "mig": None
        if g.mig_mode is None
        else {
            "current": "enabled" if g.mig_mode.current else "disabled",
            "pending": "enabled" if g.mig_mode.pending else "disabled",
        },
        "instances": [
            {
                "gpu_instance_id": gi.id,
                "profile": gi.profile_name,
                "profile_id": gi.profile_id,
                "placement": {"start": gi.placement.start, "size": gi.placement.size},
                "compute_instances": [
                    {
                        "id": ci.id,
                        "profile_id": ci.profile_id,
                        "placement": {"start": ci.placement.start, "size": ci.placement.size},
                        "uuid": ci.uuid,
                    }
                    for ci in gi.compute_instances
                ],
            }
            for gi in layout.instances
        ],
        "processes": [
            {
                "pid": p.pid,
                "used_memory_bytes": p.used_memory_bytes,
                "gpu_instance_id": p.gpu_instance_id,
                "compute_instance_id": p.compute_instance_id,
            }
            for p in layout.processes
        ],
    }


def cli(state_dir: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
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
        capture_output=True,
        text=True,
        timeout=120,
    )


def cli_config(root: Path, agent_root: Path) -> Path:
    """The CLI's own config: the agent's socket, but another plugin config path, so an answer
    naming the agent's path proves the change went through the agent."""
    path = root / "cli.yaml"
    (root / "cli-plugin").mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "socket_path": str(agent_root / "agent.sock"),
                "sharing": {
                    "config_path": str(root / "cli-plugin" / "config.yaml"),
                    "reload": "none",
                },
            }
        )
    )
    return path


def test_share_goes_through_the_running_agent(tmp_path: Path) -> None:
    agent_root = tmp_path / "agent"
    agent_root.mkdir()
    with AgentProcess(agent_root, agent_config(agent_root)) as agent:
        config = cli_config(tmp_path, agent_root)
        done = cli(
            agent.state_dir,
            config,
            "share",
            "set",
            "--time-slicing",
            "nvidia.com/gpu=4",
            "-o",
            "json",
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert result["config_path"] == str(agent_root / "plugin" / "config.yaml")
        # no plugin runs here: what it advertises is not known until it loads the file
        assert result["changed"] and result["advertised"] is None
        assert result["advertised_unknown"].endswith("once it does it advertises nvidia.com/gpu 32")
        assert not (tmp_path / "cli-plugin" / "config.yaml").exists()

        shown = cli(agent.state_dir, config, "share", "show", "-o", "json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["strategy"] == "time-slicing"

        refused = cli(agent.state_dir, config, "share", "set", "--time-slicing", "nvidia.com/gpu=1")
        assert refused.returncode == 2  # InvalidSpec
        assert "replicas" in refused.stderr

        # --mig-strategy alone: one request, read and written under the agent's lock; the
        # time-slicing stays.
        alone = cli(agent.state_dir, config, "share", "set", "--mig-strategy", "mixed")
        assert alone.returncode == 0, alone.stderr
        written = yaml.safe_load((agent_root / "plugin" / "config.yaml").read_text())
        assert written["flags"] == {"migStrategy": "mixed"}
        assert written["sharing"]["timeSlicing"]["resources"] == [
            {"name": "nvidia.com/gpu", "replicas": 4}
        ]

        client = AgentClient.connect(agent.socket)
        assert client is not None
        client.close()


def test_status_through_the_agent_matches_the_driver(tmp_path: Path) -> None:
    """`status_view` of GetNode is `gpu-agent status`'s own data, field for field."""
    with AgentProcess(tmp_path, agent_config(tmp_path)) as agent:
        control = SimControl(agent.state_dir)
        driver = open_driver(agent.preset, agent.state_dir)
        uuid = driver.gpus()[2].uuid
        driver.set_mig_mode(uuid, True)
        profile = next(p for p in driver.gi_profiles(uuid) if p.name == "3g.40gb")
        gi = driver.create_gpu_instance(uuid, profile.id, profile.placements[0])
        ci_profile = driver.ci_profiles(uuid, gi.id)[-1]
        driver.create_compute_instance(uuid, gi.id, ci_profile.id)
        control.start_process(4242, 0, used_memory_mib=2048)
        direct = node_status(driver)
        client = AgentClient.connect(agent.socket)
        assert client is not None
        seen = wait_for(
            lambda: (
                (view := status_view(client.node())) and _marks_apart(view)[0] == direct and view
            ),
            "the agent's next refresh",
            10,
        )
        # the health marks are the agent's own verdict (the driver has none): all healthy here
        assert set(_marks_apart(seen)[1]) == {"healthy"}
        client.close()
        driver.close()


def test_a_killed_agents_socket_means_the_command_runs_on_an_embedded_agent(tmp_path: Path) -> None:
    agent_root = tmp_path / "agent"
    agent_root.mkdir()
    agent = AgentProcess(agent_root, agent_config(agent_root)).start()
    agent.kill()
    assert agent.socket.exists()  # left behind
    assert AgentClient.connect(agent.socket) is None
    config = cli_config(tmp_path, agent_root)
    done = cli(agent.state_dir, config, "share", "show", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["config_path"] == str(tmp_path / "cli-plugin" / "config.yaml")


def test_the_client_follows_a_mig_apply_and_rebuilds_domain_errors(tmp_path: Path) -> None:
    one_gpu = (
        "version: v1\nmig-configs:\n  it:\n    - devices: [1]\n      mig-enabled: true\n"
        "      mig-devices: {%s}\n"
    )
    with AgentProcess(tmp_path, agent_config(tmp_path)) as agent:
        client = AgentClient.connect(agent.socket)
        assert client is not None
        plan = client.plan_mig(one_gpu % "3g.40gb: 2")
        assert [g.gpu_index for g in plan.gpus] == [1]
        op = client.apply_mig(one_gpu % "3g.40gb: 2", request_id="cli-1")
        states = list(client.watch_operation(op.name))
        assert states[-1].done and states[-1].state == "succeeded"
        assert any(s.mig_progress.steps_done for s in states)  # progress was streamed
        assert "3g.40gb: 2" in client.export_mig()
        with pytest.raises(Conflict) as infeasible:
            client.apply_mig(one_gpu % "7g.80gb: 2")
        assert "cannot be applied" in str(infeasible.value)
        with pytest.raises(InvalidSpec) as bad:
            client.plan_mig("version: v1\nmig-configs: {it: [{devices: all}]}\n")
        assert bad.value.violations
        client.close()


MIG_CONFIG = """\
version: v1
mig-configs:
  all-balanced:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    - devices: [1, 2, 3, 4, 5, 6, 7]
      mig-enabled: false
  too-many:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.40gb": 3}
"""


def test_mig_apply_goes_through_the_running_agent_as_an_operation(tmp_path: Path) -> None:
    """The agent owns the GPUs while it runs: the CLI hands it the config and follows the
    operation; the agent's own operation records show it did the work."""
    agent_root = tmp_path / "agent"
    agent_root.mkdir()
    mig_file = tmp_path / "mig.yaml"
    mig_file.write_text(MIG_CONFIG)
    with AgentProcess(agent_root, agent_config(agent_root)) as agent:
        config = cli_config(tmp_path, agent_root)
        done = cli(agent.state_dir, config, "mig", "apply", "-f", str(mig_file), "-c",
                   "all-balanced", "-o", "json")  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "reconfiguring through the node's agent: operations/" in done.stderr
        result = json.loads(done.stdout)
        assert result["config_name"] == "all-balanced"
        client = AgentClient(agent.socket)
        try:
            ops = client.list_operations(kind="mig.apply")
            assert [op.state for op in ops] == ["succeeded"]
            # GetNode serves the inventory the agent refreshes in the background (the sampler's
            # snapshot, every second): a snapshot taken mid-apply is replaced by the next one.
            want = ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]

            def gpu0_profiles() -> list[str]:
                gpu0 = status_view(client.node())["gpus"][0]
                return sorted(i["profile"] for i in gpu0["instances"])

            wait_for(lambda: gpu0_profiles() == want, "GPU 0's new layout in the inventory", 10)
        finally:
            client.close()
        refused = cli(agent.state_dir, config, "mig", "apply", "-f", str(mig_file), "-c",
                      "too-many")  # fmt: skip
        assert refused.returncode == Conflict.exit_code, refused.stderr
        assert "3g.40gb" in refused.stderr


def test_a_file_queued_by_the_cli_is_warmed_by_the_running_agent(tmp_path: Path) -> None:
    """`prewarm file --no-wait` only queues (direct mode shares the agent's database and cache);
    the running agent's workers pick it up without a restart."""
    from tests.integration.prewarm_fixtures.origin import Origin

    agent_root = tmp_path / "agent"
    agent_root.mkdir()
    (tmp_path / "origin").mkdir()
    with (
        Origin(tmp_path / "origin") as origin,
        AgentProcess(agent_root, agent_config(agent_root)) as agent,
    ):
        origin.add("model.bin", b"weights" * 1000)
        config = cli_config(tmp_path, agent_root)
        config.write_text(
            config.read_text() + yaml.safe_dump({"prewarm": agent_config_prewarm(agent_root)})
        )
        queued = cli(agent.state_dir, config, "prewarm", "file", origin.url("model.bin"),
                     "--name", "model", "--no-wait", "-o", "json")  # fmt: skip
        assert queued.returncode == 0, queued.stderr

        def ready() -> bool:
            listed = cli(agent.state_dir, config, "prewarm", "list", "-o", "json")
            return any(
                i["name"] == "model" and i["state"] == "ready" for i in json.loads(listed.stdout)
            )

        wait_for(ready, "the agent to warm the queued file", timeout=60, every=1.0)


def agent_config_prewarm(agent_root: Path) -> dict[str, object]:
    """The prewarm settings agent_config gives the agent, for the CLI to share them."""
    return yaml.safe_load((agent_root / "config.yaml").read_text())["prewarm"]
