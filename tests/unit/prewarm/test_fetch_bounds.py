"""What an origin sends beyond the file is not read: the fetcher's memory and time stay bounded
whatever the origin's answer carries. Against the real test origin on loopback."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from agent.prewarm.fetch_http import FetchSpec, HttpFetcher
from agent.prewarm.policy import UrlPolicy
from agent.prewarm.sink import DigestSink
from tests.integration.prewarm_fixtures.origin import Origin

MIB = 1024 * 1024


def _fetcher() -> HttpFetcher:
    policy = UrlPolicy(allow_http=True, allowed_hosts=("127.0.0.1",), egress_allow=("127.0.0.0/8",))
    return HttpFetcher(policy, retries=0, timeout_s=5.0)


def test_a_resume_answered_416_with_a_huge_body_does_not_read_the_body(tmp_path: Path) -> None:
    """A partial already whole asks for ``bytes=N-``; the origin answers 416 ``bytes */N`` (the
    file is complete) with 256 MiB after it, unframed. The fetch ends on the headers: the body
    was read to the close (600 MB sent raised the agent's RSS by 1.2 GB)."""
    data = hashlib.sha256(b"whole").digest() * 1024
    with Origin(tmp_path) as origin:
        digest = origin.add("m.bin", data)
        sink = DigestSink(digest)
        fetcher = _fetcher()
        fetcher.fetch(FetchSpec(origin.url("m.bin")), sink, lambda *_, **__: None, lambda: False)
        assert sink.offset == len(data)
        origin.faults.unsatisfied_body["/m.bin"] = 256 * MIB
        started = time.monotonic()
        fetcher.fetch(FetchSpec(origin.url("m.bin")), sink, lambda *_, **__: None, lambda: False)
        took = time.monotonic() - started
        assert origin.ranges("m.bin")[-1] == f"bytes={len(data)}-"
        deadline = time.monotonic() + 10
        while "/m.bin" not in origin.unsatisfied_sent and time.monotonic() < deadline:
            time.sleep(0.01)
    assert sink.verify() == len(data)  # the file stays whole
    # What the origin got out before the close is the sockets' buffers, not the 256 MiB.
    assert origin.unsatisfied_sent["/m.bin"] < 32 * MIB, origin.unsatisfied_sent
    assert took < 2.0
