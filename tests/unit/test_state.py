"""The SQLite state store: migrations, operations, the journal, and crash safety."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import agent
from agent.errors import Conflict, InvalidSpec, NotFound, StateUnavailable
from agent.operation import INTERRUPTED
from agent.state import MIGRATIONS, TABLE_DURABILITY, Durability, StateStore

REPO_ROOT = Path(agent.__file__).resolve().parents[1]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "agent.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[StateStore]:
    with StateStore(db_path, clock=FakeClock()) as opened:
        yield opened


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter that imports this checkout's ``agent``."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {name for (name,) in rows}


# --- opening and migrations ----------------------------------------------------------------------


def test_open_creates_the_parent_dir_and_applies_every_migration(db_path: Path) -> None:
    with StateStore(db_path) as store:
        assert store.schema_version == len(MIGRATIONS)
    assert {"operations", "journal"} <= tables(db_path)


def test_reopening_applies_nothing_twice(db_path: Path) -> None:
    """Migrations are recorded in user_version, so a second open is a no-op."""
    with StateStore(db_path) as store:
        op = store.create_operation("mig.apply", request_id=None, request={"a": 1})
    with StateStore(db_path) as store:
        assert store.schema_version == len(MIGRATIONS)
        assert store.get_operation(op.id) == op


EXTRA = """
    CREATE TABLE extra (x TEXT NOT NULL DEFAULT 'a;b');
    CREATE TRIGGER extra_count AFTER INSERT ON extra BEGIN
        INSERT INTO journal (scope, entry, created_at) VALUES ('extra', '{}', 0);
    END;
