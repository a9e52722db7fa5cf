"""Resume across re-signed URLs, against a real HTTP origin on loopback (docs/prewarm.md, "Source
identity"): a download cut off part-way and asked again with a new signature resumes from the
bytes its partial holds; an object that changed at the origin meanwhile restarts from 0 and says
why; any other query parameter is another item."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest

from agent.prewarm.model import CacheItem, FileRequest, GroupRequest, ItemState
from agent.prewarm.service import PrewarmService
from tests.integration.prewarm_fixtures import hub
from tests.integration.prewarm_fixtures.agent import make_service
from tests.integration.prewarm_fixtures.origin import Origin

pytestmark = pytest.mark.integration
MIB = 1024 * 1024

# Two signatures of the same object per provider: only signature parameters differ, and a
# content parameter (v=2) stays. The values are markers that must never reach a message.
SIGNED = {
    "s3-v4": (
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=SECRETa1&X-Amz-Date=20260101T000000Z"
        "&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Signature=SECRETa2&v=2",
        "v=2&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=SECRETb1"
        "&X-Amz-Date=20260102T000000Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host"
        "&X-Amz-Security-Token=SECRETb3&X-Amz-Signature=SECRETb2",
    ),
    "s3-v2": (
        "AWSAccessKeyId=SECRETa1&Expires=1700000000&Signature=SECRETa2&v=2",
        "AWSAccessKeyId=SECRETb1&Expires=1800000000&Signature=SECRETb2&v=2",
    ),
    "gcs": (
        "X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=SECRETa1&X-Goog-Date=1"
        "&X-Goog-Expires=600&X-Goog-SignedHeaders=host&X-Goog-Signature=SECRETa2&v=2",
        "X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=SECRETb1&X-Goog-Date=2"
        "&X-Goog-Expires=600&X-Goog-SignedHeaders=host&X-Goog-Signature=SECRETb2&v=2",
    ),
    "azure-sas": (
        "sv=2022-11-02&sr=b&sp=r&st=2026-01-01&se=2026-01-02&spr=https&sig=SECRETa2&v=2",
        "v=2&sv=2022-11-02&sr=b&sp=r&st=2026-01-03&se=2026-01-04&spr=https"
        "&skoid=SECRETb1&sktid=t&skt=1&ske=2&sks=b&skv=2022-11-02&sig=SECRETb2",
    ),
    "oss-v4": (
        "x-oss-signature-version=OSS4-HMAC-SHA256&x-oss-credential=SECRETa1&x-oss-date=1"
        "&x-oss-expires=60&x-oss-signature=SECRETa2&v=2",
        "x-oss-signature-version=OSS4-HMAC-SHA256&x-oss-credential=SECRETb1&x-oss-date=2"
        "&x-oss-expires=60&x-oss-signature=SECRETb2&x-oss-security-token=SECRETb3&v=2",
    ),
}


def blob(n: int, seed: int) -> bytes:
    return (hashlib.sha256(str(seed).encode()).digest() * (n // 32 + 1))[:n]


def interrupted(svc: PrewarmService, origin: Origin, url: str, at: int) -> CacheItem:
    """A download of ``url`` the origin cut off after ``at`` bytes, kept for a retry."""
    origin.faults.drop_after["/obj.bin"] = at
    item = svc.run(svc.submit(FileRequest(url)).id)
    assert item.state is ItemState.FAILED and "bytes kept" in (item.error or ""), item.error
    assert svc.store.partial_size(item.id) == at
    return item


def assert_no_secret(item: CacheItem, caplog: pytest.LogCaptureFixture) -> None:
    shown = [item.error or "", *item.options.values(), caplog.text]
    assert not [text for text in shown if "SECRET" in text]


@pytest.mark.parametrize("scheme", sorted(SIGNED))
def test_a_re_signed_url_resumes_the_partial_from_its_verified_bytes(
    tmp_path: Path, origin: Origin, scheme: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One item, not two: the second signature's first request asks for the bytes after the
    partial's (with If-Range, the ETag the first answer gave), and the file hashes right."""
    caplog.set_level(logging.INFO)
    digest = origin.add("obj.bin", blob(4 * MIB, 1))
    svc = make_service(tmp_path, retries=0)
    first_query, second_query = SIGNED[scheme]
    item = interrupted(svc, origin, f"{origin.url('obj.bin')}?{first_query}", MIB)
    etag = _etag_of(origin, "obj.bin")
    seen = len(origin.requests)

    again = svc.submit(FileRequest(f"{origin.url('obj.bin')}?{second_query}"))
    assert (again.id, again.name) == (item.id, item.name)
    done = svc.run(again.id)

    assert done.state is ItemState.READY, done.error
    assert (done.sha256, done.size) == (digest, 4 * MIB)
    assert "restarted" not in done.options
    assert [i.id for i in svc.items()] == [item.id]
    after = origin.requests[seen:]
    assert [(r.path, r.headers.get("Range"), r.headers.get("If-Range")) for r in after] == [
        (f"/obj.bin?{second_query}", f"bytes={MIB}-", etag)
    ]
    assert_no_secret(done, caplog)


