"""Leader election on a coordination.k8s.io/v1 Lease, against the API stand-in over HTTPS:
client-go's rules (expiry judged by the candidate's own clock, 409 on a stale resourceVersion,
the leader stops at its renew deadline, before anyone else may take it), with injected clocks."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.coordinator.control.lease import (
    ElectionTiming,
    LeaderElector,
    LeaseHeld,
    while_leading,
)
from agent.coordinator.kube import KubeLister
from agent.errors import Conflict, InvalidSpec, NotFound
from tests.kube.fake_api import FakeKubeApi

NS = "gpu-agent"
TIMING = ElectionTiming(lease_duration_s=15.0, renew_deadline_s=10.0, retry_period_s=2.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lister(kube_api: tuple[FakeKubeApi, str], tls_cert: tuple[Path, Path]) -> KubeLister:
    api, url = kube_api
    return KubeLister(url, api.token_path, ca_path=tls_cert[0], timeout=5.0)


def elector(api: Any, identity: str, clock: Clock) -> LeaderElector:
    return LeaderElector(api, NS, "coord", identity, TIMING, clock=clock, wall=lambda: 1.7e9)


def test_the_first_candidate_creates_the_lease_and_a_second_waits_out_its_duration(
    lister: KubeLister, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """A takes the free Lease; B, having seen it, may take it only once it has gone unchanged
    for leaseDurationSeconds by B's own clock; then transitions count up and acquireTime moves."""
    api, _ = kube_api
    clock = Clock()
    a, b = elector(lister, "a", clock), elector(lister, "b", clock)
    assert a.try_acquire_or_renew() and a.leading
    spec = api.leases[(NS, "coord")]["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 0
    assert spec["leaseDurationSeconds"] == 15 and spec["acquireTime"] == spec["renewTime"]
    assert not b.try_acquire_or_renew() and b.holder == "a"
    clock.now += 14.9
    assert not b.try_acquire_or_renew()
    assert not a.leading  # 14.9 s without a renewal: past a's renew deadline (10 s)
    clock.now += 0.2
    assert b.try_acquire_or_renew() and b.leading
    spec = api.leases[(NS, "coord")]["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1


class ReadBeforeCreation:
    """A candidate's view of the API whose first read came before another candidate created the
    Lease."""

    def __init__(self, api: KubeLister) -> None:
        self._api, self._stale = api, True

    def get_lease(self, namespace: str, name: str) -> Mapping[str, Any]:
        if self._stale:
            self._stale = False
            raise NotFound(f'leases "{name}" not found')
        return self._api.get_lease(namespace, name)

    def create_lease(self, namespace: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return self._api.create_lease(namespace, obj)

    def update_lease(self, namespace: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        return self._api.update_lease(namespace, obj)


def test_a_candidate_that_loses_the_creation_race_names_the_holder_at_once(
    lister: KubeLister,
) -> None:
    """B read no Lease, A created it, and B's create met 409: B reads it again in the same
    attempt, so a standby's readiness names the holder from its first attempt. (It said "the
    lease is held by nobody" for a retry period: test_coordinator_replicas failed on it once.)"""
    clock = Clock()
    a = elector(lister, "a", clock)
    b = LeaderElector(
        ReadBeforeCreation(lister), NS, "coord", "b", TIMING, clock=clock, wall=lambda: 1.7e9
    )
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert b.holder == "a" and b.answered_recently() and not b.leading


def test_a_renewal_keeps_the_acquire_time_and_moves_the_deadline(lister: KubeLister) -> None:
    clock = Clock()
    a = elector(lister, "a", clock)
    assert a.try_acquire_or_renew()
    first = a.deadline()
    clock.now += 5
    assert a.try_acquire_or_renew()
    assert a.deadline() == pytest.approx((first or 0) + 5)


def test_expiry_is_judged_by_the_candidates_clock_not_the_written_renew_time(
    lister: KubeLister, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """A holder whose clock is far behind writes an old renewTime; a candidate still waits a
    whole duration from when it saw the record change (no clock-skew takeover)."""
    api, _ = kube_api
    clock = Clock()
    skewed = LeaderElector(lister, NS, "coord", "a", TIMING, clock=clock, wall=lambda: 1.0)
    assert skewed.try_acquire_or_renew()
    b = elector(lister, "b", clock)
    assert not b.try_acquire_or_renew()
    assert api.leases[(NS, "coord")]["spec"]["renewTime"].startswith("1970-")


def test_the_leader_stops_at_its_renew_deadline_before_the_lease_can_expire(
    lister: KubeLister, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """With the API server down the leader cannot renew: it stops leading at the renew
    deadline (10 s), while a candidate cannot take the Lease before 15 s."""
    api, _ = kube_api
    clock = Clock()
    a, b = elector(lister, "a", clock), elector(lister, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    api.unavailable.add(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/coord")
    clock.now += 9.9
    assert not asyncio.run(a.attempt()) and a.leading
    clock.now += 0.1
    assert not a.leading
    api.unavailable.clear()
    clock.now += 4.9
    assert not b.try_acquire_or_renew()  # 14.9 s since b saw it: a has long stopped
    clock.now += 0.2
    assert b.try_acquire_or_renew()


def test_of_two_candidates_racing_on_one_resource_version_only_one_wins(
    lister: KubeLister, kube_api: tuple[FakeKubeApi, str]
) -> None:
    """B reads the expired Lease, A takes it before B writes: B's update carries the stale
    resourceVersion, the API server answers 409, and B does not lead."""
    api, _ = kube_api
    clock = Clock()
    old = elector(lister, "old", clock)
    assert old.try_acquire_or_renew()
    a = elector(lister, "a", clock)

    class Racing:
        def get_lease(self, namespace: str, name: str) -> Mapping[str, Any]:
            seen = lister.get_lease(namespace, name)
            if clock.now > 2000:
                assert a.try_acquire_or_renew()  # A writes between B's read and write
            return seen

        create_lease = lister.create_lease
        update_lease = lister.update_lease

    b = elector(Racing(), "b", clock)
    assert not a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock.now = 2100.0  # past the duration for both
    assert not b.try_acquire_or_renew() and not b.leading
    assert a.leading and api.leases[(NS, "coord")]["spec"]["holderIdentity"] == "a"
    stale = dict(api.leases[(NS, "coord")], metadata={"name": "coord", "resourceVersion": "1"})
    with pytest.raises(Conflict, match="has been modified"):
        lister.update_lease(NS, stale)


def test_release_frees_the_lease_for_a_standby_at_once(
    lister: KubeLister, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    clock = Clock()
    a, b = elector(lister, "a", clock), elector(lister, "b", clock)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert a.release() and not a.leading
    assert api.leases[(NS, "coord")]["spec"]["holderIdentity"] == ""
    assert b.try_acquire_or_renew()
    assert api.leases[(NS, "coord")]["spec"]["leaseTransitions"] == 1


def test_a_change_by_hand_is_refused_naming_the_holder(lister: KubeLister) -> None:
    clock = Clock()
    assert elector(lister, "serve-0_1234", clock).try_acquire_or_renew()
    ran = []

    async def work() -> None:
        ran.append(1)

    with pytest.raises(LeaseHeld, match="held by serve-0_1234"):
        asyncio.run(while_leading(elector(lister, "fleet-apply", clock), work()))
    assert ran == []


def test_work_runs_holding_the_lease_and_releases_it(
    lister: KubeLister, kube_api: tuple[FakeKubeApi, str]
) -> None:
    api, _ = kube_api
    seen = []

    async def work() -> str:
        seen.append(api.leases[(NS, "coord")]["spec"]["holderIdentity"])
        return "done"

    hand = LeaderElector(lister, NS, "coord", "fleet-apply/x", TIMING)
    assert asyncio.run(while_leading(hand, work())) == "done"
    assert seen == ["fleet-apply/x"]
    assert api.leases[(NS, "coord")]["spec"]["holderIdentity"] == ""


def test_timings_that_cannot_be_safe_are_refused() -> None:
    with pytest.raises(InvalidSpec, match="longer than the renew deadline"):
        ElectionTiming(lease_duration_s=10, renew_deadline_s=10, retry_period_s=2)
    with pytest.raises(InvalidSpec, match=r"1\.2 x the retry period"):
        ElectionTiming(lease_duration_s=15, renew_deadline_s=2, retry_period_s=2)
