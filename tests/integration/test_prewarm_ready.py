"""Readiness that is checked, not remembered, for files: against a real origin on loopback, real
reader processes and the real /proc. Images are in test_prewarm_image_ready.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.errors import Busy, Conflict, InvalidSpec
from agent.prewarm import inuse
from agent.prewarm.inuse import MAX_MAPS_LINES
from agent.prewarm.labels import node_labels
from agent.prewarm.model import FileRequest, ImageRequest, ItemState
from agent.prewarm.naming import label_key
from tests.integration.prewarm_fixtures import cli
from tests.integration.prewarm_fixtures.agent import make_service
from tests.integration.prewarm_fixtures.origin import Origin
from tests.unit.sharing.pidns_fixtures import node_proc

pytestmark = pytest.mark.integration
MIB = 1024 * 1024


def blob(n: int, seed: int = 0) -> bytes:
    return (hashlib.sha256(str(seed).encode()).digest() * (n // 32 + 1))[:n]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


# -- a hit verifies what it claims ---------------------------------------------------------------


def test_a_blob_deleted_from_disk_is_not_a_hit_and_its_label_drops(
    tmp_path: Path, origin: Origin
) -> None:
    origin.add("m.bin", blob(MIB))
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(FileRequest(origin.url("m.bin"), name="m")).id)
    assert label_key("m") in node_labels(svc.items())
    assert item.sha256 is not None
    svc.store.blob_path(item.sha256).chmod(0o644)
    svc.store.blob_path(item.sha256).unlink()

    again = svc.submit(FileRequest(origin.url("m.bin"), name="m"))
    assert again.state is ItemState.QUEUED  # a miss, not a hit
    assert label_key("m") not in node_labels(svc.items())
    done = svc.run(again.id)
    assert done.state is ItemState.READY, done.error
    assert svc.store.blob_path(item.sha256).exists()
    assert len(origin.ranges("m.bin")) == 2


def test_a_blob_of_the_wrong_size_is_fetched_again(tmp_path: Path, origin: Origin) -> None:
    origin.add("s.bin", blob(MIB, 1))
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(FileRequest(origin.url("s.bin"))).id)
    assert item.sha256 is not None
    path = svc.store.blob_path(item.sha256)
    path.chmod(0o644)
    with path.open("r+b") as f:
        f.truncate(1000)
    again = svc.submit(FileRequest(origin.url("s.bin")))
    assert again.state is ItemState.QUEUED
    assert svc.run(again.id).state is ItemState.READY
    assert path.stat().st_size == MIB


def test_sha256_on_a_ready_item_without_one_is_verified(tmp_path: Path, origin: Origin) -> None:
    """The right digest is a hit and is recorded; a different one is refused, nothing changes."""
    digest = origin.add("d.bin", blob(MIB, 2))
    svc = make_service(tmp_path)
    svc.run(svc.submit(FileRequest(origin.url("d.bin"), name="d")).id)

    wrong = "0" * 64
    with pytest.raises(Conflict, match="sha256"):
        svc.submit(FileRequest(origin.url("d.bin"), name="d", sha256=wrong))
    item = svc.get("d")
    assert (item.state, item.expected_sha256, item.hits) == (ItemState.READY, None, 0)

    hit = svc.submit(FileRequest(origin.url("d.bin"), name="d", sha256=digest))
    assert (hit.state, hit.hits, hit.expected_sha256) == (ItemState.READY, 1, digest)


def test_a_request_with_a_digest_rehashes_the_blob(tmp_path: Path, origin: Origin) -> None:
    """Bytes changed on disk under the same size: only a digest request can tell, and does."""
    digest = origin.add("c.bin", blob(MIB, 3))
    svc = make_service(tmp_path)
    svc.run(svc.submit(FileRequest(origin.url("c.bin"), name="c")).id)
    path = svc.store.blob_path(digest)
    path.chmod(0o644)
    with path.open("r+b") as f:
        f.write(b"corrupt!")
    assert svc.submit(FileRequest(origin.url("c.bin"), name="c")).state is ItemState.READY
    again = svc.submit(FileRequest(origin.url("c.bin"), name="c", sha256=digest))
    assert again.state is ItemState.QUEUED
    done = svc.run(again.id)
    assert done.state is ItemState.READY, done.error
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_audit_evicts_a_file_whose_blob_is_gone(tmp_path: Path, origin: Origin) -> None:
    origin.add("a.bin", blob(MIB, 4))
    origin.add("b.bin", blob(MIB, 5))
    svc = make_service(tmp_path)
    a = svc.run(svc.submit(FileRequest(origin.url("a.bin"), name="a")).id)
    svc.run(svc.submit(FileRequest(origin.url("b.bin"), name="b")).id)
    assert a.sha256 is not None
    svc.store.blob_path(a.sha256).unlink()
    svc.store.name_path("b").unlink()  # a lost link alone is only re-made

    changed = svc.audit()
    assert [i.name for i in changed] == ["a"]
    assert svc.get("a").state is ItemState.EVICTED and "missing" in (svc.get("a").error or "")
    assert set(node_labels(svc.items())) == {label_key("b")}
    assert svc.store.name_path("b").resolve().exists()
    assert not svc.store.name_path("a").exists()


# -- in use is never evicted ---------------------------------------------------------------------

_READER = """
import mmap, sys
f = open(sys.argv[1], "rb")
if sys.argv[2] == "mmap":
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    f.close()  # only the mapping holds it, as a safetensors loader does
print("ready", flush=True)
sys.stdin.read()
"""


def _reader(path: Path, how: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _READER, str(path), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


@pytest.mark.parametrize("how", ["open", "mmap"])
def test_a_file_a_process_holds_is_not_evicted(tmp_path: Path, origin: Origin, how: str) -> None:
    origin.add("held.bin", blob(MIB, 6))
    svc = make_service(tmp_path)
    svc.run(svc.submit(FileRequest(origin.url("held.bin"), name="held")).id)
    reader = _reader(svc.store.name_path("held"), how)
    try:
        with pytest.raises(Busy, match=str(reader.pid)):
            svc.evict("held")
        assert svc.get("held").state is ItemState.READY
        assert svc.store.name_path("held").resolve().exists()
    finally:
        reader.communicate("")
    assert svc.evict("held").state is ItemState.EVICTED


def test_a_blob_a_process_may_map_past_what_is_read_is_not_evicted_and_it_is_said(
    tmp_path: Path, origin: Origin
) -> None:
    """A tenant's process with a memory map longer than the agent reads (its maps file can be
    made ~500 MB; it was read whole) is not known not to map the blob: the eviction is refused
    saying the process is not ruled out, and the budget does not pick the blob."""
    origin.add("held.bin", blob(MIB, 10))
    origin.add("new.bin", blob(MIB, 11))
    proc = node_proc(tmp_path / "proc")
    svc = make_service(tmp_path, budget=MIB + MIB // 2, proc_root=proc)
    svc.run(svc.submit(FileRequest(origin.url("held.bin"), name="held")).id)
    (proc / "4242" / "fd").mkdir(parents=True)
    line = "7f0000000000-7f0000001000 r--p 00000000 00:01 1 /usr/lib/libc.so.6\n"
    (proc / "4242" / "maps").write_text(line * (MAX_MAPS_LINES + 1))
    with pytest.raises(Busy, match=r"not ruled out for process\(es\) 4242") as busy:
        svc.evict("held")
    assert busy.value.blockers == ("4242",)
    new = svc.run(svc.submit(FileRequest(origin.url("new.bin"), name="new")).id)
    assert new.state is ItemState.FAILED and "evict" in (new.error or ""), new.error
    assert svc.get("held").state is ItemState.READY
    (proc / "4242" / "maps").write_text(line)  # read whole: the blob is not in it
    assert svc.evict("held").state is ItemState.EVICTED


def test_budget_eviction_skips_a_held_blob(tmp_path: Path, origin: Origin) -> None:
    """LRU would pick the held file; it is skipped, and with nothing else to evict the new item
    is refused rather than the reader's file deleted."""
    origin.add("old.bin", blob(2 * MIB, 7))
    origin.add("new.bin", blob(2 * MIB, 8))
    svc = make_service(tmp_path, budget=3 * MIB)
    svc.run(svc.submit(FileRequest(origin.url("old.bin"), name="old")).id)
    reader = _reader(svc.store.name_path("old"), "mmap")
    try:
        new = svc.run(svc.submit(FileRequest(origin.url("new.bin"), name="new")).id)
        assert new.state is ItemState.FAILED and "evict" in (new.error or "")
        assert svc.get("old").state is ItemState.READY
    finally:
        reader.communicate("")
    new = svc.run(svc.submit(FileRequest(origin.url("new.bin"), name="new")).id)
    assert new.state is ItemState.READY, new.error
    assert svc.get("old").state is ItemState.EVICTED


