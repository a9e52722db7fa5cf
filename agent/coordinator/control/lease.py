"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

One holder at a time: ``coordinator serve`` replicas and a hand-run ``fleet apply`` take the
same Lease before they change a node, so two never roll changes over each other.

The rules (client-go ``tools/leaderelection``):
- a candidate takes the Lease when it is free (no holder) or when the record it last saw has not
  changed for ``lease_duration_s`` *by its own clock*: expiry is judged from when this process
  observed the record, never from the ``renewTime`` written by another machine's clock;
- every write (create, take, renew, release) is an update on the ``resourceVersion`` read just
  before, so of two candidates racing only one wins; the other gets 409 Conflict and retries;
- the leader renews every ``retry_period_s``; when no renewal has succeeded for
  ``renew_deadline_s`` (measured from before the last successful request was sent) it stops
  leading at once, even while a request hangs. ``renew_deadline_s < lease_duration_s``, so it
  has stopped acting before any other candidate can see the Lease expire;
- the attempts run on a thread of their own (`LeaderElector.keep`), so a busy event loop
  cannot starve them; the loop only learns the outcome, and stops its work at the deadline;
- leaving on purpose releases the Lease (no holder, duration 1 s) so a standby takes over
  without waiting out the whole duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agent.errors import Conflict, FieldViolation, InvalidSpec, NotFound
from agent.loops import call_soon_from_thread