@pytest.mark.parametrize(
    ("origin_honours_if_range", "new_size"),
    [(True, 3 * MIB), (False, 3 * MIB), (False, 4 * MIB)],
    ids=["if-range-honoured", "if-range-ignored", "if-range-ignored-same-size"],
)
def test_an_object_changed_at_the_origin_restarts_from_zero_saying_why(
    tmp_path: Path,
    origin: Origin,
    caplog: pytest.LogCaptureFixture,
    origin_honours_if_range: bool,
    new_size: int,
) -> None:
    """The re-signed URL names an object whose ETag (and size) changed since the partial was
    written: its bytes are dropped, the new object is fetched from byte 0 (never spliced onto
    the old one's), and the item's options say why."""
    caplog.set_level(logging.INFO)
    origin.add("obj.bin", blob(4 * MIB, 2))
    svc = make_service(tmp_path, retries=0)
    first_query, second_query = SIGNED["s3-v4"]
    item = interrupted(svc, origin, f"{origin.url('obj.bin')}?{first_query}", MIB)
    old_etag = _etag_of(origin, "obj.bin")
    new_digest = origin.add("obj.bin", blob(new_size, 3))
    new_etag = _etag_of(origin, "obj.bin")
    assert new_etag != old_etag
    if not origin_honours_if_range:
        origin.faults.ignore_if_range.add("/obj.bin")
    seen = len(origin.requests)

    done = svc.run(svc.submit(FileRequest(f"{origin.url('obj.bin')}?{second_query}")).id)

    assert done.state is ItemState.READY, done.error
    assert (done.id, done.sha256, done.size) == (item.id, new_digest, new_size)
    ranges = [r.headers.get("Range") for r in origin.requests[seen:]]
    # Honoured: one answer, the whole new object. Ignored: the 206 is refused, then from 0.
    assert ranges == ([f"bytes={MIB}-"] if origin_honours_if_range else [f"bytes={MIB}-", None])
    why = done.options.get("restarted", "")
    assert "object changed at origin" in why and "restarting from 0" in why, why
    assert f"ETag {old_etag} -> {new_etag}" in why
    if new_size != 4 * MIB:
        assert f"size {4 * MIB} -> {new_size} bytes" in why
    assert "object changed at origin" in caplog.text
    assert_no_secret(done, caplog)


def test_another_value_of_a_content_parameter_is_another_item(
    tmp_path: Path, origin: Origin
) -> None:
    """``?version=2`` is not a signature: a new item, which does not take the first one's
    partial (its first request asks from byte 0)."""
    digest = origin.add("obj.bin", blob(2 * MIB, 4))
    svc = make_service(tmp_path, retries=0)
    first = interrupted(svc, origin, f"{origin.url('obj.bin')}?version=1&Signature=SECRETa", MIB)
    seen = len(origin.requests)

    second = svc.submit(FileRequest(f"{origin.url('obj.bin')}?version=2&Signature=SECRETb"))
    assert second.id != first.id and second.name != first.name
    done = svc.run(second.id)
    assert (done.state, done.sha256) == (ItemState.READY, digest)
    assert [r.headers.get("Range") for r in origin.requests[seen:]] == [None]
    assert svc.store.partial_size(first.id) == MIB  # the first item's partial is untouched
    assert sorted(i.id for i in svc.items()) == sorted([first.id, second.id])


def test_a_model_file_changed_at_the_origin_restarts_alone_and_the_model_says_which(
    tmp_path: Path, origin: Origin
) -> None:
    """A model's file re-uploaded at the origin (same bytes, new ETag) while its partial waited:
    that file is fetched again from 0, the others resume, and the model's options name it."""
    files = {"config.json": b"{}", **{f"s{i}.safetensors": blob(512 * 1024, i) for i in (1, 2)}}
    endpoint, commit = hub.publish(origin, "org/m", files)
    shard = origin.root / "org/m/resolve" / commit / "s2.safetensors"
    origin.faults.drop_after[f"/org/m/resolve/{commit}/s2.safetensors"] = 100 * 1024
    svc = make_service(tmp_path, retries=0)
    failed = svc.run(svc.submit(GroupRequest("org/m", endpoint=endpoint)).id)
    assert failed.state is ItemState.FAILED, failed.error
    shard.write_bytes(shard.read_bytes())  # a new upload of the same file: a new ETag
    seen = len(origin.requests)

    svc.index.update(failed.id, state=ItemState.QUEUED)  # what schedule_pending does when due
    done = svc.run(failed.id)
    assert done.state is ItemState.READY, done.error
    asked = [(r.path.rsplit("/", 1)[-1], r.headers.get("Range")) for r in origin.requests[seen:]]
    assert ("s2.safetensors", f"bytes={100 * 1024}-") in asked
    why = done.options.get("restarted", "")
    assert why.startswith("s2.safetensors: object changed at origin (ETag "), why


def _etag_of(origin: Origin, name: str) -> str:
    """The ETag the test origin gives the file now (its mtime and size)."""
    info = (origin.root / name).stat()
    return f'"{int(info.st_mtime_ns)}-{info.st_size}"'