# -- resumable always ----------------------------------------------------------------------------


def test_retries_exhausted_keep_the_partial_and_the_agent_retries(
    tmp_path: Path, origin: Origin
) -> None:
    digest = origin.add("big.bin", blob(4 * MIB, 9))
    origin.faults.drop_after["/big.bin"] = 3 * MIB // 2
    clock, mono = Clock(), Clock()
    svc = make_service(tmp_path, retries=0, clock=clock, monotonic=mono)
    item = svc.run(svc.submit(FileRequest(origin.url("big.bin"), name="big", sha256=digest)).id)
    assert item.state is ItemState.FAILED
    assert item.retry_at == clock.now + 30 and item.attempts == 1
    assert (svc.store.partial_dir / f"{item.id}.part").stat().st_size == 3 * MIB // 2
    svc.store.reconcile()  # an agent restart keeps it too
    assert (svc.store.partial_dir / f"{item.id}.part").exists()

    svc.start()
    try:
        svc.schedule_pending()
        assert svc.get("big").state is ItemState.FAILED  # not due yet
        clock.now += 30
        mono.now += 30
        svc.schedule_pending()
        done = svc.wait(item.id, timeout=30)
    finally:
        svc.stop()
    assert done.state is ItemState.READY, done.error
    assert origin.ranges("big.bin")[-1] == f"bytes={3 * MIB // 2}-"
    assert done.retry_at is None and done.attempts == 0