"""


class Upgraded(StateStore):
    """A later agent version: one more migration, with ';' inside a string and a trigger."""

    MIGRATIONS = (*MIGRATIONS, (len(MIGRATIONS) + 1, EXTRA))


class Broken(StateStore):
    MIGRATIONS = (
        *MIGRATIONS,
        (len(MIGRATIONS) + 1, "CREATE TABLE half (x TEXT); CREATE TABLE oops ("),
    )


def test_a_later_migration_applies_once_on_an_existing_database(db_path: Path) -> None:
    StateStore(db_path).close()
    with Upgraded(db_path) as store:
        assert store.schema_version == len(MIGRATIONS) + 1
    with Upgraded(db_path) as store:
        assert store.schema_version == len(MIGRATIONS) + 1
        with store.transaction() as conn:
            conn.execute("INSERT INTO extra DEFAULT VALUES")
            assert conn.execute("SELECT x FROM extra").fetchone()[0] == "a;b"
        assert store.journal_scopes() == ["extra"]


def test_a_failing_migration_changes_nothing(db_path: Path) -> None:
    """A migration is all or nothing: its first statement is rolled back with the version."""
    StateStore(db_path).close()
    with pytest.raises(sqlite3.Error):
        Broken(db_path)
    assert "half" not in tables(db_path)
    with StateStore(db_path) as store:
        assert store.schema_version == len(MIGRATIONS)


def test_an_older_agent_refuses_a_newer_database(db_path: Path) -> None:
    Upgraded(db_path).close()
    with pytest.raises(Conflict, match="newer than this agent"):
        StateStore(db_path)


def test_migration_versions_must_count_up_from_one(db_path: Path) -> None:
    class Gap(StateStore):
        MIGRATIONS = (*MIGRATIONS, (len(MIGRATIONS) + 2, "SELECT 1"))

    with pytest.raises(ValueError, match="in order"):
        Gap(db_path)


def test_wal_mode_foreign_keys_and_busy_timeout_are_on(store: StateStore) -> None:
    with store.transaction() as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0


# --- transactions ------------------------------------------------------------------------------


def test_a_transaction_that_raises_is_rolled_back(store: StateStore) -> None:
    with pytest.raises(RuntimeError), store.transaction():
        store.journal_append("mig:GPU-1", {"step": 1})
        raise RuntimeError("boom")
    assert store.journal_entries("mig:GPU-1") == []


def test_nested_store_calls_join_the_outer_transaction(store: StateStore) -> None:
    """Several store calls in one transaction commit together or not at all."""
    with pytest.raises(RuntimeError), store.transaction():
        store.create_operation("prewarm", request_id="r1", request={})
        store.journal_append("mig:GPU-1", {"step": 1})
        raise RuntimeError("boom")
    assert store.list_operations() == []
    assert store.journal_scopes() == []


# --- operations ----------------------------------------------------------------------------------


def test_a_new_operation_is_pending_with_its_request(store: StateStore) -> None:
    op = store.create_operation(
        "mig.apply", request_id="req-1", request={"layout": "all-1g.10gb"}, metadata={"step": 0}
    )
    assert len(op.id) == 32
    assert (op.kind, op.state, op.request_id) == ("mig.apply", "pending", "req-1")
    assert op.request == {"layout": "all-1g.10gb"}
    assert op.metadata == {"step": 0}
    assert (op.result, op.error, op.cancel_requested, op.done) == (None, None, False, False)
    assert op.created_at == op.updated_at
    assert store.get_operation(op.id) == op


def test_a_retry_with_the_same_request_id_returns_the_first_operation(store: StateStore) -> None:
    """Idempotent create: the key order of the request does not matter."""
    first = store.create_operation("prewarm", request_id="r", request={"a": 1, "b": [1, 2]})
    again = store.create_operation("prewarm", request_id="r", request={"b": [1, 2], "a": 1})
    assert again == first
    assert len(store.list_operations()) == 1


def test_the_same_request_id_with_another_request_conflicts(store: StateStore) -> None:
    store.create_operation("prewarm", request_id="r", request={"a": 1})
    with pytest.raises(Conflict, match="'r'"):
        store.create_operation("prewarm", request_id="r", request={"a": 2})


def test_request_ids_are_per_kind_and_optional(store: StateStore) -> None:
    a = store.create_operation("prewarm", request_id="r", request={"a": 1})
    b = store.create_operation("mig.apply", request_id="r", request={"a": 2})
    c = store.create_operation("mig.apply", request_id=None, request={"a": 2})
    d = store.create_operation("mig.apply", request_id=None, request={"a": 2})
    assert len({a.id, b.id, c.id, d.id}) == 4


def test_an_unknown_operation_is_not_found(store: StateStore) -> None:
    with pytest.raises(NotFound):
        store.get_operation("nope")
    with pytest.raises(NotFound):
        store.update_operation("nope", state="running")


def test_update_sets_only_the_given_fields(store: StateStore) -> None:
    op = store.create_operation("mig.apply", request_id=None, request={}, metadata={"step": 0})
    running = store.update_operation(op.id, state="running")
    assert (running.state, running.metadata) == ("running", {"step": 0})
    assert running.updated_at > op.updated_at
    progressed = store.update_operation(op.id, metadata={"step": 2})
    assert (progressed.state, progressed.metadata) == ("running", {"step": 2})
    done = store.update_operation(op.id, state="succeeded", result={"gpus": 8})
    assert done.done
    assert done.result == {"gpus": 8}
    assert done.created_at == op.created_at


def test_a_done_operation_is_final(store: StateStore) -> None:
    """A late worker cannot overwrite a cancellation (or any other end state)."""
    op = store.create_operation("prewarm", request_id=None, request={})
    store.update_operation(op.id, state="cancelled")
    with pytest.raises(Conflict, match="already cancelled"):
        store.update_operation(op.id, state="succeeded", result={})
    assert store.get_operation(op.id).state == "cancelled"


def test_restating_an_ended_error_keeps_its_state_and_every_earlier_error(
    store: StateStore,
) -> None:
    """What an ended operation's error says may become untrue (a rollback that failed, finished
    since by recovery): restated, the state stays and each earlier error is kept, in order. An
    operation still running, or one that ended without an error, has none to restate."""
    op = store.create_operation("mig.apply", request_id=None, request={})
    with pytest.raises(Conflict, match="not ended with an error"):
        store.restate_error(op.id, {"type": "Conflict", "message": "now"})
    store.update_operation(op.id, state="failed", error={"type": "A", "message": "first"})
    store.restate_error(op.id, {"type": "B", "message": "second"})
    third = store.restate_error(op.id, {"type": "C", "message": "third"})
    assert third.state == "failed" and third.error is not None
    assert third.error["message"] == "third"
    assert [e["message"] for e in third.error["history"]] == ["first", "second"]
    assert all("until" in e and "history" not in e for e in third.error["history"])


def test_an_unknown_state_is_rejected(store: StateStore) -> None:
    op = store.create_operation("prewarm", request_id=None, request={})
    with pytest.raises(InvalidSpec, match="pending, running, succeeded, failed, cancelled"):
        store.update_operation(op.id, state="done")


def test_request_cancel_flags_a_running_operation_only(store: StateStore) -> None:
    running = store.create_operation("prewarm", request_id=None, request={})
    store.update_operation(running.id, state="running")
    assert store.request_cancel(running.id).cancel_requested
    finished = store.create_operation("prewarm", request_id=None, request={})
    store.update_operation(finished.id, state="succeeded")
    assert not store.request_cancel(finished.id).cancel_requested


def test_list_filters_by_kind_and_done_newest_first(store: StateStore) -> None:
    a = store.create_operation("prewarm", request_id=None, request={"n": 1})
    b = store.create_operation("mig.apply", request_id=None, request={"n": 2})
    c = store.create_operation("prewarm", request_id=None, request={"n": 3})
    store.update_operation(a.id, state="failed", error={"type": "Busy", "message": "x"})
    assert [op.id for op in store.list_operations()] == [c.id, b.id, a.id]
    assert [op.id for op in store.list_operations(kind="prewarm")] == [c.id, a.id]
    assert [op.id for op in store.list_operations(done=True)] == [a.id]
    assert [op.id for op in store.list_operations(done=False)] == [c.id, b.id]
    assert [op.id for op in store.list_operations(limit=1)] == [c.id]
    with pytest.raises(InvalidSpec):
        store.list_operations(limit=0)


def test_list_resumes_after_a_cursor_and_filters_kinds(store: StateStore) -> None:
    made = [store.create_operation("prewarm", request_id=None, request={"n": n}) for n in range(5)]
    store.create_operation("call:SetSharing", request_id="r", request={})
    newest = list(reversed(made))
    first = store.list_operations(kinds=("prewarm", "mig.apply"), limit=2)
    assert first == newest[:2]
    last = first[-1]
    rest = store.list_operations(kinds=("prewarm",), after=(last.created_at, last.id), limit=10)
    assert rest == newest[2:]
    assert store.list_operations(kinds=()) == []


def test_prune_drops_old_and_surplus_done_operations_never_running_ones(
    db_path: Path,
) -> None:
    clock = FakeClock()
    with StateStore(db_path, clock=clock) as store:
        old = store.create_operation("prewarm", request_id="old", request={})
        store.update_operation(old.id, state="succeeded")
        running = store.create_operation("prewarm", request_id=None, request={})
        store.update_operation(running.id, state="running")
        clock.now += 3600  # an hour later
        recent = []
        for n in range(3):
            op = store.create_operation("prewarm", request_id=f"r{n}", request={})
            recent.append(store.update_operation(op.id, state="failed", error={"type": "X"}))
        call = store.create_operation("call:SetSharing", request_id="k", request={})
        store.update_operation(call.id, state="succeeded", result={"response": ""})

        # Older than 30 minutes: `old`; beyond the newest 2 done per kind: recent[0].
        assert store.prune_operations(max_age_s=1800, keep_per_kind=2) == 2
        left = {op.id for op in store.list_operations(limit=100)}
        assert left == {running.id, recent[1].id, recent[2].id, call.id}
        # The request id of a pruned operation is free again: a retry runs anew.
        again = store.create_operation("prewarm", request_id="old", request={"other": 1})
        assert again.id != old.id
        store.update_operation(running.id, state="cancelled")
        clock.now += 10 * 3600
        assert store.prune_operations(max_age_s=1800, keep_per_kind=1000) == 4
        assert [op.id for op in store.list_operations(limit=100)] == [again.id]


def test_mark_interrupted_fails_what_a_previous_process_left(db_path: Path) -> None:
    with StateStore(db_path) as before:
        pending = before.create_operation("prewarm", request_id=None, request={})
        running = before.create_operation("mig.apply", request_id=None, request={})
        before.update_operation(running.id, state="running")
        finished = before.create_operation("prewarm", request_id=None, request={})
        before.update_operation(finished.id, state="succeeded")
    with StateStore(db_path) as after:
        marked = after.mark_interrupted_operations("agent restarted")
        assert [op.id for op in marked] == [pending.id, running.id]
        for op in marked:
            assert op.state == "failed"
            assert op.error == {"type": INTERRUPTED, "message": "agent restarted"}
        assert after.get_operation(finished.id).state == "succeeded"
        assert after.mark_interrupted_operations("again") == []


# --- journal -------------------------------------------------------------------------------------


def test_journal_round_trip(store: StateStore) -> None:
    first = store.journal_append("mig:GPU-a", {"step": "snapshot", "gis": [[9, 0, 4]]})
    store.journal_append("mig:GPU-b", {"step": "snapshot"})
    second = store.journal_append("mig:GPU-a", {"step": "destroy", "gi": 1})
    assert first < second
    assert store.journal_entries("mig:GPU-a") == [
        (first, {"step": "snapshot", "gis": [[9, 0, 4]]}),
        (second, {"step": "destroy", "gi": 1}),
    ]
    assert store.journal_scopes() == ["mig:GPU-a", "mig:GPU-b"]
    store.journal_clear("mig:GPU-a")
    assert store.journal_entries("mig:GPU-a") == []
    assert store.journal_scopes() == ["mig:GPU-b"]


def test_journal_keep_leaves_what_is_left_in_one_write(store: StateStore) -> None:
    """What is left of a scope's work (a power restore's GPUs that did not answer) replaces the
    scope in one transaction; keeping none empties it; other scopes are untouched."""
    for uuid in ("GPU-a", "GPU-b", "GPU-c"):
        store.journal_append("power:baseline", {"uuid": uuid})
    store.journal_append("power:desired", {"spec": "s"})
    store.journal_keep("power:baseline", [{"uuid": "GPU-b"}, {"uuid": "GPU-c"}])
    assert [e for _, e in store.journal_entries("power:baseline")] == [
        {"uuid": "GPU-b"},
        {"uuid": "GPU-c"},
    ]
    store.journal_keep("power:baseline", [])
    assert store.journal_scopes() == ["power:desired"]


def test_journal_sequence_numbers_are_never_reused(store: StateStore) -> None:
    """Entries written after a clear still sort after every earlier entry."""
    old = store.journal_append("mig:GPU-a", {"n": 1})
    store.journal_clear("mig:GPU-a")
    assert store.journal_append("mig:GPU-a", {"n": 2}) > old


# --- several connections and processes ---------------------------------------------------------


def test_two_stores_on_one_file_see_each_others_commits(db_path: Path) -> None:
    with StateStore(db_path) as one, StateStore(db_path) as two:
        op = one.create_operation("prewarm", request_id="r", request={})
        assert two.get_operation(op.id) == op
        two.journal_append("mig:GPU-a", {"n": 1})
        assert one.journal_scopes() == ["mig:GPU-a"]
        # The unique request id holds across connections too.
        assert two.create_operation("prewarm", request_id="r", request={}) == op


def test_another_process_sees_our_commits_and_we_see_its(db_path: Path) -> None:
    with StateStore(db_path) as store:
        op = store.create_operation("prewarm", request_id=None, request={"x": 1})
        child = run_python(
            f"""
            from pathlib import Path
            from agent.state import StateStore
            with StateStore(Path({str(db_path)!r})) as store:
                print(store.get_operation({op.id!r}).request["x"])
                store.journal_append("from-child", {{"ok": True}})
            """
        )
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == "1"
        assert store.journal_entries("from-child")[0][1] == {"ok": True}


def test_concurrent_writers_in_two_processes_lose_nothing(db_path: Path) -> None:
    """BEGIN IMMEDIATE and busy_timeout queue writers instead of failing them."""
    StateStore(db_path).close()
    writer = f"""
        import sys
        from pathlib import Path
        from agent.state import StateStore
        with StateStore(Path({str(db_path)!r})) as store:
            for n in range(200):
                store.journal_append("w" + sys.argv[1], {{"n": n}})
    """
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(writer), str(i)], env=env)
        for i in range(2)
    ]
    assert [proc.wait(timeout=60) for proc in procs] == [0, 0]
    with StateStore(db_path) as store:
        assert len(store.journal_entries("w0")) == len(store.journal_entries("w1")) == 200


def test_a_process_killed_inside_a_transaction_leaves_only_whole_commits(db_path: Path) -> None:
    """SIGKILL before COMMIT: the committed entry stays, the half-written ones vanish."""
    child = run_python(
        f"""
        import os, signal
        from pathlib import Path
        from agent.state import StateStore
        store = StateStore(Path({str(db_path)!r}))
        store.journal_append("mig:GPU-a", {{"step": "committed"}})
        with store.transaction():
            store.journal_append("mig:GPU-a", {{"step": "uncommitted"}})
            store.create_operation("mig.apply", request_id="lost", request={{}})
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert child.returncode == -9, child.stderr
    with StateStore(db_path) as store:
        with store.transaction() as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert [entry for _, entry in store.journal_entries("mig:GPU-a")] == [{"step": "committed"}]
        assert store.list_operations() == []
        # The dead writer's lock is gone: we can write.
        store.journal_append("mig:GPU-a", {"step": "after"})


