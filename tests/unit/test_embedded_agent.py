"""A CLI command with no agent running runs on its own embedded agent (agent/embedded.py): what
the command says is the command's (its output, an API error's line), never the agent's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agent.ownership import NodeOwnership
from tests.unit.api.support import REPO


def gpu_agent(state: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "--state-dir", str(state), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GPU_AGENT_SIMULATE": "h100-nvl", **env},
    )


def test_a_tmpdir_too_long_for_the_private_socket_is_named_with_its_limit(tmp_path: Path) -> None:
    """The embedded agent's socket lives in a fresh directory under TMPDIR; one that leaves its
    path over the 107 bytes a socket address holds is refused naming TMPDIR (exit 2), with
    nothing left behind and the node released. Before, gRPC's own error line came first and the
    command exited 4 ("cannot listen on unix:...")."""
    tmpdir = tmp_path / ("t" * (78 - len(str(tmp_path)) - 1))  # 78 bytes: one too many
    assert len(os.fsencode(tmpdir)) == 78
    tmpdir.mkdir()
    state = tmp_path / "state"
    result = gpu_agent(state, "status", TMPDIR=str(tmpdir))
    assert result.returncode == 2, result.stderr
    headline, field = result.stderr.splitlines()
    assert headline.startswith(f"error: the command's embedded agent cannot serve on {tmpdir}/")
    assert headline.endswith(
        ": 108 bytes, longer than the 107 a Unix socket path may have; its directory is made "
        f"in {tmpdir} (TMPDIR): set TMPDIR to a shorter directory"
    )
    assert field == "  TMPDIR: a directory of at most 77 bytes"
    assert list(tmpdir.iterdir()) == []
    owner = NodeOwnership(state)
    assert owner.try_acquire("test"), "the command released the node"
    owner.release()
    # One byte shorter, the command runs.
    shorter = tmp_path / ("t" * (77 - len(str(tmp_path)) - 1))
    shorter.mkdir()
    assert gpu_agent(state, "status", TMPDIR=str(shorter)).returncode == 0


def test_a_lost_gpu_is_in_the_commands_output_and_the_agents_log_line_is_not(
    tmp_path: Path,
) -> None:
    """The embedded agent's log stays out of the command's output, errors too (docs/api.md):
    `status` shows the lost GPU in its table, `mig advise` refuses in its own line (exit 7),
    and neither prints the agent's "GPU 1 (uuid unknown) lost" (before: once for status, twice
    for mig advise). GPU_AGENT_LOG_LEVEL=debug still shows the agent's log."""
    state = tmp_path / "state"
    assert gpu_agent(state, "sim", "lost", "1").returncode == 0
    status = gpu_agent(state, "status")
    assert status.returncode == 0, status.stderr
    assert status.stderr == ""
    rows = [line.split()[:3] for line in status.stdout.splitlines()]
    assert ["1", "lost", "failed"] in rows, status.stdout
    assert "GPU 1 is lost: nvmlDeviceGetHandleByIndex: GPU is lost" in status.stdout
    advise = gpu_agent(state, "mig", "advise", "--gpu", "1")
    assert advise.returncode == 7
    assert advise.stderr == "error: GPU 1 is lost: what fits on it cannot be read\n"
    debug = gpu_agent(state, "status", GPU_AGENT_LOG_LEVEL="debug")
    assert debug.returncode == 0
    assert "GPU 1 (uuid unknown) lost: nvmlDeviceGetHandleByIndex: GPU is lost" in debug.stderr
