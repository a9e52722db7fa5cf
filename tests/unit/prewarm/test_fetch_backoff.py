"""The fetcher's retry back-off gives way to a cancel (or the agent stopping) at once: the
agent's shutdown waits for fetch threads within its grace period, so a back-off of 16 s on an
unreachable origin used to outlive it (and the agent then exited hard). The real-process
version: tests/integration/test_shutdown_waits.py."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from agent.prewarm.cancel import never
from agent.prewarm.errors import Cancelled, FetchFailed
from agent.prewarm.fetch_http import FetchSpec, HttpFetcher
from agent.prewarm.policy import UrlPolicy
from agent.prewarm.sink import DigestSink


def test_a_cancel_during_the_back_off_ends_the_fetch_without_waiting_it_out() -> None:
    stop = threading.Event()
    fetcher = HttpFetcher(
        UrlPolicy(allow_http=True, allowed_hosts=("127.0.0.1",), egress_allow=("127.0.0.0/8",)),
        retries=5,
        backoff_s=16.0,
        timeout_s=2.0,
    )
    with socket.socket() as refusing:  # bound, never listening: every attempt is refused
        refusing.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{refusing.getsockname()[1]}/x"
        threading.Timer(0.2, stop.set).start()  # the agent stops while the fetcher waits
        started = time.monotonic()
        with pytest.raises(Cancelled):
            fetcher.fetch(FetchSpec(url), DigestSink("0" * 64), lambda *_, **__: None, stop.is_set)
    assert time.monotonic() - started < 2.0  # not the 16 s back-off


def test_a_dragonfly_proxy_s_password_is_in_no_retry_note_nor_error() -> None:
    """A proxy URL with user info went whole into the retry note (PrewarmItemProgress.retrying,
    which a read identity sees), the fetch's error and the log."""
    notes: list[str] = []

    def progress(done: int, total: int | None, /, *, retrying: str = "") -> None:
        if retrying:
            notes.append(retrying)

    with socket.socket() as refusing:  # the proxy: bound, never listening
        refusing.bind(("127.0.0.1", 0))
        proxy = f"http://df:S3cretP4ss@127.0.0.1:{refusing.getsockname()[1]}"
        fetcher = HttpFetcher(
            UrlPolicy(allow_http=True, egress_allow=("127.0.0.0/8",)),
            proxy=proxy,
            retries=1,
            backoff_s=0.01,
            timeout_s=2.0,
        )
        with pytest.raises(FetchFailed) as caught:
            fetcher.fetch(FetchSpec("http://127.0.0.1:9/x"), DigestSink("0" * 64), progress, never)
    assert notes and all("Dragonfly proxy http://127.0.0.1:" in n for n in notes), notes
    assert not [n for n in notes if "S3cret" in n or "df:" in n]
    assert "S3cret" not in str(caught.value) and "unreachable" in str(caught.value)