def test_each_table_commits_at_its_own_durability(tmp_path: Path) -> None:
    """One store, one connection: operations and the journal commit FULL (fsync: they survive a
    power loss), the prewarm tables NORMAL (agent/state/schema.py says why), each write at its
    rule."""
    from agent.prewarm.index import PrewarmIndex
    from agent.prewarm.model import CacheItem, ItemKind, ItemState

    store = StateStore(tmp_path / "agent.db")
    index = PrewarmIndex(store)
    seen: list[str] = []
    store._conn.set_trace_callback(seen.append)  # what SQLite is asked, in order

    def level_of(statement: str) -> str:
        """The synchronous level in force when ``statement`` ran."""
        at = next(i for i, s in enumerate(seen) if s.startswith(statement))
        pragmas = [s for s in seen[:at] if s.startswith("PRAGMA synchronous")]
        return pragmas[-1].rsplit(" ", 1)[1] if pragmas else "FULL"  # FULL: set at open

    index.insert(CacheItem("i1", ItemKind.FILE, "m", "http://o/m", ItemState.QUEUED, created_at=1))
    store.create_operation("mig.apply", request_id=None, request={})
    store.journal_append("gpu-0", {"step": "begin"})
    assert level_of("INSERT INTO prewarm_items") == "NORMAL"
    assert level_of("INSERT INTO operations") == "FULL"
    assert level_of("INSERT INTO journal") == "FULL"
    assert {t for t, d in TABLE_DURABILITY.items() if d is Durability.NORMAL} == {
        "prewarm_items",
        "prewarm_image_pulls",
    }