def test_a_failed_items_error_names_when_its_retry_is_due_not_a_delay_that_goes_stale(
    tmp_path: Path, origin: Origin
) -> None:
    """A failed item's error said "(retrying in 30s, N bytes kept)", written once: `prewarm
    list` ten minutes later still said "in 30s" (an hour's back-off "in 3600s" for the whole
    hour), and with no agent running, long after the retry was due. It names the UTC time the
    retry is due, as `retry_at` holds it."""
    origin.add("big.bin", blob(2 * MIB, 15))
    origin.faults.drop_after["/big.bin"] = MIB
    clock = Clock()
    svc = make_service(tmp_path, retries=0, clock=clock)
    item = svc.run(svc.submit(FileRequest(origin.url("big.bin"), name="big")).id)
    assert item.state is ItemState.FAILED and item.retry_at == clock.now + 30
    due = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock.now + 30))
    assert (item.error or "").endswith(f"(retry due at {due}, {MIB} bytes kept)"), item.error
    assert "retrying in" not in (item.error or "")


def test_a_failed_item_waiting_for_its_retry_can_be_cancelled(
    tmp_path: Path, origin: Origin
) -> None:
    """Cancel said "big is failed; only queued or fetching items cancel" while the agent went on
    retrying it: the only way to stop the retries was to delete the item."""
    origin.add("big.bin", blob(4 * MIB, 9))
    origin.faults.drop_after["/big.bin"] = MIB
    clock, mono = Clock(), Clock()
    svc = make_service(tmp_path, retries=0, clock=clock, monotonic=mono)
    item = svc.run(svc.submit(FileRequest(origin.url("big.bin"), name="big")).id)
    assert item.state is ItemState.FAILED and item.retry_at is not None
    cancelled = svc.cancel("big")
    assert (cancelled.state, cancelled.error, cancelled.retry_at) == (
        ItemState.FAILED,
        "cancelled",
        None,
    )
    assert list(svc.store.partial_dir.iterdir()) == []
    clock.now += 3600
    mono.now += 3600
    svc.retry_due()
    assert svc.get("big").state is ItemState.FAILED  # not retried
    with pytest.raises(Conflict):  # a failure with no retry has nothing to cancel
        svc.cancel("big")


