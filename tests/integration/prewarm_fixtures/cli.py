"""Run ``gpu-agent`` with the prewarm commands, in a subprocess, as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def agent_env(tmp: Path, **settings: str) -> dict[str, str]:
    """A simulated node under ``tmp``: the commands run on the agent embedded for them (or on
    one serving on ``tmp``/agent.sock), as every command does."""
    env = dict(os.environ)
    env["GPU_AGENT_SIMULATE"] = "dgx-h100"
    env["GPU_AGENT_STATE_DIR"] = str(tmp / "state")
    env["GPU_AGENT_SOCKET_PATH"] = str(tmp / "agent.sock")
    env["GPU_AGENT_TELEMETRY__KUBELET_SOCKET"] = str(tmp / "kubelet.sock")
    env["GPU_AGENT_PREWARM__CACHE_DIR"] = str(tmp / "cache")
    env["GPU_AGENT_PREWARM__ALLOW_HTTP"] = "true"
    # The test origins listen on loopback, which the agent refuses unless the operator opens it.
    env["GPU_AGENT_PREWARM__EGRESS_ALLOW"] = "127.0.0.0/8,::1"
    env["PYTHONPATH"] = str(ROOT)
    for key, value in settings.items():
        env[f"GPU_AGENT_PREWARM__{key.upper()}"] = value
    return env


def spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agent.cli.main", *args],
        env=env,
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


class _Hung(subprocess.TimeoutExpired):
    """A command past its time, its threads' stacks in the message (pytest shows only that)."""

    def __str__(self) -> str:
        said = self.stderr if isinstance(self.stderr, str) else ""
        return f"{super().__str__()}; what it was doing:\n{said[-6000:]}"


def run(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """The command to its end; one past ``timeout`` is made to print every thread's stack
    (faulthandler, SIGABRT) before it dies, so the TimeoutExpired says where it hung."""
    argv = [sys.executable, "-X", "faulthandler", "-m", "agent.cli.main", *args]
    with subprocess.Popen(
        argv, env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise _Hung(argv, timeout, out, err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
