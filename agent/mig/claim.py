"""The node's claim: which coordinator may start the next MIG change here (in memory).

A claim changes nothing; it is how coordinators that share no Lease keep max-unavailable
(docs/coordinator.md, "Two replicas without a Lease"). At most one claim exists per node. It
lives ``ttl`` seconds by the agent's own clock, or, once an apply binds it, until that
operation ends: the agent, not the coordinator, keeps it alive through the change, so a
coordinator that dies mid-change still leaves the node counted. A restart forgets claims;
an apply the restart finishes is running, and a running apply counts as a claim.

A claim belongs to the caller that took it (its identity: a certificate's SANs, or ``local``;
``agent.api.auth.claimant_of``; a caller with none may not claim):
the holder is a name a caller gives, so another caller naming it may neither renew, release nor
apply under it (docs/security.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from agent.errors import Busy, Claimed, FieldViolation, InvalidSpec, PermissionDenied

__all__ = ["DEFAULT_TTL_S", "MAX_TTL_S", "Claim", "ClaimBook"]

DEFAULT_TTL_S = 30
MAX_TTL_S = 300
_MAX_TEXT = 253


@dataclass(frozen=True, slots=True)
class Claim:
    holder: str
    rollout: str
    max_unavailable: str
    #: when it ends (the agent's monotonic clock), unless ``operation`` is bound
    expires_at: float
    #: the mig.apply operation bound to it (it lives while that runs)
    operation: str = ""
    #: the identity of the caller that took it ("" for a running apply no claim names)
    caller: str = ""
    #: which taking this is: a renewal keeps it, a claim taken afresh (after one lapsed) does
    #: not, so an apply admitted under one claim never binds another of the same name
    serial: int = 0


def _text(value: str, field: str, *, required: bool = False) -> str:
    if (required and not value) or len(value) > _MAX_TEXT or not value.isprintable():
        need = "required, " if required else ""
        raise InvalidSpec(
            f"{field} is missing, too long or not printable",
            [FieldViolation(field, f"{need}at most {_MAX_TEXT} printable characters")],
        )
    return value


class ClaimBook:
    """The one claim of this node. ``running()`` names the running mig.apply operations."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._claim: Claim | None = None
        self._lock = threading.Lock()
        self._serial = 0
        #: applies between `hold` and `bind`/`unhold`: their operation is being created, so
        #: the claim they were admitted under neither lapses nor is replaced meanwhile
        self._starting = 0

    def now(self) -> float:
        return self._clock()

    def current(self, running: set[str]) -> Claim | None:
        """The live claim: bound to a running operation, or unbound and not expired; else
        a running operation no claim names stands as a holderless claim."""
        with self._lock:
            claim = self._live(running)
        if claim is None and running:
            return Claim("", "", "", 0.0, sorted(running)[0])
        return claim

    def _live(self, running: set[str]) -> Claim | None:
        c = self._claim
        if c is not None and (
            c.operation in running
            if c.operation
            else self._starting or self._clock() < c.expires_at
        ):
            return c
        self._claim = None
        return None

    def take(
        self,
        holder: str,
        rollout: str,
        max_unavailable: str,
        ttl_s: int,
        running: set[str],
        caller: str,
    ) -> Claim:
        """Claim (or renew) for ``holder``, by ``caller``; Busy naming who is in the way
        otherwise."""
        if not caller:
            raise PermissionDenied(
                "a caller without an identity (a certificate with no URI or DNS SAN) may not "
                "take a MIG claim: every such caller would hold it alike"
            )
        _text(holder, "holder", required=True)
        _text(rollout, "rollout")
        _text(max_unavailable, "max_unavailable")
        if ttl_s > MAX_TTL_S:
            raise InvalidSpec(
                f"ttl_seconds {ttl_s} is over {MAX_TTL_S}",
                [FieldViolation("ttl_seconds", f"0 (for {DEFAULT_TTL_S}) to {MAX_TTL_S}")],
            )
        with self._lock:
            claim = self._live(running)
            if claim is not None and claim.holder != holder:
                raise Claimed(f"the node is claimed by {claim.holder} (rollout {claim.rollout})")
            _refuse_another_caller(claim, caller)
            if claim is not None and claim.operation:
                return claim  # its change runs: the claim ends with it
            if running:
                op = sorted(running)[0]
                raise Busy(f"MIG apply {op} is running; the node is changing", [op])
            if claim is None and self._starting:
                raise Busy("a MIG apply is starting; the node is changing", [])
            if claim is None:
                self._serial += 1
            expires = self._clock() + (ttl_s or DEFAULT_TTL_S)
            self._claim = Claim(
                holder, rollout, max_unavailable, expires, caller=caller, serial=self._serial
            )
            return self._claim

    def release(self, holder: str, caller: str) -> bool:
        """Drop ``holder``'s unbound claim, when ``caller`` took it; a bound one ends with its
        operation."""
        with self._lock:
            c = self._claim
            # One an apply is starting under is as good as bound.
            if c is None or c.holder != holder or c.operation or self._starting:
                return False
            _refuse_another_caller(c, caller)
            self._claim = None
            return True

    def admit(self, holder: str, running: set[str], caller: str) -> Claim | None:
        """May an apply by ``caller`` under ``holder``'s claim ("" for none) start now? Busy
        saying why not. Returns the claim admitted under (None: there is none), which `hold`
        compares with the claim when the operation is about to start."""
        with self._lock:
            claim = self._live(running)
        if claim is not None and claim.holder != holder:
            raise Claimed(f"the node is claimed by {claim.holder} (rollout {claim.rollout})")
        if holder and claim is None:
            raise Claimed(f"no live claim by {holder}: claim the node again (ClaimMig) first")
        if holder:
            _refuse_another_caller(claim, caller)
        return claim

    def hold(self, admitted: Claim | None, running: set[str]) -> None:
        """Before the apply admitted under ``admitted`` creates its operation: Claimed unless
        that claim is still the live one (no other taking since: the admission was before a
        plan, which takes time), or, for an unclaimed apply, no claim exists. Then the claim
        is held (it neither lapses nor is replaced, and no other is taken) until `bind` or
        `unhold`."""
        with self._lock:
            claim = self._live(running)
            if not _same(claim, admitted):
                if claim is None and admitted is not None:
                    raise Claimed(
                        f"the claim of {admitted.holder} lapsed while the apply was planned: "
                        "claim the node again (ClaimMig)"
                    )
                assert claim is not None
                raise Claimed(
                    f"the node is claimed by {claim.holder} (rollout {claim.rollout}) since "
                    "the apply was admitted"
                )
            self._starting += 1

    def unhold(self) -> None:
        """The held apply created no operation (refused or failed): its claim runs on."""
        with self._lock:
            self._starting -= 1

    def bind(self, admitted: Claim | None, operation: str) -> None:
        """Tie the claim the held apply was admitted under to the operation it started, and
        end the hold."""
        with self._lock:
            self._starting -= 1
            c = self._claim
            if admitted is not None and _same(c, admitted):
                assert c is not None
                self._claim = replace(c, operation=operation)


def _same(claim: Claim | None, admitted: Claim | None) -> bool:
    """The same taking: a renewal by its caller is, a claim taken again after it lapsed not."""
    if claim is None or admitted is None:
        return claim is admitted
    return claim.serial == admitted.serial  # each taking has its own; a renewal keeps it


def _refuse_another_caller(claim: Claim | None, caller: str) -> None:
    """A holder's name is the caller's word: the claim is only its taker's to use."""
    if claim is not None and claim.caller and claim.caller != caller:
        raise PermissionDenied(
            f"the claim of {claim.holder} was taken by another caller: only it may renew, "
            "release or apply under it"
        )