__all__ = [
    "DEFAULT_LEASE",
    "ElectionTiming",
    "LeaderElector",
    "LeaseApi",
    "LeaseHeld",
    "default_identity",
    "while_leading",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_LEASE = "gpu-agent-coordinator"


class LeaseHeld(Conflict):
    """Another holder has the Lease: this process must not change nodes now."""


class LeaseApi(Protocol):
    """The three Lease calls (blocking; the elector runs them in a thread)."""

    def get_lease(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The Lease object; NotFound when there is none."""
        ...

    def create_lease(self, namespace: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """Create it; Conflict when it exists already."""
        ...

    def update_lease(self, namespace: str, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """Replace it at ``metadata.resourceVersion``; Conflict when that is stale."""
        ...


@dataclass(frozen=True, slots=True)
class ElectionTiming:
    #: how long a Lease not renewed stays another's (client-go LeaseDuration)
    lease_duration_s: float = 15.0
    #: how long the leader keeps acting without a successful renewal (RenewDeadline)
    renew_deadline_s: float = 10.0
    #: how often to try to take or renew the Lease (RetryPeriod)
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration_s > self.renew_deadline_s:
            raise InvalidSpec(
                "the lease duration must be longer than the renew deadline",
                [FieldViolation("lease-duration", f"> renew deadline {self.renew_deadline_s:g}")],
            )
        # client-go: RenewDeadline > JitterFactor (1.2) x RetryPeriod, so a renewal can retry.
        if not self.renew_deadline_s > 1.2 * self.retry_period_s:
            raise InvalidSpec(
                "the renew deadline must exceed 1.2 x the retry period",
                [FieldViolation("renew-deadline", f"> {1.2 * self.retry_period_s:g}")],
            )
        if self.retry_period_s <= 0:
            raise InvalidSpec("retry period must be > 0", [FieldViolation("retry-period", "> 0")])


def default_identity(environ: Mapping[str, str] = os.environ) -> str:
    """The pod name (or host name) and a random suffix: two processes never share one."""
    base = environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{random.getrandbits(32):08x}"


def _now_rfc3339(wall: float) -> str:
    # MicroTime: RFC 3339 with microseconds, in UTC.
    return dt.datetime.fromtimestamp(wall, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Takes, keeps and releases one Lease for ``identity``."""

    def __init__(
        self,
        api: LeaseApi,
        namespace: str,
        name: str = DEFAULT_LEASE,
        identity: str | None = None,
        timing: ElectionTiming | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.timing = timing or ElectionTiming()
        self._clock = clock
        self._wall = wall
        #: the Lease as last read or written, and when (our clock) its spec last changed
        self._observed: Mapping[str, Any] | None = None
        self._observed_spec: Mapping[str, Any] | None = None
        self._observed_at = 0.0
        #: when the request behind the last successful take/renew was sent; None: not leading
        self._renewed_at: float | None = None
        #: when the API server last answered a Lease read (our clock); None: never
        self._answered_at: float | None = None
        self.changed = asyncio.Event()

    # -- state -----------------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        """True while the last successful renewal is within the renew deadline."""
        if self._renewed_at is None:
            return False
        return self._clock() - self._renewed_at < self.timing.renew_deadline_s

    @property
    def holder(self) -> str:
        """Who holds the Lease as last seen ("" for nobody)."""
        spec = self._observed_spec or {}
        return str(spec.get("holderIdentity") or "")

    def answered_recently(self) -> bool:
        """The API server answered a Lease read within one lease duration."""
        at = self._answered_at
        return at is not None and self._clock() - at < self.timing.lease_duration_s

    def deadline(self) -> float | None:
        """When (our clock) this leader stops acting unless it renews; None if not leading."""
        return None if self._renewed_at is None else self._renewed_at + self.timing.renew_deadline_s

    # -- one attempt (blocking) ------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One attempt to take or renew the Lease; True when this identity holds it now."""
        sent = self._clock()
        wall = _now_rfc3339(self._wall())
        try:
            current = self._read()
        except NotFound:
            self._answered_at = self._clock()
            spec = self._spec(wall, wall, 0)
            try:
                created = self._api.create_lease(self.namespace, self._object(spec, None))
            except Conflict:
                # Another candidate created it first: read it now, so that the holder is
                # known from this attempt on (a standby's readiness names it).
                with contextlib.suppress(NotFound):
                    self._read()
                return False
            return self._won(created, sent)
        spec = current.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        if holder and holder != self.identity:
            duration = float(spec.get("leaseDurationSeconds") or self.timing.lease_duration_s)
            if self._clock() < self._observed_at + duration:
                self._renewed_at = None
                return False
        if holder == self.identity:  # a renewal keeps the acquire time and the count
            new = self._spec(
                str(spec.get("acquireTime") or wall), wall, int(spec.get("leaseTransitions") or 0)
            )
        else:
            new = self._spec(wall, wall, int(spec.get("leaseTransitions") or 0) + 1)
        version = str((current.get("metadata") or {}).get("resourceVersion") or "")
        try:
            updated = self._api.update_lease(self.namespace, self._object(new, version))
        except Conflict:
            return False  # it changed since our read: read again next time
        return self._won(updated, sent)

    def _read(self) -> Mapping[str, Any]:
        """The Lease as the API server has it, remembered as observed; NotFound when none.
        Expiry counts from when its spec last changed, by this process' clock."""
        current = self._api.get_lease(self.namespace, self.name)
        self._answered_at = self._clock()
        spec = current.get("spec") or {}
        if spec != self._observed_spec:
            self._observed_spec, self._observed_at = spec, self._clock()
        self._observed = current
        return current

    def release(self) -> bool:
        """Give the Lease up (no holder, 1 s) if this identity holds it; True if released."""
        was_leading = self.leading
        self._renewed_at = None
        if not was_leading or self._observed is None:
            return False
        spec = dict(self._observed_spec or {})
        spec.update(
            holderIdentity="",
            leaseDurationSeconds=1,
            renewTime=_now_rfc3339(self._wall()),
        )
        version = str((self._observed.get("metadata") or {}).get("resourceVersion") or "")
        try:
            self._api.update_lease(self.namespace, self._object(spec, version))
        except Conflict:
            return False
        return True

    def _won(self, obj: Mapping[str, Any], sent: float) -> bool:
        self._observed = obj
        self._observed_spec = obj.get("spec") or {}
        self._observed_at = self._clock()
        self._renewed_at = sent
        return True

    def _spec(self, acquire: str, renew: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.timing.lease_duration_s)),
            "acquireTime": acquire,
            "renewTime": renew,
            "leaseTransitions": transitions,
        }

    def _object(self, spec: Mapping[str, Any], version: str | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if version:
            metadata["resourceVersion"] = version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": dict(spec),
        }

    # -- the keeper thread -----------------------------------------------------------------------

    def _attempt(self) -> bool:
        """One attempt; API errors count as a failed attempt (logged), never a crash."""
        before = self.leading
        try:
            ok = self.try_acquire_or_renew()
        except Conflict:
            ok = False
        except Exception as exc:  # an outage is a failed renewal
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            ok = False
        if self.leading != before:
            what = "leading" if self.leading else f"not leading (holder {self.holder or 'none'})"
            log.info("lease %s/%s: %s as %s", self.namespace, self.name, what, self.identity)
        return ok

    async def attempt(self) -> bool:
        """One attempt, in a thread."""
        return await asyncio.to_thread(self._attempt)

    async def keep(self, stop: asyncio.Event, beat: Callable[[], None] = lambda: None) -> None:
        """Take and renew the Lease every retry period until ``stop``; release it then.

        The attempts run on a thread of their own, never waiting for the event loop: a loop
        busy for longer than the renew deadline (a sweep of thousands of agents, a big
        render) must not depose the leader (BENCHMARKS.md, 7 losses in 11 min at 5,000
        nodes). ``beat`` is called on the loop after every attempt (liveness: the loop runs)."""
        loop = asyncio.get_running_loop()
        halt = threading.Event()
        ended = asyncio.Event()

        def told() -> None:  # on the loop: lost() and won() look again
            self.changed.set()
            beat()

        def tell() -> None:
            call_soon_from_thread(loop, told)

        def finish() -> None:
            call_soon_from_thread(loop, ended.set)

        thread = threading.Thread(
            target=self._keep_on_thread,
            args=(halt, tell, finish),
            name=f"lease-{self.name}",
            daemon=True,
        )
        thread.start()
        try:
            await stop.wait()
        finally:
            halt.set()
            await ended.wait()  # released (or given up) by the thread
            self.changed.set()

    def _keep_on_thread(
        self, halt: threading.Event, tell: Callable[[], None], finish: Callable[[], None]
    ) -> None:
        try:
            while not halt.is_set():
                self._attempt()
                tell()
                period = self.timing.retry_period_s
                if not self.leading:
                    period *= 1.0 + 0.2 * random.random()  # candidates spread out (jitter)
                halt.wait(self._until_next(period))
        finally:
            if self.leading:
                try:
                    self.release()
                except Exception as exc:  # the Lease then expires on its own
                    log.warning("lease %s/%s: release failed: %s", self.namespace, self.name, exc)
            self._renewed_at = None
            finish()

    def _until_next(self, period: float) -> float:
        """The retry period, but wake at the renew deadline to notice a lost lead at once."""
        deadline = self.deadline()
        if deadline is None or not self.leading:
            return period
        return max(0.0, min(period, deadline - self._clock()))

    async def lost(self) -> None:
        """Returns when this process stops leading: at its renew deadline at the latest, by
        its own clock, whatever a hung request is doing."""
        while self.leading:
            deadline = self.deadline()
            assert deadline is not None
            self.changed.clear()
            await _sleep_or_stop(self.changed, max(0.0, deadline - self._clock()) + 0.01)

    async def won(self, stop: asyncio.Event) -> bool:
        """Returns True once this process leads, False if ``stop`` came first."""
        while not self.leading:
            if stop.is_set():
                return False
            self.changed.clear()
            await _sleep_or_stop(self.changed, self.timing.retry_period_s)
        return True


async def while_leading(elector: LeaderElector, work: Awaitable[T]) -> T:
    """Take the Lease (or refuse, naming the holder), run ``work`` renewing it, release it.

    Losing the Lease mid-way cancels ``work``: another holder may act from then on."""
    try:
        if not await asyncio.to_thread(elector.try_acquire_or_renew):
            raise LeaseHeld(
                f"the lease {elector.namespace}/{elector.name} is held by "
                f"{elector.holder or 'another holder'}: it changes the nodes now; stop it "
                "(scale the coordinator to 0) or let it apply the desired state"
            )
    except BaseException:
        if inspect.iscoroutine(work):
            work.close()
        raise
    stop = asyncio.Event()
    keeper = asyncio.create_task(elector.keep(stop))
    task = asyncio.ensure_future(work)
    lost = asyncio.create_task(elector.lost())
    try:
        await asyncio.wait([task, lost], return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise LeaseHeld(
                f"lost the lease {elector.namespace}/{elector.name} (not renewed for "
                f"{elector.timing.renew_deadline_s:g} s): stopped; started operations run on"
            )
        return task.result()
    finally:
        lost.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, lost, return_exceptions=True)
        stop.set()
        await keeper


async def _sleep_or_stop(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