def test_a_cancelled_item_shows_no_fetched_bytes_once_its_partial_is_dropped(
    tmp_path: Path, origin: Origin
) -> None:
    """A cancel drops the partial, but the row (prewarm list -o json, the API) went on saying
    the bytes fetched before it, as if they were kept for a resume."""
    origin.add("big.bin", blob(4 * MIB, 9))
    origin.faults.drop_after["/big.bin"] = MIB
    svc = make_service(tmp_path, retries=0)
    waiting = svc.run(svc.submit(FileRequest(origin.url("big.bin"), name="big")).id)
    assert waiting.retry_at is not None and waiting.fetched_bytes == MIB
    assert svc.cancel("big").fetched_bytes == 0
    assert svc.get("big").fetched_bytes == 0
    assert list(svc.store.partial_dir.iterdir()) == []


def test_a_running_fetch_cancelled_on_its_last_attempt_stays_cancelled(
    tmp_path: Path, origin: Origin
) -> None:
    """The cancel shuts the socket; on the fetch's last attempt that end was taken for the
    origin's: the item became "failed … (retrying in 30s, N bytes kept)" and was retried."""
    origin.add("slow.bin", blob(4 * MIB, 10))
    origin.faults.rate_bps["/slow.bin"] = 512 * 1024
    svc = make_service(tmp_path, retries=0)
    slow = svc.submit(FileRequest(origin.url("slow.bin"), name="slow"))
    worker = threading.Thread(target=svc.run, args=(slow.id,))
    worker.start()
    deadline = time.monotonic() + 30
    while svc.get("slow").fetched_bytes == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert svc.get("slow").fetched_bytes > 0
    svc.cancel("slow")
    worker.join(30)
    done = svc.get("slow")
    assert (done.state, done.error, done.retry_at) == (ItemState.FAILED, "cancelled", None)
    assert done.fetched_bytes == 0
    assert list(svc.store.partial_dir.iterdir()) == []


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
def test_a_clock_step_neither_hastens_nor_delays_a_retry_or_skews_time_to_warm(
    tmp_path: Path, origin: Origin, step_s: float
) -> None:
    """Retries wait on the monotonic clock: the wall clock stepped an hour either way, a 30 s
    retry still runs 30 s later, and the time-to-warm is the 30 s it took, not 30 s +- 1 h."""
    origin.add("step.bin", blob(MIB, 12))
    origin.faults.drop_after["/step.bin"] = 1000
    clock, mono = Clock(), Clock()
    svc = make_service(tmp_path, retries=0, clock=clock, monotonic=mono)
    item = svc.run(svc.submit(FileRequest(origin.url("step.bin"), name="step")).id)
    assert item.state is ItemState.FAILED and item.retry_at == clock.now + 30
    clock.now += step_s
    svc.start()
    try:
        mono.now += 29
        clock.now += 29
        svc.schedule_pending()
        assert svc.get("step").state is ItemState.FAILED  # not due yet
        mono.now += 1
        clock.now += 1
        svc.schedule_pending()
        done = svc.wait(item.id, timeout=30)
    finally:
        svc.stop()
    assert done.state is ItemState.READY, done.error
    assert done.warm_seconds == 30


