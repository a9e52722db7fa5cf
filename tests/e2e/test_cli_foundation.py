"""The CLI as a user runs it: a real `gpu-agent` process on a simulated node."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import click
import pytest
import yaml

from agent.cli.main import cli

REPO = Path(__file__).resolve().parents[2]
_SERVING_ON = re.compile(r"agent serving: metrics 127\.0\.0\.1:(\d+),")


def run(
    *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_AGENT_")}
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {proc.stderr}")
    return proc


def _commands(group: click.Command, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path, through click's own lookup (the root group loads lazily)."""
    if not isinstance(group, click.Group):
        return []
    ctx = click.Context(group)
    out = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, f"{' '.join((*prefix, name))} is listed but cannot be loaded"
        out.append((*prefix, name))
        out.extend(_commands(cmd, (*prefix, name)))
    return out


def test_the_command_tree_is_whole() -> None:
    paths = {" ".join(p) for p in _commands(cli)}
    assert {"serve", "status", "fleet status", "prewarm file", "cache list", "mig apply"} <= paths
    assert len(paths) > 40


def test_starting_the_cli_loads_no_command_module() -> None:
    """`gpu-agent` imports a command's module only when it runs: the start stays fast."""
    code = (
        "import sys; from agent.cli.main import cli; "
        "print(sorted(m for m in sys.modules if m.startswith('agent.') and "
        "m.split('.')[1] in ('prewarm', 'mig', 'coordinator', 'telemetry', 'gpu', 'api')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("path", _commands(cli), ids=" ".join)
def test_every_command_has_help_with_an_example(path: tuple[str, ...]) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    if not isinstance(_lookup(path), click.Group):  # leaf commands carry a runnable example
        assert "Example" in result.output, f"`gpu-agent {' '.join(path)} --help` shows no example"


@pytest.mark.parametrize("path", _commands(cli), ids=" ".join)
def test_every_option_says_what_it_does_in_plain_text(path: tuple[str, ...]) -> None:
    """`coordinator serve --log-level` showed no help; `mig export --help` showed the reST
    markup ``mig apply`` its docstring was written in (help is plain text: `mig apply`)."""
    from click.testing import CliRunner

    command = _lookup(path)
    bare = [p.opts for p in command.params if isinstance(p, click.Option) and not p.help]
    assert not bare, f"`gpu-agent {' '.join(path)}`: options without help: {bare}"
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert "``" not in result.output, result.output


def test_serve_help_names_what_it_serves_and_coordinator_once_every_exit() -> None:
    """`serve --help` named /metrics and /healthz but not /readyz; `coordinator serve --once`
    named exits 1 and 10 but not 2, a desired file that does not parse (docs/coordinator.md)."""
    from click.testing import CliRunner

    served = " ".join(CliRunner().invoke(cli, ["serve", "--help"]).output.split())
    assert "/metrics, /healthz, /readyz" in served
    assert "/metrics, /healthz and /readyz" in served  # --metrics-listen
    once = " ".join(CliRunner().invoke(cli, ["coordinator", "serve", "--help"]).output.split())
    assert "1 if it failed, 2 if the desired file does not parse, 10 if" in once


def _lookup(path: tuple[str, ...]) -> click.Command:
    cmd: click.Command = cli
    for name in path:
        assert isinstance(cmd, click.Group)
        found = cmd.get_command(click.Context(cmd), name)
        assert found is not None
        cmd = found
    return cmd


def test_without_nvml_serve_serves_and_says_in_one_line_how_to_simulate(tmp_path: Path) -> None:
    """No driver is a state, not an exit: the agent serves (prewarm, API, metrics) and one
    warning says GPU features wait and how to run the simulator; it never falls back to it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_AGENT_")}
    env["GPU_AGENT_SOCKET_PATH"] = str(tmp_path / "agent.sock")
    env["GPU_AGENT_PREWARM__CACHE_DIR"] = str(tmp_path / "cache")
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent.cli.main",
                "--state-dir",
                str(tmp_path),
                "serve",
                "--metrics-listen",
                "127.0.0.1:0",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not (serving := _SERVING_ON.search(log.read_text(errors="replace"))):
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "agent never served"
            time.sleep(0.1)
        port = int(serving.group(1))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            assert r.status == 200 and b"GPU features wait for the driver" in r.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    # The doctor's start-up summary (one line per check that is not ok) is its own; of the
    # agent's other lines, one warning says it all.
    lines = log.read_text().splitlines()
    warnings = [line for line in lines if " WARNING " in line and " doctor: " not in line]
    assert len(warnings) == 1, warnings
    assert "GPU features are unavailable" in warnings[0]
    assert "NVML" in warnings[0] and "--simulate" in warnings[0]
    assert not (tmp_path / "sim").exists(), "must never fall back to the simulator"


def test_serve_on_a_simulated_node_answers_health_metrics_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_AGENT_")}
    env["GPU_AGENT_SOCKET_PATH"] = str(tmp_path / "agent.sock")
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent.cli.main",
                "--simulate",
                "dgx-h100",
                "--state-dir",
                str(tmp_path),
                "serve",
                "--metrics-listen",
                "127.0.0.1:0",  # the agent binds a free port and says which in its log
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not (serving := _SERVING_ON.search(log.read_text(errors="replace"))):
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "agent never became ready"
            time.sleep(0.1)
        port = int(serving.group(1))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            assert r.read() == b"ok\n"
        # One scrape serves the GPUs' series and the other services' (prewarm cache) series;
        # profiling rates need two GPM samples, so they appear from the second collection on.
        deadline = time.monotonic() + 15
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                body = r.read().decode()
            if "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{" in body or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{" in body
        assert 'gpu_agent_prewarm_cache_bytes{kind="capacity"}' in body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_status_reflects_the_simulated_node_in_every_format(tmp_path: Path) -> None:
    env = {"GPU_AGENT_SIMULATE": "a30-node", "GPU_AGENT_STATE_DIR": str(tmp_path)}
    run("sim", "process", "start", "4242", "--gpu", "2", "--memory-mib", "2048", env=env)
    data = json.loads(run("status", "-o", "json", env=env).stdout)
    assert [g["name"] for g in data["gpus"]] == ["NVIDIA A30"] * 4
    assert data["gpus"][2]["processes"] == [
        {
            "pid": 4242,
            "used_memory_bytes": 2048 * 1024 * 1024,
            "gpu_instance_id": None,
            "compute_instance_id": None,
        }
    ]
    assert yaml.safe_load(run("status", "-o", "yaml", env=env).stdout) == data
    table = run("status", env=env).stdout
    assert "NVIDIA A30" in table and "4242" in table


def test_sim_commands_drive_one_node_shared_by_separate_processes(tmp_path: Path) -> None:
    env = {"GPU_AGENT_SIMULATE": "dgx-a100", "GPU_AGENT_STATE_DIR": str(tmp_path)}
    run("sim", "holder", "0", "nvidia-persistenced", env=env)
    run("sim", "lost", "5", env=env)
    state = json.loads(run("sim", "show", "-o", "json", env=env).stdout)
    text = json.dumps(state)
    assert "nvidia-persistenced" in text
    presets = run("sim", "presets", "-o", "json").stdout
    names = {p["name"] for p in json.loads(presets)}
    assert {
        "dgx-a100",
        "dgx-a100-80",
        "a30-node",
        "dgx-h100",
        "h100-nvl",
        "hgx-h200",
        "gh200",
        "gh200-144",
        "hgx-h20",
        "dgx-b200",
        "rtx-pro-6000",
        "mixed",
    } <= names


def test_sim_driver_installs_another_generation_and_refuses_a_bad_one(tmp_path: Path) -> None:
    env = {"GPU_AGENT_SIMULATE": "dgx-a100", "GPU_AGENT_STATE_DIR": str(tmp_path)}
    run("sim", "driver", "470.256.02", env=env)
    state = json.loads(run("sim", "show", "-o", "json", env=env).stdout)
    assert (state["driver_version"], state["cuda_driver_version"]) == ("470.256.02", 11040)
    bad = run("sim", "driver", "999", env=env, check=False)
    assert bad.returncode != 0 and "driver_version" in bad.stderr
    assert json.loads(run("sim", "show", "-o", "json", env=env).stdout) == state


def test_a_different_preset_never_replaces_an_existing_simulated_node(tmp_path: Path) -> None:
    run("--simulate", "dgx-a100", "--state-dir", str(tmp_path), "status")
    proc = run("--simulate", "dgx-h100", "--state-dir", str(tmp_path), "status", check=False)
    assert proc.returncode != 0
    assert "dgx-a100" in proc.stderr and "dgx-h100" in proc.stderr


def test_bad_config_fails_at_start_naming_the_key_and_changes_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("telemetry:\n  interval_s: 0.01\n")
    proc = run(
        "--config",
        str(cfg),
        "--simulate",
        "dgx-h100",
        "--state-dir",
        str(tmp_path / "s"),
        "status",
        check=False,
    )
    assert proc.returncode == 2
    assert "telemetry.interval_s" in proc.stderr
    assert not (tmp_path / "s").exists()
    proc = run("--simulate", "nope", "--state-dir", str(tmp_path / "s"), "status", check=False)
    assert proc.returncode == 2 and "dgx-h100" in proc.stderr


def test_flags_win_over_env_which_wins_over_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"simulate: dgx-a100\nstate_dir: {tmp_path / 'file'}\n")
    env = {"GPU_AGENT_STATE_DIR": str(tmp_path / "env")}
    run("--config", str(cfg), "status", env=env)
    assert (tmp_path / "env" / "sim").exists() and not (tmp_path / "file").exists()
    run("--config", str(cfg), "--state-dir", str(tmp_path / "flag"), "status", env=env)
    assert (tmp_path / "flag" / "sim").exists()
