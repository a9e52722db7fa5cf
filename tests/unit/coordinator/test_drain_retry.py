"""A drain's eviction a PodDisruptionBudget refuses (429) was retried every second, whatever
the server's Retry-After said: a drain blocked by a budget for an hour sent 3,600 evictions.
It waits the Retry-After, else kubectl drain's 5 s, jittered and doubling to 30 s."""

from __future__ import annotations

import asyncio

from agent.coordinator.rollout.drain import EVICT_RETRY_S, evict
from agent.errors import Busy


class RefusingApi:
    """The Eviction API of a pod whose disruption budget refuses ``refusals`` times."""

    def __init__(self, refusals: int, retry_after_s: float | None) -> None:
        self.refusals = refusals
        self.retry_after_s = retry_after_s
        self.evictions = 0

    def evict(self, namespace: str, pod: str) -> None:
        self.evictions += 1
        if self.evictions <= self.refusals:
            exc = Busy("429 Too Many Requests: it would violate the pod's disruption budget")
            exc.retry_after_s = self.retry_after_s  # type: ignore[attr-defined]
            raise exc

    def cordon(self, node: str) -> bool:
        raise AssertionError("not a drain's step here")

    def uncordon(self, node: str) -> None:
        raise AssertionError("not a drain's step here")


def _waits(api: RefusingApi) -> tuple[list[float], list[str]]:
    waited: list[float] = []
    said: list[str] = []

    async def sleep(seconds: float) -> None:  # the waits, counted rather than slept
        waited.append(seconds)

    asyncio.run(evict(api, "team", "train-0", said.append, sleep=sleep))
    return waited, said


def test_a_refused_eviction_waits_the_servers_retry_after() -> None:
    api = RefusingApi(refusals=3, retry_after_s=10.0)
    waited, said = _waits(api)
    assert api.evictions == 4 and waited == [10.0, 10.0, 10.0]
    assert "again in 10s" in said[0]


def test_without_a_retry_after_a_refused_eviction_backs_off_from_kubectls_5s_with_jitter() -> None:
    api = RefusingApi(refusals=6, retry_after_s=None)
    waited, _ = _waits(api)
    assert api.evictions == 7
    first, longest = EVICT_RETRY_S
    due = [min(longest, first * 2**n) for n in range(6)]  # 5, 10, 20, 30, 30, 30
    assert all(d * 0.5 <= w <= d * 1.5 for w, d in zip(waited, due, strict=True)), waited
    assert len(set(waited)) > 1  # jittered: a fleet's drains do not retry in step