def test_a_retry_saved_before_the_clock_stepped_back_runs_on_time_after_a_restart(
    tmp_path: Path, origin: Origin
) -> None:
    """The retry time survives a restart on the wall clock; stepped back an hour while the agent
    was down, it still runs within the 30 s it was given, not an hour late."""
    origin.add("back.bin", blob(MIB, 13))
    origin.faults.drop_after["/back.bin"] = 1000
    clock = Clock()
    first = make_service(tmp_path, retries=0, clock=clock, monotonic=Clock())
    item = first.run(first.submit(FileRequest(origin.url("back.bin"), name="back")).id)
    assert item.state is ItemState.FAILED and item.retry_at == clock.now + 30
    first.index.close()
    clock.now -= 3600
    mono = Clock()
    second = make_service(tmp_path, retries=0, clock=clock, monotonic=mono)
    second.start()
    try:
        assert second.get("back").state is ItemState.FAILED  # start() saw it: not due yet
        mono.now += 30
        clock.now += 30
        second.retry_due()
        done = second.wait(item.id, timeout=30)
    finally:
        second.stop()
    assert done.state is ItemState.READY, done.error
    # How long the first run took before the step cannot be told; it is never negative.
    assert done.warm_seconds is not None and 0 <= done.warm_seconds < 1


def test_a_prewarm_whose_state_dir_fills_says_why_and_finishes_when_space_returns(
    tmp_path: Path, origin: Origin
) -> None:
    """The state dir (a real 1 MiB tmpfs) fills while a file is fetched: the item shows failed,
    naming the full state dir, not `fetching` for ever; with space again the agent's retry timer
    runs it to ready."""
    import contextlib

    from agent.errors import StateUnavailable
    from tests.unit.test_state_disk import _tmpfs

    digest = origin.add("full.bin", blob(MIB, 14))
    with _tmpfs(tmp_path / "state", "1m") as state:
        svc = make_service(tmp_path)
        try:
            item = svc.submit(FileRequest(origin.url("full.bin"), name="full", sha256=digest))
            with (state / "filler").open("wb") as filler, contextlib.suppress(OSError):
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
            with pytest.raises(StateUnavailable):  # until the WAL has no room left either
                for n in range(1000):
                    svc.index.update(item.id, options={"pad": str(n) * 2000})
            failed = svc.run(item.id)
            assert failed.state is ItemState.FAILED
            assert f"the state dir {state} is full" in (failed.error or "")
            assert svc.get("full").error == failed.error  # what a reader sees too
            (state / "filler").unlink()
            svc.start()
            svc.retry_due()
            done = svc.wait(item.id, timeout=30)
            assert done.state is ItemState.READY and done.error is None, done.error
            assert done.sha256 == digest
        finally:
            svc.stop()
            svc.index.close()


def test_retry_delay_doubles_up_to_the_cap(tmp_path: Path, origin: Origin) -> None:
    origin.add("flaky.bin", blob(MIB, 10))
    clock = Clock()
    svc = make_service(tmp_path, retries=0, clock=clock)
    svc.retries.max_s = 100.0
    item = svc.submit(FileRequest(origin.url("flaky.bin"), name="flaky"))
    delays = []
    for _ in range(4):
        origin.faults.drop_after["/flaky.bin"] = 1000
        svc.index.update(item.id, state=ItemState.QUEUED)
        failed = svc.run(item.id)
        assert failed.retry_at is not None
        delays.append(failed.retry_at - clock.now)
    assert delays == [30, 60, 100, 100]


def test_a_permanent_failure_is_not_retried(tmp_path: Path, origin: Origin) -> None:
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(FileRequest(origin.url("absent.bin"), name="absent")).id)
    assert item.state is ItemState.FAILED and "404" in (item.error or "")
    assert item.retry_at is None


def test_prewarm_delete_removes_an_item(tmp_path: Path, origin: Origin) -> None:
    origin.add("r.bin", blob(MIB, 11))
    svc = make_service(tmp_path)
    failed = svc.run(svc.submit(FileRequest(origin.url("gone.bin"), name="gone")).id)
    ready = svc.run(svc.submit(FileRequest(origin.url("r.bin"), name="r")).id)
    assert svc.delete("gone").id == failed.id
    assert svc.delete("r").id == ready.id
    assert svc.items() == []
    assert ready.sha256 is not None and not svc.store.blob_path(ready.sha256).exists()
    assert not svc.store.name_path("r").exists()


