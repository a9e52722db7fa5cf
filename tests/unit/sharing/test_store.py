"""The config file on disk: atomic replace, previous version, status record."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from agent.errors import AgentError, NotFound, PermissionDenied
from agent.sharing.store import ConfigStore, atomic_write


def test_atomic_write_creates_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    atomic_write(path, b"one")
    atomic_write(path, b"two")
    assert path.read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_atomic_write_keeps_the_file_mode_and_defaults_to_world_readable(tmp_path: Path) -> None:
    """The plugin may run as another user; a new file must be readable by it."""
    path = tmp_path / "config.yaml"
    atomic_write(path, b"one")
    assert path.stat().st_mode & 0o777 == 0o644
    path.chmod(0o640)
    atomic_write(path, b"two")
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"old")

    class Interrupted(Exception):
        """The write stopped part-way."""

    def fail(written: int) -> None:
        raise Interrupted

    with pytest.raises(Interrupted):
        atomic_write(path, b"x" * 10, chunk_size=4, on_chunk=fail)
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_on_chunk_sees_the_bytes_written_so_far(tmp_path: Path) -> None:
    seen: list[int] = []
    atomic_write(tmp_path / "c", b"x" * 10, chunk_size=4, on_chunk=seen.append)
    assert seen == [4, 8, 10]


def test_os_errors_name_the_path(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").mkdir()
    with pytest.raises(AgentError, match=r"cannot write .*config\.yaml"):
        atomic_write(tmp_path / "config.yaml", b"x")


def test_a_missing_directory_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="config directory"):
        atomic_write(tmp_path / "absent" / "config.yaml", b"x")


def test_an_unwritable_directory_is_permission_denied() -> None:
    """Checked as an unprivileged user (a forked child drops to nobody): root writes anyway."""
    base = Path(tempfile.mkdtemp())
    try:
        base.chmod(0o755)
        target = base / "ro"
        target.mkdir(mode=0o555)
        target.chmod(0o555)
        pid = os.fork()
        if pid == 0:  # child: never returns into pytest
            code = 1
            try:
                if os.geteuid() == 0:
                    os.setgid(65534)
                    os.setuid(65534)
                try:
                    atomic_write(target / "config.yaml", b"x")
                except PermissionDenied:
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not (target / "config.yaml").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_write_keeps_the_previous_version(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path / "config.yaml")
    with store.lock():
        store.write(b"first")
        store.write(b"second")
    assert store.read() == b"second"
    assert store.read_previous() == b"first"


def test_the_first_write_keeps_an_empty_previous_so_rollback_means_defaults(
    tmp_path: Path,
) -> None:
    """The plugin reads an empty config as its defaults (config-manager's "empty" fallback)."""
    store = ConfigStore(tmp_path / "config.yaml")
    with store.lock():
        store.write(b"first")
    assert store.read_previous() == b""


def test_swap_with_previous_restores_and_keeps_the_replaced_one(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path / "config.yaml")
    with store.lock():
        store.write(b"first")
        store.write(b"second")
        store.swap_with_previous(b"first")
    assert (store.read(), store.read_previous()) == (b"first", b"second")


def test_taking_the_lock_removes_temp_files_of_killed_writers(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path / "config.yaml")
    stale = tmp_path / ".config.yaml.abc123.tmp"
    stale.write_bytes(b"half")
    other = tmp_path / ".other.yaml.abc123.tmp"
    other.write_bytes(b"not ours")
    with store.lock():
        pass
    assert not stale.exists()
    assert other.exists()


def test_status_round_trips_and_garbage_reads_as_none(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path / "config.yaml")
    assert store.read_status() is None
    store.write_status({"action": "set", "n": 1})
    assert store.read_status() == {"action": "set", "n": 1}
    store.status_path.write_text("{not json")
    assert store.read_status() is None
    store.status_path.write_text("[1, 2]")
    assert store.read_status() is None


def test_companion_files_sit_beside_the_config(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path / "config.yaml")
    assert store.previous_path == tmp_path / "config.yaml.previous"
    assert store.status_path == tmp_path / "config.yaml.status.json"
    assert store.mtime() is None