def test_a_nested_write_cannot_ask_for_more_durability_than_its_transaction(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path / "agent.db")
    with (
        pytest.raises(RuntimeError, match="FULL write inside a NORMAL transaction"),
        store.transaction(Durability.NORMAL),
    ):
        store.journal_append("gpu-0", {"step": "begin"})
    assert store.journal_entries("gpu-0") == []  # rolled back whole


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_database_its_wal_and_shm_are_root_only_and_so_is_its_directory(
    tmp_path: Path,
) -> None:
    """They hold signed URLs of prewarm requests: 0600 files in a 0700 directory, whatever the
    umask, and files an older agent left 0644 (in a 0755 dir) are fixed on open."""
    state = tmp_path / "state"
    db = state / "agent.db"
    old = os.umask(0o022)
    try:
        with StateStore(db) as store:
            store.create_operation("k", request_id=None, request={"url": "https://x/?sig=s"})
            files = [db, db.with_name("agent.db-wal"), db.with_name("agent.db-shm")]
            assert [_mode(f) for f in files] == [0o600] * 3
        assert _mode(state) == 0o700
        for f in files:
            if f.exists():
                os.chmod(f, 0o644)
        os.chmod(state, 0o755)
        with StateStore(db) as store:
            store.create_operation("k", request_id=None, request={})
            assert [_mode(f) for f in files] == [0o600] * 3
        assert _mode(state) == 0o700
    finally:
        os.umask(old)


