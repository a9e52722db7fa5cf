"""A prewarm source kind is one module behind one interface (agent/prewarm/source.py),
registered in one place (agent/prewarm/kinds.py): the kind below exists only in this test,
and it warms, hits, labels, audits and evicts through the real service, store and index
without a line of product code knowing it (docs/architecture.md, "Add a prewarm kind")."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.errors import FieldViolation, InvalidSpec, NotSupported
from agent.prewarm import kinds
from agent.prewarm.labels import node_labels
from agent.prewarm.manifest import parse_manifest
from agent.prewarm.model import CacheItem, ItemState
from agent.prewarm.partial import Partial
from agent.prewarm.service import PrewarmService
from agent.prewarm.source import Failed, Outcome, Ready, Source, SourceRequest, Target, Work
from agent.prewarm.target import TargetSchema, arg
from agent.wire.prewarm import cache_item_pb
from tests.integration.prewarm_fixtures.agent import make_service

pytestmark = pytest.mark.integration


@dataclass(frozen=True, slots=True)
class DirRequest:
    """Warm one file of a local directory the operator exported (the test's own kind)."""

    path: str = arg(source=True)
    name: str | None = arg("Item name.", default=None)
    pin: bool = arg("Never evict it.", default=False)


class DirSource(Source):
    kind = "dir"
    request_type = DirRequest
    schema = TargetSchema("dir", DirRequest, "Warm PATH of the exported directory.")

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.runs = 0

    def validate(self, request: SourceRequest, work: Work) -> None:
        assert isinstance(request, DirRequest)
        if not Path(request.path).resolve().is_relative_to(self.root):
            raise InvalidSpec(
                f"path {request.path} is outside {self.root}",
                [FieldViolation("path", f"a file under {self.root}")],
            )

    def target(self, request: SourceRequest, work: Work) -> Target:
        assert isinstance(request, DirRequest)
        path = str(Path(request.path).resolve())
        return Target(source=f"dir://{path}", identity=path, pretty=Path(path).name)

    def identity(self, item: CacheItem, work: Work) -> str:
        return item.source.removeprefix("dir://")

    def run(self, item: CacheItem, event: threading.Event, work: Work) -> Outcome:
        self.runs += 1
        partial: Partial = work.store.partial(item.id)
        try:
            data = Path(self.identity(item, work)).read_bytes()
            partial.admit(len(data))
            partial.write(data)
            digest = work.store.commit(item, partial)
        except OSError as exc:
            partial.close()
            return Failed(f"cannot read {item.source}: {exc.strerror}")
        return Ready(len(data), {}, sha256=digest, fetched_bytes=len(data))


@pytest.fixture
def exported(tmp_path: Path) -> Iterator[tuple[DirSource, PrewarmService]]:
    root = tmp_path / "export"
    root.mkdir()
    with kinds.registered(DirSource(root)) as source:
        svc = make_service(tmp_path)
        svc.start()
        try:
            assert isinstance(source, DirSource)
            yield source, svc
        finally:
            svc.stop()


def test_a_kind_registered_in_a_test_warms_end_to_end_through_the_service(
    tmp_path: Path, exported: tuple[DirSource, PrewarmService]
) -> None:
    source, svc = exported
    data = b"weights " * 1000
    (source.root / "tiny.bin").write_bytes(data)

    item = svc.submit(DirRequest(str(source.root / "tiny.bin"), pin=True))
    assert item.kind == "dir" and item.state is ItemState.QUEUED
    svc.enqueue(item.id)
    done = svc.wait(item.id, timeout=10)

    assert done.state is ItemState.READY, done.error
    assert done.sha256 == hashlib.sha256(data).hexdigest() and done.size == len(data)
    assert (svc.store.name_dir / "tiny.bin").read_bytes() == data  # by-name link to its blob
    assert node_labels(svc.items()) == {"gpu-agent.io/cache.tiny.bin": "ready"}
    assert svc.get("tiny.bin").kind == "dir"  # read back from the index as its own kind
    assert cache_item_pb(done).source == f"dir://{source.root / 'tiny.bin'}"

    again = svc.submit(DirRequest(str(source.root / "tiny.bin")))
    assert (again.state, again.hits, source.runs) == (ItemState.READY, 1, 1)  # a hit, no run

    svc.pin("tiny.bin", False)
    evicted = svc.evict("tiny.bin")
    assert evicted.state is ItemState.EVICTED
    assert not (svc.store.blob_dir / done.sha256).exists()


def test_the_kinds_own_rules_refuse_a_bad_request_and_its_failures_are_the_services(
    tmp_path: Path, exported: tuple[DirSource, PrewarmService]
) -> None:
    source, svc = exported
    with pytest.raises(InvalidSpec) as refused:
        svc.submit(DirRequest(str(tmp_path / "elsewhere")))
    assert [v.field for v in refused.value.violations] == ["path"]
    assert svc.items() == []  # nothing recorded

    item = svc.submit(DirRequest(str(source.root / "missing.bin")))
    svc.enqueue(item.id)
    failed = svc.wait(item.id, timeout=10)
    assert failed.state is ItemState.FAILED
    assert (
        failed.error
        == f"cannot read dir://{source.root / 'missing.bin'}: No such file or directory"
    )


def test_the_audit_evicts_a_ready_item_of_the_new_kind_whose_blob_is_gone(
    exported: tuple[DirSource, PrewarmService],
) -> None:
    source, svc = exported
    (source.root / "a.bin").write_bytes(b"a" * 100)
    item = svc.submit(DirRequest(str(source.root / "a.bin")))
    svc.enqueue(item.id)
    done = svc.wait(item.id, timeout=10)
    assert done.sha256 is not None
    (svc.store.blob_dir / done.sha256).unlink()

    (changed,) = svc.audit()
    assert changed.state is ItemState.EVICTED and "missing" in (changed.error or "")
    assert node_labels(svc.items()) == {}


def test_a_kind_is_registered_once_and_an_unknown_one_is_refused_by_name(
    tmp_path: Path,
) -> None:
    shipped = kinds.kinds()
    assert {"file", "image", "group"} <= set(shipped)
    with (
        kinds.registered(DirSource(tmp_path)),
        pytest.raises(ValueError, match="'dir' is already registered"),
    ):
        assert kinds.kinds() == [*shipped, "dir"]
        kinds.register(DirSource(tmp_path))
    with pytest.raises(NotSupported, match="prewarm kind 'dir' is not known"):
        kinds.source_for("dir")
    assert kinds.kinds() == shipped


def test_a_manifest_lists_a_registered_kind_by_its_target_schema(tmp_path: Path) -> None:
    """The manifest parser knows no kind: an entry is the kind whose key it has, checked by
    that kind's schema with the same rules (unknown keys with a hint, types) as the others."""
    with kinds.registered(DirSource(tmp_path)):
        requests = parse_manifest(
            {"version": 1, "items": [{"path": "/x/a.bin", "pin": True}, {"url": "https://h/f"}]}
        )
        assert requests[0] == DirRequest("/x/a.bin", None, True)
        with pytest.raises(InvalidSpec) as refused:
            parse_manifest({"version": 1, "items": [{"path": "/x", "pinn": True, "name": 3}]})
    found = {v.field: v.description for v in refused.value.violations}
    assert found == {
        "items[0].pinn": "unknown key (did you mean pin?); allowed: path, name, pin",
        "items[0].name": "a string",
    }
    with pytest.raises(InvalidSpec) as unknown:  # unregistered: not a kind any more
        parse_manifest({"version": 1, "items": [{"path": "/x"}]})
    # The refusal lists the keys of the kinds registered now, and no others.
    listed = unknown.value.violations[0].description.removeprefix("a mapping with exactly one of ")
    assert listed.split(", ") == [s.manifest_source for s in kinds.schemas()]
    assert {"url", "image", "model"} <= set(listed.split(", ")) and "path" not in listed
