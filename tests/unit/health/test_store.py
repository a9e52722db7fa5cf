"""The marks in the state dir (agent/health/store.py): a restart gets them back, and a mark
still being refreshed when saved counts its hold-down from the save, never earlier."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.health.machine import Mark, State
from agent.health.store import MarkStore, Target


def test_marks_survive_a_restart_and_an_ongoing_one_counts_from_the_save(tmp_path: Path) -> None:
    failed = Mark(
        State.FAILED, "GPU lost: GPU is lost", 100.0, "reboot-node", ("ml/a",), 198.0,
        (150.0,), "XID 13", (100.0,), False,
    )  # fmt: skip
    old = Mark(State.FAILED, "XID 48", 10.0, "reset-gpu", (), 10.0)
    marks = {Target("GPU-a"): failed, Target("GPU-a", 3): Mark(since=1.0), Target("GPU-b"): old}
    MarkStore(tmp_path).save(marks, now=200.0)
    loaded = MarkStore(tmp_path).load()
    assert loaded[Target("GPU-a", 3)] == Mark(since=1.0)
    assert loaded[Target("GPU-a")].bad_at == 200.0  # refreshed within SAVE_EVERY_S of the save
    assert loaded[Target("GPU-a")].pods == ("ml/a",) and loaded[Target("GPU-a")].recent == (150.0,)
    assert loaded[Target("GPU-b")] == old  # its last signal is older than the save's period


def test_an_unreadable_file_starts_from_no_marks(tmp_path: Path) -> None:
    (tmp_path / "health-marks.json").write_text("{not json")
    assert MarkStore(tmp_path).load() == {}


def test_the_boot_id_is_saved_beside_the_marks(tmp_path: Path) -> None:
    """So that an agent started after a reboot knows it (a file from before the field, or a
    node whose boot id could not be read, says none: no reboot is assumed)."""
    store = MarkStore(tmp_path)
    store.save({Target("GPU-a"): Mark(since=1.0)}, now=2.0, boot_id="0f3c-boot")
    loaded = MarkStore(tmp_path)
    assert loaded.load() and loaded.saved_boot_id == "0f3c-boot"
    store.save({Target("GPU-a"): Mark(since=1.0)}, now=3.0)
    unknown = MarkStore(tmp_path)
    assert unknown.load() and unknown.saved_boot_id is None


def test_marks_reach_the_disk_before_they_count_as_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file was written and renamed with no fsync: a power cut after the save could leave
    an empty marks file, and the next boot forgot a failed GPU. The file and its directory
    are fsync'd (agent.durable.replace_file), and no temp file is left beside the marks."""
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    MarkStore(tmp_path).save({Target("GPU-a"): Mark(since=1.0)}, now=2.0)
    assert str(tmp_path) in synced, synced  # the rename, in the directory
    assert any(".health-marks.json." in s for s in synced), synced  # the bytes, before it
    assert [p.name for p in tmp_path.iterdir()] == ["health-marks.json"]