def test_a_database_migrated_to_owners_keeps_its_rows_without_an_owner(db_path: Path) -> None:
    """Operations from before owners were recorded stay, owned by no one (schema 3)."""
    with StateStore(db_path) as store:
        op = store.create_operation("prewarm", request_id=None, request={})
        mine = store.create_operation(
            "prewarm", request_id=None, request={}, owner="local", owner_role="admin"
        )
        assert (store.get_operation(mine.id).owner, store.get_operation(mine.id).owner_role) == (
            "local",
            "admin",
        )
        assert store.get_operation(op.id).owner_role is None
        assert store.schema_version == len(MIGRATIONS) >= 3


@pytest.mark.parametrize("planted", ["agent.db", "agent.db-wal"])
def test_a_link_planted_in_the_databases_place_is_refused_and_its_target_untouched(
    tmp_path: Path, planted: str
) -> None:
    """Whoever can write the state dir could point the DB (or its WAL) at a file of theirs for
    the agent, as root, to chmod and write: the open is refused (O_NOFOLLOW)."""
    state = tmp_path / "state"
    state.mkdir()
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not the agent's")
    os.chmod(target, 0o644)
    (state / planted).symlink_to(target)
    with pytest.raises(StateUnavailable) as refused:
        StateStore(state / "agent.db").close()
    # It names the link, not a state dir to make writable (the words of a read-only mount).
    assert f"{state / planted} is a symbolic link" in str(refused.value)
    assert "not writable" not in str(refused.value)
    assert (state / planted).is_symlink()
    assert target.read_bytes() == b"not the agent's"
    assert _mode(target) == 0o644


