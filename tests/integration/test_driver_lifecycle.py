"""A node that boots warm: no driver yet is a state of the running agent (issue 27).

A real ``gpu-agent serve`` process runs on a simulated node whose driver is unloaded
(``SimControl.driver_absent``: pynvml finds no library, or every call answers
DRIVER_NOT_LOADED). It serves /healthz, a /readyz that names what is missing, /metrics with
``gpu_agent_driver_ready 0``, and prewarm from a real HTTP origin; GPU features answer
FAILED_PRECONDITION naming the cause. When the driver loads it attaches without a restart, and
when it goes away it detaches the same way. The CLI prewarms with no agent and no driver.

The origin is on loopback: ``agent_config`` allows 127.0.0.1 for prewarm egress, which is the
one place to change if loopback egress needs another setting.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import grpc
import pytest
import yaml

from agent._proto.gpuagent.v1 import mig_pb2, mig_pb2_grpc
from agent.client import AgentClient
from agent.errors import DriverNotReady
from agent.gpu.sim import SimControl, open_simulator
from agent.wire.node import NodeDriver
from tests.integration.prewarm_fixtures.origin import Origin
from tests.integration.test_api_cli import agent_config_prewarm, cli, cli_config
from tests.unit.api.support import AgentProcess, agent_config, http_get, wait_for

pytestmark = pytest.mark.integration

_METRICS_PORT = re.compile(r"agent serving: metrics [^ ]*:(\d+)")
_MIG = "version: v1\nmig-configs:\n  all-disabled:\n    - {devices: all, mig-enabled: false}\n"
#: Fast follow-up for tests; the defaults are 5 s (retry) and 2 s (check).
_DRIVER = {"retry_max_s": 0.2, "check_s": 0.2}


def _ready_series(metrics: str) -> str | None:
    found = re.search(r"^gpu_agent_driver_ready(\{[^}]*\})? (\S+)$", metrics, re.M)
    return None if found is None else f"{found.group(1) or ''} {found.group(2)}"


def _with_gpu_series(port: int) -> str | None:
    metrics = http_get(port, "/metrics")[1]
    return metrics if "DCGM_FI_DEV_GPU_TEMP{" in metrics else None


def _attached_series(port: int) -> bool:
    metrics = _with_gpu_series(port)
    return metrics is not None and _ready_series(metrics) == '{reason=""} 1.0'


def _driverless_node(root: Path) -> SimControl:
    state_dir = root / "state"
    open_simulator(state_dir, "dgx-h100")
    control = SimControl(state_dir)
    control.driver_absent()
    return control


def _apply_mig(socket: Path) -> grpc.RpcError:
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        stub = mig_pb2_grpc.MigServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ApplyMig(
                mig_pb2.ApplyMigRequest(config_yaml=_MIG, config_name="all-disabled"), timeout=30
            )
    return refused.value


def test_serve_without_a_driver_prewarms_then_attaches_and_detaches_without_restart(
    tmp_path: Path,
) -> None:
    agent_root = tmp_path / "agent"
    agent_root.mkdir()
    (tmp_path / "origin").mkdir()
    control = _driverless_node(agent_root)
    with (
        Origin(tmp_path / "origin") as origin,
        AgentProcess(agent_root, agent_config(agent_root, driver=_DRIVER)) as agent,
    ):
        port = int(_METRICS_PORT.search(agent.output()).group(1))  # type: ignore[union-attr]
        assert http_get(port, "/healthz") == (200, "ok\n")
        status, body = http_get(port, "/readyz")
        assert status == 200
        assert "GPU features wait for the driver" in body and "not loaded" in body
        assert _ready_series(http_get(port, "/metrics")[1]) == '{reason="library_not_found"} 0.0'

        # Prewarm needs no GPU: through the running agent, from a real origin.
        origin.add("model.bin", b"weights" * 1000)
        config = cli_config(tmp_path, agent_root)
        config.write_text(
            config.read_text() + yaml.safe_dump({"prewarm": agent_config_prewarm(agent_root)})
        )
        warmed = cli(agent.state_dir, config, "prewarm", "file", origin.url("model.bin"),
                     "--name", "model")  # fmt: skip
        assert warmed.returncode == 0, warmed.stderr

        # A GPU feature: FAILED_PRECONDITION naming the cause; the CLI says it in one line.
        refused = _apply_mig(agent.socket)
        assert refused.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "mig apply needs the NVIDIA driver" in (refused.details() or "")
        mig_file = tmp_path / "mig.yaml"
        mig_file.write_text(_MIG)
        by_cli = cli(agent.state_dir, config, "mig", "apply", "-f", str(mig_file), "-c",
                     "all-disabled")  # fmt: skip
        assert by_cli.returncode == DriverNotReady.exit_code, by_cli.stderr
        assert "needs the NVIDIA driver, which is not ready" in by_cli.stderr

        client = AgentClient.connect(agent.socket)
        assert client is not None
        try:
            node = client.node()
            assert not node.gpus
            health = {c.name: c for c in node.components}
            assert not health["gpu-driver"].healthy
            assert "waiting for the NVIDIA driver" in health["gpu-driver"].detail
            # GetNode says it in a typed field, so any client can refuse without parsing words.
            assert (node.driver.attached, node.driver.cause) == (False, "library_not_found")

            # The driver loads: the same process attaches, GPUs and their series appear.
            control.driver_present()
            wait_for(lambda: len(client.node().gpus) == 8, "the agent to attach", 20)
            assert client.node().driver == NodeDriver(True)
            # The GPU series and the ready gauge come from two parts (the sampler's first
            # snapshot, then the attach): a scrape between them may see one without the other.
            wait_for(lambda: _attached_series(port), "GPU series and the driver ready", 10)
            assert http_get(port, "/readyz") == (200, "ready\n")

            # The driver goes away (an upgrade unloads it): detached, GPU series gone.
            control.driver_absent()
            wait_for(lambda: not client.node().gpus, "the agent to detach", 20)
            metrics = http_get(port, "/metrics")[1]
            assert _ready_series(metrics) == '{reason="driver_not_loaded"} 0.0'
            assert "DCGM_FI_DEV_GPU_TEMP{" not in metrics
            assert _apply_mig(agent.socket).code() is grpc.StatusCode.FAILED_PRECONDITION
        finally:
            client.close()
        assert agent.proc is not None and agent.proc.poll() is None, "no restart, no exit"
        assert "Traceback" not in agent.output()


#: Every GPU read a readiness script may use (issue 36): with no driver, exit 11 naming the
#: cause, never an empty success.
_GPU_READS = [
    ("mig", "show"),
    ("mig", "plan", "-f", "{mig}", "-c", "all-disabled"),
    ("mig", "assert", "-f", "{mig}", "-c", "all-disabled"),
    ("mig", "export"),
    ("mig", "checkpoint", "-f", "{ckpt}"),
    ("mig", "generate-config"),
    ("mig", "advise"),
    ("power", "show"),
    ("metrics",),
]


def test_no_driver_is_never_a_yes_and_status_says_why(tmp_path: Path) -> None:
    """A readiness check built on `mig assert` (or any GPU read) fails on a node whose driver
    is not loaded: exit 11 and one line naming the cause; `status` shows the driver line and
    the gpu-driver degradation in the table and in JSON."""
    agent_root = tmp_path / "agent"
    agent_root.mkdir()
    _driverless_node(agent_root)
    mig_file = tmp_path / "mig.yaml"
    mig_file.write_text(_MIG)
    ckpt = tmp_path / "ckpt.json"
    with AgentProcess(agent_root, agent_config(agent_root, driver=_DRIVER)) as agent:
        config = cli_config(tmp_path, agent_root)
        for args in _GPU_READS:
            argv = [a.format(mig=mig_file, ckpt=ckpt) for a in args]
            done = cli(agent.state_dir, config, *argv)
            assert done.returncode == DriverNotReady.exit_code, (argv, done.stdout, done.stderr)
            last = done.stderr.strip().splitlines()[-1]
            # named as the command the user typed ("power caps needs" read as no command)
            said = f"error: {' '.join(args[:2])} needs the NVIDIA driver, which is not ready"
            assert last.startswith(f"{said} (library_not_found)"), (argv, last)
        assert not ckpt.exists()  # "checkpointed" nothing: no file claims an empty node

        table = cli(agent.state_dir, config, "status")
        assert table.returncode == 0, table.stderr
        assert table.stdout.startswith("Driver not ready: GPUs not read")
        assert table.stdout.endswith("Processes\n  not read: the driver is not ready\n")
        assert "degraded: gpu-driver: waiting for the NVIDIA driver (library_not_found)" in (
            table.stdout
        )
        data = json.loads(cli(agent.state_dir, config, "status", "-o", "json").stdout)
        assert data["driver"]["ready"] is False and data["driver"]["cause"] == "library_not_found"
        assert "(library_not_found)" in data["driver"]["detail"]
        assert [d["component"] for d in data["degraded"]] == ["gpu-driver"]

        # Sharing is checked against the GPUs: unread GPUs are neither "no resources" nor a
        # reason a config is "invalid here"; a set is refused for the driver, a clear is not.
        shown = cli(agent.state_dir, config, "share", "show")
        assert shown.returncode == 0, shown.stderr
        assert "Advertised: not known: the GPUs were not read (waiting for the NVIDIA driver" in (
            shown.stdout
        )
        assert "advertises no GPU resources" not in shown.stdout
        as_json = json.loads(cli(agent.state_dir, config, "share", "show", "-o", "json").stdout)
        assert as_json["advertised"] is None  # not known: null, never "none advertised"
        assert "library_not_found" in as_json["advertised_unknown"]
        refused = cli(agent.state_dir, config, "share", "set", "--time-slicing", "nvidia.com/gpu=4")
        assert refused.returncode == DriverNotReady.exit_code, refused.stderr
        assert "share set needs the node's GPUs read (the config is checked against them): " in (
            refused.stderr
        )
        assert "waiting for the NVIDIA driver (library_not_found)" in refused.stderr
        assert not (agent_root / "plugin" / "config.yaml").exists()
        cleared = cli(agent.state_dir, config, "share", "clear")
        assert cleared.returncode == 0, cleared.stderr
        assert "Advertised: not known" in cleared.stdout


def test_the_cli_prewarms_with_no_agent_and_no_driver(tmp_path: Path) -> None:
    """No agent runs and the driver is not loaded: the embedded agent starts driver-less,
    `prewarm file` warms from the origin and `cache list` shows it; `mig apply` says why not."""
    root = tmp_path / "node"
    root.mkdir()
    (tmp_path / "origin").mkdir()
    _driverless_node(root)
    config = agent_config(root)
    with Origin(tmp_path / "origin") as origin:
        origin.add("model.bin", b"weights" * 1000)
        warmed = cli(root / "state", config, "prewarm", "file", origin.url("model.bin"),
                     "--name", "model")  # fmt: skip
        assert warmed.returncode == 0, warmed.stderr
    listed = cli(root / "state", config, "cache", "list")
    assert listed.returncode == 0 and "model" in listed.stdout, listed.stderr
    mig_file = tmp_path / "mig.yaml"
    mig_file.write_text(_MIG)
    refused = cli(root / "state", config, "mig", "apply", "-f", str(mig_file), "-c",
                  "all-disabled")  # fmt: skip
    assert refused.returncode == DriverNotReady.exit_code
    assert refused.stderr.strip().splitlines() == [
        "error: mig apply needs the NVIDIA driver, which is not ready (library_not_found): "
        "cannot use NVML "
        "(NVML Shared Library Not Found): the simulated driver is not loaded"
    ]
