"""The Unix socket is served only from a directory nobody else can write: the attack run had
uid nobody squat the path of a 0777 directory (the agent exited 4) or replace the live socket."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent.api.socket_dir import prepare_socket
from agent.errors import Conflict, InvalidSpec
from tests.unit.api.support import REPO, agent_config

NOBODY = 65534


def refusal(path: Path) -> str:
    with pytest.raises(InvalidSpec) as caught:
        prepare_socket(path)
    (violation,) = caught.value.violations
    assert violation.field == "socket_path"
    return str(caught.value)


def test_a_missing_directory_is_created_for_root_alone(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        prepare_socket(tmp_path / "run" / "gpu-agent" / "agent.sock")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "run" / "gpu-agent").stat().st_mode) == 0o700


def test_a_directory_others_may_write_is_refused_with_the_fix(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o777)
    message = refusal(run / "agent.sock")
    assert str(run / "agent.sock") in message
    assert "mode 0777" in message and f"chmod 0700 {run}" in message
    run.chmod(0o770)  # group-writable is no better
    assert "mode 0770" in refusal(run / "agent.sock")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")
def test_a_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    os.chown(run, NOBODY, NOBODY)
    message = refusal(run / "agent.sock")
    assert f"{run} is owned by uid {NOBODY}" in message
    assert f"chown {os.geteuid()} {run}" in message


def test_an_ancestor_others_may_write_is_refused_unless_sticky(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "gpu-agent").mkdir(parents=True, mode=0o700)
    shared.chmod(0o777)  # anyone could rename gpu-agent/ and put their own in its place
    message = refusal(shared / "gpu-agent" / "agent.sock")
    assert f"ancestor {shared}" in message and f"chmod go-w {shared}" in message
    shared.chmod(0o1777)  # like /tmp: only the owner may rename what is in it
    prepare_socket(shared / "gpu-agent" / "agent.sock")


def test_a_symlinked_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    assert f"point socket_path at the real directory ({real})" in refusal(
        tmp_path / "link" / "agent.sock"
    )


def test_a_stale_socket_is_removed_and_a_live_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(path))
    live.listen()
    with pytest.raises(Conflict, match="another agent is serving"):
        prepare_socket(path)
    live.close()  # the file stays, nobody listens: what a killed agent leaves
    prepare_socket(path)
    assert not path.exists()


def _serve(tmp_path: Path, config: Path, preset: str) -> subprocess.CompletedProcess[str]:
    """``gpu-agent --simulate PRESET serve`` on ``tmp_path``'s state dir, to its end."""
    argv = ["--simulate", preset, "--state-dir", str(tmp_path / "state"), "--config", str(config)]
    return subprocess.run(
        [sys.executable, "-m", "agent.cli.main", *argv, "serve"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_agent_refuses_to_serve_from_such_a_directory(tmp_path: Path) -> None:
    """``gpu-agent serve`` exits with the refusal (an invalid setting, exit 2) and serves
    nothing, instead of creating a socket others could replace."""
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o777)
    config = agent_config(tmp_path, socket_path=str(run / "agent.sock"))
    result = _serve(tmp_path, config, "dgx-a100")
    assert result.returncode == 2, result.stderr
    assert f"refusing to serve the API on {run / 'agent.sock'}" in result.stderr
    assert f"chmod 0700 {run}" in result.stderr
    assert not (run / "agent.sock").exists()


def test_serve_refuses_a_socket_path_too_long_to_bind_before_the_driver_or_any_directory(
    tmp_path: Path,
) -> None:
    """A socket_path over the 107 bytes a Unix socket address holds is a bad setting: ``serve``
    refuses it in its start-up checks (exit 2, naming socket_path and the limit) as its only
    output, before the driver attaches or the socket's directory is made. Before the check it
    attached the driver, printed gRPC's own error line and exited 4 ("cannot listen")."""
    run = tmp_path / "run"
    path = run / ("s" * (108 - len(str(run)) - 1))  # 108 bytes: one too many
    assert len(os.fsencode(path)) == 108
    config = agent_config(tmp_path, socket_path=str(path))
    result = _serve(tmp_path, config, "dgx-h100")
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == 2, "\n".join(lines)
    assert lines == [
        f"error: socket_path {path} is 108 bytes, longer than the 107 a Unix socket path may "
        "have: set socket_path (--config or GPU_AGENT_SOCKET_PATH) to a shorter path",
        "  socket_path: at most 107 bytes, not 108",
    ]
    assert not run.exists()


def test_a_socket_path_of_107_bytes_serves(tmp_path: Path) -> None:
    """The limit is the kernel's, not one byte short of it: 107 bytes bind."""
    path = tmp_path / ("s" * (107 - len(str(tmp_path)) - 1))
    assert len(os.fsencode(path)) == 107
    prepare_socket(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(path))
    assert stat.S_ISSOCK(path.lstat().st_mode)
