"""The fetcher's retry back-off gives way to a cancel (or the agent stopping) at once: the
agent's shutdown waits for fetch threads within its grace period, so a back-off of 16 s on an
unreachable origin used to outlive it (and the agent then exited hard). The real-process
version: tests/integration/test_shutdown_waits.py."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from agent.prewarm.errors import Cancelled
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
