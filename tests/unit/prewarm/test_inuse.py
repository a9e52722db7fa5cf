"""A tenant shapes its processes' /proc files: a maps file of hundreds of megabytes was read
whole (``read_text().splitlines()``) at every in-use scan. It is read a line at a time, stops
once every wanted file is found, and a map too long to read is "not ruled out", never "not in
use". Against a /proc look-alike holding a real file's (device, inode)."""

from __future__ import annotations

import errno
import itertools
import logging
import os
import threading
import time
import tracemalloc
from pathlib import Path
from typing import NoReturn

import pytest

from agent.prewarm import inuse
from agent.prewarm.inuse import (
    MAX_LINE_BYTES,
    MAX_MAPS_LINES,
    Holders,
    ProcScanner,
    ScanLimits,
    file_id,
)
from tests.unit.sharing.pidns_fixtures import POD_NAMESPACE, a_proc, node_proc

MIB = 1024 * 1024


def _line(dev: int, ino: int, path: str = "/usr/lib/libc.so.6") -> str:
    where = f"{os.major(dev):02x}:{os.minor(dev):02x}"
    return f"7f0000000000-7f0000001000 r--p 00000000 {where} {ino} {path}\n"


def _proc(tmp_path: Path, pid: int, maps: list[str], repeat: int = 1) -> Path:
    """The node's /proc/<pid>/{fd,maps}; ``maps`` written ``repeat`` times."""
    proc = node_proc(tmp_path / "proc")
    (proc / str(pid) / "fd").mkdir(parents=True)
    with (proc / str(pid) / "maps").open("w") as f:
        chunk = "".join(maps)
        for _ in range(repeat):
            f.write(chunk)
    return proc


@pytest.fixture
def blob(tmp_path: Path) -> tuple[int, int]:
    path = tmp_path / "blob"
    path.write_bytes(b"weights")
    fid = file_id(path)
    assert fid is not None
    return fid