def test_a_state_dir_behind_links_that_loop_is_named_as_such(tmp_path: Path) -> None:
    """ELOOP is also links on the way that loop: it was said as the DB file being a link
    someone planted."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(StateUnavailable) as refused:
        StateStore(tmp_path / "a" / "state" / "agent.db").close()
    said = str(refused.value)
    assert "a symbolic link on its path loops" in said and "is a symbolic link" not in said


def test_the_wal_is_cut_back_after_a_burst_of_writes(tmp_path: Path) -> None:
    """A MIG apply and a few prewarms left a 4 MB WAL beside an 86 KB database for the
    agent's whole life: SQLite keeps the WAL at its high-water mark unless told a limit."""
    from agent.state.database import Database

    db = Database(tmp_path / "state.db")
    with db.transaction() as conn:
        conn.execute("CREATE TABLE junk (x BLOB)")
    for _ in range(6):  # past the 1,000-page autocheckpoint
        with db.transaction() as conn:
            conn.execute("INSERT INTO junk VALUES (?)", (os.urandom(1024 * 1024),))
        with db.transaction() as conn:
            conn.execute("DELETE FROM junk")
    for _ in range(3):  # a writer after the checkpoint starts the WAL over, cut to the limit
        with db.transaction() as conn:
            conn.execute("INSERT INTO junk VALUES (?)", (b"x",))
    assert (tmp_path / "state.db-wal").stat().st_size <= 1024 * 1024
    db.close()
