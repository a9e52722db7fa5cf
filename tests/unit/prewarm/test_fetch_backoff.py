"""The fetcher's retry back-off gives way to a cancel (or the agent stopping) at once: the
agent's shutdown waits for fetch threads within its grace period, so a back-off of 16 s on an
unreachable origin used to outlive it (and the agent then exited hard)."""

from __future__ import annotations

import pytest

from agent.prewarm.errors import Cancelled
from agent.prewarm.fetch_http import FetchSpec, HttpFetcher
from agent.prewarm.policy import UrlPolicy
from agent.prewarm.sink import DigestSink


def test_a_cancel_during_the_back_off_ends_the_fetch_without_waiting_it_out() -> None:
    slept: list[float] = []
    stop = {"now": False}

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        stop["now"] = True  # the agent stops while the fetcher waits to retry

    fetcher = HttpFetcher(
        UrlPolicy(allow_http=True, allowed_hosts=("127.0.0.1",)),
        retries=5,
        backoff_s=16.0,
        timeout_s=2.0,
        sleep=sleep,
    )
    with pytest.raises(Cancelled):
        # Port 9 (discard) is closed on loopback: every attempt is refused at once.
        fetcher.fetch(
            FetchSpec("http://127.0.0.1:9/x"),
            DigestSink("0" * 64),
            lambda *_: None,
            lambda: stop["now"],
        )
    assert sum(slept) < 1.0, slept  # one short slice, not the 16 s back-off