def test_a_huge_map_is_read_a_line_at_a_time_and_stops_at_the_file(
    tmp_path: Path, blob: tuple[int, int]
) -> None:
    """The blob is mapped on the first line of a 96 MiB map: found, the rest never read."""
    dev, ino = blob
    other = _line(dev, ino + 1)
    proc = _proc(tmp_path, 4242, [_line(dev, ino, "/models/m/model.safetensors")])
    with (proc / "4242" / "maps").open("a") as f:
        f.write(other * (96 * MIB // len(other)))
    tracemalloc.start()
    started = time.monotonic()
    try:
        found = ProcScanner(proc).holders([blob])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found.held == {blob: {4242}} and found.unsure == frozenset()
    assert peak < 4 * MIB, peak  # not the map's 96 MiB, nor its lines
    assert time.monotonic() - started < 1.0


def test_a_map_longer_than_is_read_is_not_ruled_out_and_said(
    tmp_path: Path, blob: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    """The mapping sits past the lines read: unknown is not "not in use"."""
    dev, ino = blob
    proc = _proc(tmp_path, 4242, [_line(dev, ino + 1)], repeat=MAX_MAPS_LINES + 1)
    with (proc / "4242" / "maps").open("a") as f:
        f.write(_line(dev, ino))
    (proc / "7").mkdir()
    (proc / "7" / "maps").write_text(_line(dev, ino + 2))  # another process, read whole
    with caplog.at_level(logging.WARNING, logger="agent.prewarm.inuse"):
        found = ProcScanner(proc).holders([blob])
    assert found.held == {blob: {4242}} and found.unsure == frozenset({4242})
    [said] = [r.getMessage() for r in caplog.records if r.name == "agent.prewarm.inuse"]
    assert "process(es) 4242 are longer than is read" in said


def test_a_line_longer_than_a_page_is_one_line_and_its_path_never_parsed(
    tmp_path: Path, blob: tuple[int, int]
) -> None:
    """A path past PATH_MAX: the rest of its line is skipped, not read as lines of its own
    (where a crafted path could name any file)."""
    dev, ino = blob
    head = _line(dev, ino + 1, "").rstrip("\n")
    # The crafted text starts exactly where the line's third read of MAX_LINE_BYTES would.
    pad = "/" + "x" * (2 * MAX_LINE_BYTES - len(head) - 2) + "/"
    line = head + pad + _line(dev, ino)
    assert line.index("7f", len(head)) == 2 * MAX_LINE_BYTES
    proc = _proc(tmp_path, 4242, [line])
    found = ProcScanner(proc).holders([blob])
    assert found.held == {} and found.unsure == frozenset()


@pytest.mark.parametrize(
    "line",
    [
        "garbage\n",
        "7f-7f r--p 0 zz:01 12 /x\n",
        "7f-7f r--p 0 08:01 " + "9" * 5000 + " /x\n",
        "7f-7f r--p 0 08:01 \u0663 /x\n",
    ],
)
def test_malformed_map_lines_are_skipped(tmp_path: Path, blob: tuple[int, int], line: str) -> None:
    dev, ino = blob
    proc = _proc(tmp_path, 4242, [line, _line(dev, ino)])
    assert ProcScanner(proc).holders([blob]).held == {blob: {4242}}


def _idle_procs(tmp_path: Path, pids: range, fds: int = 0) -> Path:
    """The node's processes, holding no wanted file: ``fds`` descriptors each, on a file of
    their own."""
    proc = node_proc(tmp_path / "proc")
    other = tmp_path / "other"
    other.write_text("x")
    for pid in pids:
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "maps").write_text("")
        for fd in range(fds):
            (proc / str(pid) / "fd" / str(fd)).symlink_to(other)
    return proc


@pytest.mark.parametrize(
    ("limits", "tick", "says"),
    [
        (ScanLimits(pids=3), 0, "more than 3 processes"),
        (ScanLimits(fds=5), 0, "more than 5 open descriptors"),
        (ScanLimits(seconds=15), 10, "longer than 15 s"),
    ],
)
def test_a_scan_cut_by_its_bounds_holds_every_file_never_not_in_use(
    tmp_path: Path,
    blob: tuple[int, int],
    caplog: pytest.LogCaptureFixture,
    limits: ScanLimits,
    tick: int,
    says: str,
) -> None:
    """Every process of the node was read, however many (and with however many descriptors):
    a scan cut by a bound said "nobody holds it" of the processes it never read."""
    proc = _idle_procs(tmp_path, range(100, 106), fds=2)
    ticks = itertools.count(0, tick)  # each look at the clock ``tick`` seconds later
    with caplog.at_level(logging.WARNING, logger="agent.prewarm.inuse"):
        found = ProcScanner(proc, limits, clock=lambda: next(ticks)).holders([blob])
    assert found.held == {blob: set()} and found.cut == says, found
    assert says in caplog.text
    # Within the bounds the same node is read whole: nobody holds the file.
    whole = ProcScanner(proc, ScanLimits(pids=6, fds=12)).holders([blob])
    assert whole.held == {} and whole.cut == ""


def test_a_process_the_bound_cuts_is_still_named_for_what_it_was_seen_holding(
    tmp_path: Path, blob: tuple[int, int]
) -> None:
    """The descriptors ran out inside a process that had been seen holding the blob: the
    blob names it (`cache evict` says whose it is), and the file not found counts as held."""
    path = tmp_path / "blob"
    other = tmp_path / "other-blob"
    other.write_bytes(b"more weights")
    other_id = file_id(other)
    assert other_id is not None
    proc = node_proc(tmp_path / "proc")
    (proc / "100" / "fd").mkdir(parents=True)
    for fd in range(3):
        (proc / "100" / "fd" / str(fd)).symlink_to(path)
    found = ProcScanner(proc, ScanLimits(fds=2)).holders([blob, other_id])
    assert found.held == {blob: {100}, other_id: set()}, found
    assert found.cut == "more than 2 open descriptors"


def test_a_process_list_that_cannot_be_read_rules_out_nobody(
    tmp_path: Path, blob: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A /proc that could not be listed (no permission) was a scan that found nobody: every
    blob "not in use". It is a scan cut before it began."""
    proc = node_proc(tmp_path / "proc")

    def denied(path: object) -> NoReturn:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(inuse.os, "scandir", denied)
    found = ProcScanner(proc).holders([blob])
    assert found.held == {blob: set()}, found
    assert found.cut == f"{proc} could not be listed: Permission denied", found.cut
    # A wrong telemetry.proc_root does not say the agent's namespace either.
    missing = ProcScanner(tmp_path / "no-proc").holders([blob])
    assert missing.held == {blob: set()} and str(tmp_path / "no-proc") in missing.cut


@pytest.mark.parametrize(
    ("ns", "why"),
    [
        (POD_NAMESPACE, "the agent has no hostPID"),
        (None, "the agent's PID namespace could not be read"),  # no link; NSpid: one pid
    ],
)
def test_without_hostpid_no_blob_is_ruled_out(
    tmp_path: Path, blob: tuple[int, int], ns: str | None, why: str
) -> None:
    """A pod without hostPID lists its own processes alone: the scan read them all, found no
    holder, and every blob other pods mapped was "not in use", evicted under them. A scan that
    may not see the node's processes (a namespace /proc does not name may be the pod's) is
    cut, naming why (docs/prewarm.md, "In use is never evicted")."""
    proc = a_proc(_proc(tmp_path, 7, []), ns, nspid="7")  # its own process holds nothing
    found = ProcScanner(proc).holders([blob])
    assert found.held == {blob: set()}, found
    assert found.cut.startswith(why), found.cut
    node = _proc(tmp_path / "node", 7, [])
    assert ProcScanner(node).holders([blob]) == Holders()  # read whole: nobody holds it


def test_a_read_that_blocks_cuts_the_scan_at_its_time_and_holds_off_the_next(
    tmp_path: Path, blob: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget is checked between reads; a stat of a tenant's file on a dead NFS server
    blocks inside one, and the eviction waiting on the scan waited with it, without end.
    Past its time the scan is cut (every blob held), and while it stays blocked the next scan
    is cut at once rather than blocked beside it."""
    proc = _proc(tmp_path, 7, [])
    (proc / "7" / "fd" / "3").symlink_to(tmp_path / "blob")
    release = threading.Event()
    real_stat = os.stat

    def stalled(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if str(path).endswith("/fd/3"):
            release.wait(30)
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(inuse.os, "stat", stalled)
    monkeypatch.setattr(inuse, "_GRACE_S", 0.1)
    scanner = ProcScanner(proc, limits=ScanLimits(seconds=0.2))
    try:
        started = time.monotonic()
        found = scanner.holders([blob])
        assert time.monotonic() - started < 5
        assert found.held == {blob: set()} and "did not end in 0.2 s" in found.cut, found
        again = scanner.holders([blob])
        assert "still blocked" in again.cut and again.held == {blob: set()}
    finally:
        release.set()
    time.sleep(0.3)  # the blocked read returns; the next scan runs whole
    assert scanner.holders([blob]).held == {blob: {7}}
