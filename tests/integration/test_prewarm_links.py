"""The cache never follows a link it did not make: whatever can write the cache's host path
plants links (and hard links) where the agent writes, reads or cleans; the file outside stays
as it was, the planted thing goes to quarantine/, and no item is served from it."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from agent.prewarm.model import FileRequest, GroupRequest, ItemState
from tests.integration.prewarm_fixtures import hub
from tests.integration.prewarm_fixtures.agent import make_service
from tests.integration.prewarm_fixtures.origin import Origin

pytestmark = pytest.mark.integration
MIB = 1024 * 1024
SECRET = b"root:$6$not-for-the-cache\n"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the cache that a planted link points at."""
    path = tmp_path / "etc" / "shadow"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    return path


def quarantined(cache: Path) -> list[Path]:
    return sorted((cache / "quarantine").iterdir())


def test_a_partial_linked_outside_is_quarantined_and_the_outside_file_untouched(
    tmp_path: Path, origin: Origin, outside: Path
) -> None:
    data = os.urandom(MIB)
    digest = origin.add("w.bin", data)
    svc = make_service(tmp_path)
    item = svc.submit(FileRequest(origin.url("w.bin"), sha256=digest))
    os.symlink(outside, svc.store.partial_dir / f"{item.id}.part")

    done = svc.run(item.id)

    assert done.state is ItemState.READY, done.error
    assert outside.read_bytes() == SECRET
    (moved,) = quarantined(svc.store.root)
    assert moved.is_symlink() and os.readlink(moved) == str(outside)
    blob = svc.store.blob_path(digest)
    assert stat.S_ISREG(os.lstat(blob).st_mode) and blob.read_bytes() == data


def test_a_partial_hard_linked_to_an_outside_file_is_quarantined(
    tmp_path: Path, origin: Origin, outside: Path
) -> None:
    """A hard link is a regular file, but truncating it would truncate the file outside."""
    digest = origin.add("h.bin", os.urandom(MIB))
    svc = make_service(tmp_path)
    item = svc.submit(FileRequest(origin.url("h.bin"), sha256=digest))
    os.link(outside, svc.store.partial_dir / f"{item.id}.part")

    assert svc.run(item.id).state is ItemState.READY
    assert outside.read_bytes() == SECRET
    assert len(quarantined(svc.store.root)) == 1


def test_a_planted_blob_link_is_not_served_as_a_verified_file(
    tmp_path: Path, origin: Origin, outside: Path
) -> None:
    """A link at blobs/sha256/<digest> to a file with that digest: the agent would have linked
    the name to it without a fetch. It is quarantined and the bytes come from the origin."""
    digest = hashlib.sha256(SECRET).hexdigest()
    origin.add("model.bin", SECRET)
    svc = make_service(tmp_path)
    planted = svc.store.blob_path(digest)
    os.symlink(outside, planted)

    item = svc.submit(FileRequest(origin.url("model.bin"), sha256=digest))
    assert item.state is ItemState.QUEUED  # not a hit on the planted link
    done = svc.run(item.id)

    assert done.state is ItemState.READY, done.error
    assert origin.ranges("model.bin") == [None]  # fetched, not taken from the link
    assert stat.S_ISREG(os.lstat(planted).st_mode)
    assert os.path.realpath(svc.store.name_path(done.name)) == str(planted)
    assert outside.read_bytes() == SECRET
    (moved,) = quarantined(svc.store.root)
    assert os.readlink(moved) == str(outside)


def test_a_ready_items_blob_swapped_for_a_link_is_evicted_on_audit(
    tmp_path: Path, origin: Origin, outside: Path
) -> None:
    digest = origin.add("r.bin", os.urandom(MIB))
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(FileRequest(origin.url("r.bin"), sha256=digest)).id)
    blob = svc.store.blob_path(digest)
    blob.unlink()
    os.symlink(outside, blob)

    (changed,) = svc.audit()

    assert (changed.id, changed.state) == (item.id, ItemState.EVICTED)
    assert outside.read_bytes() == SECRET
    assert not os.path.lexists(blob)
    assert len(quarantined(svc.store.root)) == 1