def test_prewarm_delete_of_one_name_keeps_another_item_on_the_same_blob(
    tmp_path: Path, origin: Origin
) -> None:
    """Two items, two URLs, the same bytes: one blob. `prewarm delete a` evicted the blob and
    with it `b`, another item nobody asked to remove (its label and by-name link gone, a
    pod's affinity broken), while its reply showed only `a`. Deleting `a` now removes `a`
    alone; `b` stays ready on the blob, and deleting `b` then frees it."""
    data = blob(MIB, 14)
    origin.add("a.bin", data)
    origin.add("b.bin", data)
    svc = make_service(tmp_path)
    a = svc.run(svc.submit(FileRequest(origin.url("a.bin"), name="a")).id)
    b = svc.run(svc.submit(FileRequest(origin.url("b.bin"), name="b")).id)
    assert a.sha256 == b.sha256 is not None
    svc.delete("a")
    assert [(i.name, i.state) for i in svc.items()] == [("b", ItemState.READY)]
    assert svc.store.blob_path(b.sha256).exists() and svc.store.name_path("b").exists()
    assert not svc.store.name_path("a").exists()
    assert label_key("b") in node_labels(svc.items())
    assert svc.submit(FileRequest(origin.url("b.bin"), name="b")).hits == 1  # still a hit
    svc.delete("b")
    assert svc.items() == [] and not svc.store.blob_path(b.sha256).exists()


def test_prewarm_delete_refuses_a_pinned_item(tmp_path: Path, origin: Origin) -> None:
    origin.add("p.bin", blob(MIB, 12))
    svc = make_service(tmp_path)
    svc.run(svc.submit(FileRequest(origin.url("p.bin"), name="p", pin=True)).id)
    with pytest.raises(Conflict, match="pinned"):
        svc.delete("p")
    assert svc.get("p").state is ItemState.READY


# -- source identity without signatures ---------------------------------------------------------


def test_a_new_signature_resumes_the_same_item(tmp_path: Path, origin: Origin) -> None:
    """A killed download whose signature expired: the re-signed URL takes over its partial."""
    digest = origin.add("signed.bin", blob(4 * MIB, 13))
    origin.faults.drop_after["/signed.bin"] = MIB
    svc = make_service(tmp_path, retries=0)
    first = origin.url("signed.bin") + "?X-Amz-Signature=aaa&X-Amz-Date=1&v=2"
    item = svc.run(svc.submit(FileRequest(first, name="signed", sha256=digest)).id)
    assert item.state is ItemState.FAILED

    second = origin.url("signed.bin") + "?X-Amz-Signature=bbb&X-Amz-Date=2&v=2"
    again = svc.submit(FileRequest(second, name="signed", sha256=digest))
    assert again.id == item.id and again.source == second
    done = svc.run(again.id)
    assert done.state is ItemState.READY, done.error
    last = origin.requests[-1]
    assert (last.path, last.headers["Range"]) == (
        "/signed.bin?X-Amz-Signature=bbb&X-Amz-Date=2&v=2",
        f"bytes={MIB}-",
    )
    hit = svc.submit(
        FileRequest(origin.url("signed.bin") + "?v=2&X-Amz-Signature=c", name="signed")
    )
    assert (hit.id, hit.state, hit.hits) == (item.id, ItemState.READY, 1)


def test_other_query_parameters_still_make_another_source(tmp_path: Path, origin: Origin) -> None:
    origin.add("v.bin", blob(MIB, 14))
    svc = make_service(tmp_path)
    svc.submit(FileRequest(origin.url("v.bin") + "?version=1", name="v"))
    with pytest.raises(Conflict, match="another source"):
        svc.submit(FileRequest(origin.url("v.bin") + "?version=2", name="v"))


def test_a_fragment_is_not_part_of_a_sources_identity(tmp_path: Path, origin: Origin) -> None:
    """A URL's fragment (`#...`) never reaches the origin: `w.bin#part1` fetches the bytes
    `w.bin` does. Without a query the fragment was kept in the identity, so asking for
    `w.bin#x` under the ready item's name was refused as "another source" (and `fleet prewarm
    --dry-run`, which compares URLs without their fragment, said `unchanged`); with a query
    it was dropped. It is dropped always: the same item, a hit."""
    origin.add("w.bin", blob(MIB, 16))
    svc = make_service(tmp_path)
    svc.run(svc.submit(FileRequest(origin.url("w.bin"), name="w")).id)
    again = svc.submit(FileRequest(origin.url("w.bin") + "#part1", name="w"))
    assert (again.state, again.hits) == (ItemState.READY, 1)
    assert len(origin.requests) == 1


