"""The state store survives its disk (issue 30): a damaged database is kept aside and a new one
started, never a crash loop; a read-only or full state dir is one clear domain error naming it.

Real bytes and real filesystems: the database file is truncated or overwritten in place, and the
read-only and full state dirs are real tmpfs mounts (root only, as the agent runs).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import StateUnavailable
from agent.state import StateStore
from agent.statedir import probe


def _filled(path: Path) -> Path:
    """A database with some history in it, checkpointed into the main file and closed."""
    with StateStore(path) as store:
        for n in range(200):
            op = store.create_operation("mig.apply", request_id=f"r{n}", request={"n": n})
            store.update_operation(op.id, state="succeeded", result={"n": n, "pad": "x" * 200})
        store.journal_append("mig:GPU-1", {"step": 1})
    assert not path.with_name(path.name + "-wal").exists()  # closing checkpointed it
    return path


def _kept(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".corrupt-*"))


def test_a_truncated_database_is_kept_aside_and_a_new_one_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = _filled(tmp_path / "agent.db")
    size = db.stat().st_size
    with db.open("r+b") as f:
        f.truncate(size // 3)
    with caplog.at_level(logging.ERROR, "agent.state"), StateStore(db) as store:
        [kept] = _kept(db)
        assert kept.stat().st_size == size // 3  # the damaged bytes, kept for a person
        assert [r.getMessage() for r in caplog.records if str(kept) in r.getMessage()]
        assert store.list_operations() == []  # a new, empty database ...
        op = store.create_operation("mig.apply", request_id="again", request={})  # ... that works
        assert store.get_operation(op.id).state == "pending"
        healthy, detail = store.health()
        assert not healthy and str(kept) in detail and "MIG journal" in detail
    with StateStore(db) as reopened:  # the next start finds it sound: nothing moved again
        assert len(_kept(db)) == 1 and reopened.get_operation(op.id).id == op.id
    kept.unlink()  # a person looked at it: the store is healthy again
    with StateStore(db) as store:
        assert store.health()[0]


def test_a_database_with_a_page_overwritten_is_found_at_start(tmp_path: Path) -> None:
    """4 KiB of garbage in the middle of the file: SQLite opens it and would write on into it;
    the check at start finds it."""
    db = _filled(tmp_path / "agent.db")
    with db.open("r+b") as f:
        f.seek(8192)
        f.write(os.urandom(4096))
    with StateStore(db) as store:
        assert len(_kept(db)) == 1
        assert store.list_operations() == []
        with store.reading() as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_file_that_is_no_database_at_all_is_kept_aside(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    db.write_bytes(b"\0" * 100 + b"not sqlite" * 500)
    with StateStore(db) as store:
        assert len(_kept(db)) == 1
        assert store.schema_version >= 1


@contextlib.contextmanager
def _tmpfs(where: Path, size: str, *extra: str) -> Iterator[Path]:
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the agent runs as root)")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join((f"size={size}", *extra)), "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_read_only_state_dir_is_one_error_naming_it(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    with (
        _tmpfs(ro, "1m", "ro"),
        pytest.raises(StateUnavailable, match=f"the state dir {ro} takes no writes"),
    ):
        StateStore(ro / "agent.db")


def test_a_full_state_dir_refuses_writes_naming_it_and_serves_reads(tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "state", "1m") as state:
        store = StateStore(state / "agent.db")
        try:
            first = store.create_operation("prewarm", request_id=None, request={})
            with (state / "filler").open("wb") as filler, contextlib.suppress(OSError):
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
            with pytest.raises(StateUnavailable, match=f"the state dir {state} is full"):
                for n in range(1000):  # until the WAL needs a page the filesystem lacks
                    store.create_operation("prewarm", request_id=f"r{n}", request={"p": "x" * 4000})
            assert "is full" in store.health()[1]
            assert store.get_operation(first.id).state == "pending"  # reads go on
            (state / "filler").unlink()  # space again: writes work and the store is healthy
            store.create_operation("prewarm", request_id="after", request={})
            assert store.health()[0]
        finally:
            store.close()


@contextlib.contextmanager
def _read_only_copy(tmp_path: Path, files: dict[str, bytes]) -> Iterator[Path]:
    """``files`` on a tmpfs the kernel then remounts read-only (EROFS on every write)."""
    with _tmpfs(tmp_path / "ro", "4m") as where:
        for name, data in files.items():
            (where / name).write_bytes(data)
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        yield where


def _files(db: Path) -> dict[str, bytes]:
    return {
        db.name + suffix: db.with_name(db.name + suffix).read_bytes()
        for suffix in ("", "-wal", "-shm")
        if db.with_name(db.name + suffix).exists()
    }


@pytest.mark.parametrize("left", ["clean stop", "killed (-wal and -shm)", "-wal without -shm"])
def test_a_read_only_state_dir_serves_every_committed_row_and_refuses_writes(
    tmp_path: Path, left: str
) -> None:
    """What SQLite needs to read a WAL database it may not write (immutable=1 without a -wal,
    mode=ro with both files, a private copy with a -wal alone): no committed row is missed."""
    db = tmp_path / "rw" / "agent.db"
    store = StateStore(db)
    ids = [store.create_operation("prewarm", request_id=None, request={"n": n}).id for n in (1, 2)]
    if left == "clean stop":
        store.close()
        files = _files(db)
    else:
        files = _files(db)  # while open: the second row only in the -wal, as a kill leaves it
        assert db.name + "-wal" in files
        if left == "-wal without -shm":
            del files[db.name + "-shm"]
        store.close()
    with _read_only_copy(tmp_path, files) as ro:
        unwritable = probe(ro)
        assert unwritable is not None and unwritable.cause == "EROFS"
        with StateStore(ro / "agent.db", read_only=unwritable) as read_only:
            assert sorted(op.id for op in read_only.list_operations()) == sorted(ids)
            assert read_only.schema_version == len(StateStore.MIGRATIONS)
            with pytest.raises(StateUnavailable, match=f"the state dir {ro} takes no writes"):
                read_only.create_operation("prewarm", request_id=None, request={})
            with pytest.raises(StateUnavailable, match="restart the agent"):
                read_only.require_writable()
            healthy, detail = read_only.health()
            assert not healthy and "read-only since the agent started" in detail
            assert read_only.writable() == (False, "EROFS")
        assert sorted(path.name for path in ro.iterdir()) == sorted(files)  # nothing written


def test_a_read_only_state_dir_without_a_database_reads_as_an_empty_node(tmp_path: Path) -> None:
    with _read_only_copy(tmp_path, {}) as ro:
        store = StateStore(ro / "agent.db", read_only=probe(ro))
        assert store.list_operations() == [] and store.journal_scopes() == []
        store.close()


def test_the_owner_lock_still_excludes_on_a_read_only_state_dir(tmp_path: Path) -> None:
    """flock needs no write access: the lock file (or the directory, when none was ever made)
    opened read-only still keeps a second owner out; only the holder's record is missing."""
    from agent.lockfile import HolderLock

    with _read_only_copy(tmp_path, {"agent.lock": b""}) as ro:
        for path in (ro / "agent.lock", ro / "never-made.lock"):
            first, second = HolderLock(path), HolderLock(path)
            assert first.try_acquire({"pid": 1})
            assert not second.try_acquire({"pid": 2})
            first.release()
            assert second.try_acquire({"pid": 2})
            second.release()


def test_a_state_dir_that_is_a_socket_or_under_a_file_is_named_not_a_directory(
    tmp_path: Path,
) -> None:
    """A socket (or any file) where the state dir must be said "not writable (File exists)",
    whose fix (remount, free space, chown) cannot help: it is named what it is, with the fix
    that does, by the owner lock and the state database alike."""
    import socket

    from agent.ownership import NodeOwnership

    where = tmp_path / "agent.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(where))
        for state_dir in (where, where / "sub"):
            expected = f"the state dir {state_dir} is not a directory"
            with pytest.raises(StateUnavailable, match=expected) as refused:
                NodeOwnership(state_dir).try_acquire("test")
            assert "remove what is there or pass another --state-dir" in str(refused.value)
            with pytest.raises(StateUnavailable, match=expected):
                StateStore(state_dir / "state.db")
