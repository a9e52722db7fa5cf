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
        pytest.raises(StateUnavailable, match=f"the state dir {ro} is not writable"),
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