def test_a_partial_dir_linked_outside_is_not_emptied_at_start(
    tmp_path: Path, outside: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    os.symlink(outside.parent, cache / "partial")

    svc = make_service(tmp_path, cache_dir=cache)
    svc.store.reconcile()

    assert outside.read_bytes() == SECRET
    assert not (cache / "partial").is_symlink() and (cache / "partial").is_dir()
    (moved,) = quarantined(cache)
    assert moved.is_symlink() and os.readlink(moved) == str(outside.parent)


def test_links_planted_among_partials_blobs_and_names_are_quarantined_at_start(
    tmp_path: Path, outside: Path
) -> None:
    svc = make_service(tmp_path)
    store = svc.store
    os.symlink(outside, store.partial_dir / "stale.part")
    os.symlink(outside, store.blob_path("0" * 64))
    (store.name_dir / "plain-file").write_bytes(b"x")
    (store.partial_dir / "a-dir").mkdir()

    store.reconcile()

    assert outside.read_bytes() == SECRET
    assert len(quarantined(store.root)) == 4
    assert list(store.partial_dir.iterdir()) == []
    assert list(store.blob_dir.iterdir()) == [] and list(store.name_dir.iterdir()) == []


def test_a_validators_temp_file_linked_outside_is_not_overwritten(
    tmp_path: Path, origin: Origin, outside: Path
) -> None:
    """The origin's ETag is saved through partial/<id>.json.tmp on the way to <id>.json."""
    digest = origin.add("v.bin", os.urandom(MIB))
    svc = make_service(tmp_path)
    item = svc.submit(FileRequest(origin.url("v.bin"), sha256=digest))
    os.symlink(outside, svc.store.partial_dir / f"{item.id}.json.tmp")

    assert svc.run(item.id).state is ItemState.READY
    assert outside.read_bytes() == SECRET
    (moved,) = quarantined(svc.store.root)
    assert os.readlink(moved) == str(outside)


def test_a_by_name_dir_swapped_for_a_link_is_neither_deleted_nor_written_through(
    tmp_path: Path, origin: Origin, outside: Path
) -> None:
    """by-name/ replaced, while the agent runs, by a link to another directory that holds a
    file of an item's name: deleting or evicting the item does not delete that file, and a
    fetch does not put its link in that directory."""
    digest = origin.add("shadow", os.urandom(MIB))
    svc = make_service(tmp_path)
    request = FileRequest(origin.url("shadow"), sha256=digest, name="shadow")
    item = svc.run(svc.submit(request).id)
    assert item.state is ItemState.READY, item.error
    names = svc.store.name_dir
    names.rename(tmp_path / "by-name-was")
    names.symlink_to(outside.parent)

    svc.delete(item.id)
    assert outside.read_bytes() == SECRET and not outside.is_symlink()
    again = svc.run(svc.submit(request).id)
    assert outside.read_bytes() == SECRET and not outside.is_symlink()
    assert sorted(p.name for p in outside.parent.iterdir()) == ["shadow"]
    svc.evict(again.id)
    assert outside.read_bytes() == SECRET and not outside.is_symlink()


def test_a_trees_dir_swapped_for_a_link_is_neither_emptied_nor_written_through(
    tmp_path: Path, origin: Origin, outside: Path
) -> None:
    """trees/ replaced by a link to a directory holding one named like a model's item: evicting
    the model does not empty it, and laying the model out again does not write there."""
    files = {"config.json": b"{}", "weights.bin": os.urandom(64 * 1024)}
    endpoint, _ = hub.publish(origin, "org/tiny", files)
    svc = make_service(tmp_path)
    model = svc.run(svc.submit(GroupRequest("org/tiny", endpoint=endpoint)).id)
    assert model.state is ItemState.READY, model.error
    trees = svc.store.tree_dir
    trees.rename(tmp_path / "trees-was")
    trees.symlink_to(outside.parent)
    victim = outside.parent / model.id
    victim.mkdir()
    (victim / "keep").write_bytes(SECRET)

    svc.evict(model.id)
    again = svc.run(svc.submit(GroupRequest("org/tiny", endpoint=endpoint)).id)
    assert again.state is ItemState.READY, again.error
    assert (victim / "keep").read_bytes() == SECRET
    assert sorted(p.name for p in outside.parent.iterdir()) == sorted([model.id, "shadow"])
    model_dir = svc.store.name_path(again.name)
    assert (model_dir / "weights.bin").read_bytes() == files["weights.bin"]


def test_a_blob_dir_swapped_for_a_link_is_not_deleted_through(
    tmp_path: Path, origin: Origin, outside: Path
) -> None:
    """blobs/sha256/ replaced by a link to a directory holding a file named like an item's
    blob (another content store, say): evicting the item does not delete that file."""
    data = os.urandom(MIB)
    digest = origin.add("e.bin", data)
    svc = make_service(tmp_path)
    item = svc.run(svc.submit(FileRequest(origin.url("e.bin"), sha256=digest)).id)
    assert item.state is ItemState.READY, item.error
    blobs = svc.store.blob_dir
    blobs.rename(tmp_path / "blobs-was")
    blobs.symlink_to(outside.parent)
    theirs = outside.parent / digest
    theirs.write_bytes(data)

    svc.evict(item.id)
    assert theirs.read_bytes() == data


def test_what_is_quarantined_is_kept_and_never_counted_in_the_budget(
    tmp_path: Path, origin: Origin
) -> None:
    """Quarantine is for a person to inspect: its bytes neither shrink the room for items nor
    get evicted to make room."""
    svc = make_service(tmp_path, budget=2 * MIB)
    stray = os.urandom(3 * MIB)  # more than the whole budget
    (svc.store.blob_dir / ("0" * 64)).write_bytes(stray)  # a blob no index row knows
    svc.store.reconcile()
    (moved,) = quarantined(svc.store.root)
    assert svc.store.usage().used_bytes == 0

    data = os.urandom(MIB + MIB // 2)
    item = svc.submit(FileRequest(origin.url("w.bin"), sha256=origin.add("w.bin", data)))
    done = svc.run(item.id)

    assert done.state is ItemState.READY, done.error
    assert svc.store.usage().used_bytes == len(data)
    assert moved.read_bytes() == stray