# -- atomic manifests and names ------------------------------------------------------------------


def test_a_refused_manifest_queues_nothing(tmp_path: Path, origin: Origin) -> None:
    svc = make_service(tmp_path)
    svc.submit(FileRequest(origin.url("taken.bin"), name="taken"))
    before = svc.items()
    with pytest.raises(Conflict, match=r"^items\[1\]: a cache item named 'taken' already"):
        svc.submit_all(
            [
                FileRequest(origin.url("one.bin"), name="one"),
                FileRequest(origin.url("other.bin"), name="taken"),
            ]
        )
    with pytest.raises(InvalidSpec) as refused:
        svc.submit_all(
            [FileRequest(origin.url("x/one.bin")), ImageRequest("r.example/one", name="one.bin")]
        )
    assert [v.field for v in refused.value.violations] == ["items[1].name"]
    assert svc.items() == before


def test_every_refused_item_of_a_manifest_is_named_under_its_index(
    tmp_path: Path, origin: Origin
) -> None:
    """A manifest's refused URLs said only ``url: scheme ... is not allowed``: not which item,
    and only the first of several."""
    svc = make_service(tmp_path)
    with pytest.raises(InvalidSpec) as refused:
        svc.submit_all(
            [
                FileRequest("ftp://origin.example/a.bin"),
                FileRequest(origin.url("fine.bin")),
                FileRequest("file:///etc/shadow"),
            ]
        )
    assert [v.field for v in refused.value.violations] == ["items[0].url", "items[2].url"]
    assert str(refused.value).startswith("2 of 3 items refused; items[0]: url: scheme 'ftp'")
    assert svc.items() == []
    with pytest.raises(InvalidSpec) as alone:
        svc.submit(FileRequest("ftp://origin.example/a.bin"))
    assert [v.field for v in alone.value.violations] == ["url"]


def test_default_names_of_two_sources_do_not_collide(tmp_path: Path, origin: Origin) -> None:
    svc = make_service(tmp_path)
    a = svc.submit(FileRequest(origin.url("org-a/llama/model.safetensors")))
    b = svc.submit(FileRequest(origin.url("org-b/llama/model.safetensors")))
    assert a.name == "model.safetensors"
    assert b.name.startswith("model.safetensors-") and b.name != a.name
    assert svc.submit(FileRequest(origin.url("org-b/llama/model.safetensors"))).id == b.id
    assert len(svc.items()) == 2


def test_cli_prewarm_delete_removes_a_failed_item(tmp_path: Path, origin: Origin) -> None:
    """A download that failed exits 13 (`FetchFailed`, docs/api.md), its own code: it was 10,
    the code of a state dir that takes no writes."""
    env = cli.agent_env(tmp_path)
    failed = cli.run(["prewarm", "file", origin.url("nothing.bin"), "--name", "nothing"], env)
    assert failed.returncode == 13 and "404" in failed.stderr
    deleted = cli.run(["prewarm", "delete", "nothing", "-o", "json"], env)
    assert deleted.returncode == 0, deleted.stderr
    (record,) = json.loads(deleted.stdout)
    assert (record["name"], record["state"], record["deleted"]) == ("nothing", "failed", True)
    listed = cli.run(["prewarm", "list", "-o", "json"], env)
    assert json.loads(listed.stdout) == []
    again = cli.run(["prewarm", "delete", "nothing"], env)
    assert again.returncode != 0 and "nothing" in again.stderr


