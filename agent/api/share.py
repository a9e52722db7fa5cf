"""Each caller's fair share of the API: calls in flight, open streams, and how long a stream lives.

Pure bookkeeping, no gRPC: the interceptor takes a `Slot` for every admitted call and releases
it when the call ends. A caller is one `Caller` (an mTLS identity, the loopback listener, the
Unix socket). Two shares:

* the **reserved** share: the Unix socket (the node's admin) and callers holding the admin role
  (the coordinator). Each may have ``reserved_calls`` in flight; they are never counted against a
  door and their streams are never cut, so whatever other callers do, these are served;
* everyone else: at most ``max_calls_per_caller`` calls in flight, of them at most
  ``max_streams_per_caller`` streams, and all of them together at most ``max_calls_per_door`` on
  one door. Their streams end after ``stream_max_s``.

A call past a limit is refused at once (RESOURCE_EXHAUSTED with the limit's name), never queued:
a queue would let a flood delay the calls behind it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TypeVar

from agent.api.auth import Caller, Door, Role
from agent.config import ApiSettings

__all__ = ["FairShare", "Refusal", "Slot"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a call was not admitted, said to the caller."""

    message: str


class Slot:
    """One admitted call's place; `release` it exactly once when the call ends."""

    __slots__ = ("_released", "_share", "caller", "door", "lifetime_s", "stream")

    def __init__(
        self,
        share: FairShare,
        caller: Caller,
        door: Door | None,
        stream: bool,
        lifetime_s: float | None,
    ) -> None:
        self._share = share
        self._released = False
        self.caller = caller
        self.door = door  # None: the reserved share, not counted against a door
        self.stream = stream
        #: how long the stream may stay open; None: as long as the caller wants
        self.lifetime_s = lifetime_s

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._share._release(self)


def reserved(caller: Caller, grants: frozenset[Role]) -> bool:
    return caller.door is Door.LOCAL or Role.ADMIN in grants


class FairShare:
    """Counts calls per caller and per door; the event loop is its only user (no lock)."""

    def __init__(self, settings: ApiSettings) -> None:
        self._settings = settings
        self._calls: Counter[Caller] = Counter()
        self._streams: Counter[Caller] = Counter()
        self._doors: Counter[Door] = Counter()

    def take(self, caller: Caller, grants: frozenset[Role], stream: bool) -> Slot | Refusal:
        limits = self._settings
        if reserved(caller, grants):
            if self._calls[caller] >= limits.reserved_calls:
                return Refusal(
                    f"{caller} has {limits.reserved_calls} calls in flight, its most "
                    "(api.reserved_calls); retry when one ends"
                )
            slot = Slot(self, caller, None, stream, None)
        else:
            refusal = self._refusal(caller, stream)
            if refusal is not None:
                return Refusal(refusal)
            slot = Slot(self, caller, caller.door, stream, limits.stream_max_s if stream else None)
            self._doors[caller.door] += 1
        self._calls[caller] += 1
        if stream:
            self._streams[caller] += 1
        return slot

    def _refusal(self, caller: Caller, stream: bool) -> str | None:
        limits = self._settings
        if stream and self._streams[caller] >= limits.max_streams_per_caller:
            return (
                f"{caller} holds {limits.max_streams_per_caller} open streams, its most "
                "(api.max_streams_per_caller); close one first"
            )
        if self._calls[caller] >= limits.max_calls_per_caller:
            return (
                f"{caller} has {limits.max_calls_per_caller} calls in flight, its most "
                "(api.max_calls_per_caller); retry when one ends"
            )
        if self._doors[caller.door] >= limits.max_calls_per_door:
            return (
                f"the {caller.door.value} door has {limits.max_calls_per_door} calls in flight, "
                "its most (api.max_calls_per_door); retry later"
            )
        return None

    def _release(self, slot: Slot) -> None:
        _decrement(self._calls, slot.caller)
        if slot.stream:
            _decrement(self._streams, slot.caller)
        if slot.door is not None:
            _decrement(self._doors, slot.door)


_K = TypeVar("_K")


def _decrement(counter: Counter[_K], key: _K) -> None:
    """Down by one; a key at zero is removed, so callers that went away leave nothing behind."""
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