def test_cli_prewarm_delete_says_the_item_was_deleted_not_ready(
    tmp_path: Path, origin: Origin
) -> None:
    """The reply is the item as it was removed: the table showed a deleted item as a `ready`
    row, the same row `prewarm list` shows for one that is there. It says what was deleted."""
    env = cli.agent_env(tmp_path)
    origin.add("kept.bin", blob(MIB, 21))
    warmed = cli.run(["prewarm", "file", origin.url("kept.bin"), "--name", "kept"], env)
    assert warmed.returncode == 0, warmed.stderr
    deleted = cli.run(["prewarm", "delete", "kept"], env)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.startswith("deleted kept (file "), deleted.stdout
    assert "it was ready" in deleted.stdout, deleted.stdout


def test_the_running_agent_audits_and_retries_on_its_own(tmp_path: Path, origin: Origin) -> None:
    """The whole agent: its audit loop (prewarm.audit_interval_s) notices a deleted blob, and
    its queue loop retries a transiently failed file from its partial once it is due."""
    from tests.unit.api.support import InProcessAgent, agent_config, wait_for

    digest = origin.add("kept.bin", blob(MIB, 15))
    origin.add("flaky.bin", blob(2 * MIB, 16))
    prewarm = {
        "cache_dir": str(tmp_path / "cache"),
        "allowed_hosts": ["127.0.0.1"],
        "egress_allow": ["127.0.0.0/8"],
        "allow_http": True,
        "containerd_socket": str(tmp_path / "containerd.sock"),
        "audit_interval_s": 1.0,
        "retry_initial_s": 0.5,
    }
    with InProcessAgent(tmp_path, agent_config(tmp_path, prewarm=prewarm)) as running:
        svc = running.node.services.prewarm
        kept = svc.run(svc.submit(FileRequest(origin.url("kept.bin"), name="kept")).id)
        assert kept.state is ItemState.READY
        svc.store.blob_path(digest).unlink()
        # The store marks the blob's items evicted first, the audit then records why: wait for
        # the verdict, not the first of its two writes.
        gone = wait_for(
            lambda: (item := svc.get("kept")).state is ItemState.EVICTED and item.error and item,
            "the audit",
        )
        assert "missing" in (gone.error or "")

        svc._fetcher._retries = 0  # one drop exhausts the fetcher's own retries
        origin.faults.drop_after["/flaky.bin"] = MIB
        failed = svc.run(svc.submit(FileRequest(origin.url("flaky.bin"), name="flaky")).id)
        assert failed.state is ItemState.FAILED and failed.retry_at is not None
        done = wait_for(
            lambda: svc.get("flaky").state is ItemState.READY and svc.get("flaky"),
            "the agent's retry",
        )
    assert done.attempts == 0
    assert origin.ranges("flaky.bin")[-1] == f"bytes={MIB}-"


def test_a_blob_is_not_evicted_when_the_scan_of_the_nodes_processes_is_cut(
    tmp_path: Path, origin: Origin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan read every process with no bound in all: one cut by its bound (here, more
    processes than it reads) has not ruled out the rest, so nothing is evicted and it is said."""
    origin.add("held.bin", blob(MIB, 12))
    origin.add("new.bin", blob(MIB, 13))
    proc = node_proc(tmp_path / "proc")
    svc = make_service(tmp_path, budget=MIB + MIB // 2, proc_root=proc)
    svc.run(svc.submit(FileRequest(origin.url("held.bin"), name="held")).id)
    for pid in (7, 8, 9):
        (proc / str(pid) / "fd").mkdir(parents=True)
    monkeypatch.setattr(inuse, "LIMITS", inuse.ScanLimits(pids=2))
    with pytest.raises(Busy, match=r"its scan stopped \(more than 2 processes\)"):
        svc.evict("held")
    new = svc.run(svc.submit(FileRequest(origin.url("new.bin"), name="new")).id)
    assert new.state is ItemState.FAILED and "evict" in (new.error or ""), new.error
    # The refusal names the cause to fix: the scan, not items to unpin.
    assert "the in-use scan stopped (more than 2 processes)" in (new.error or ""), new.error
    assert svc.get("held").state is ItemState.READY
    monkeypatch.setattr(inuse, "LIMITS", inuse.ScanLimits(pids=3))  # read whole: nobody holds it
    assert svc.evict("held").state is ItemState.EVICTED
