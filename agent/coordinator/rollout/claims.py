"""Claim-then-verify: how a rollout keeps max-unavailable when no Lease keeps other
coordinators out (docs/coordinator.md, "Two replicas without a Lease").

Before it changes a node, a rollout claims it on its agent (which changes nothing and admits no
other holder's change there), then reads every node's claim in the rollout's scope. Only if the
claimed nodes (its own included, nodes that do not answer counted as claimed) fit within
max-unavailable does it go on; otherwise it releases the claim and tries again after a jittered,
growing pause. Of two coordinators claiming at once the later one's read sees the earlier's
claim, and a claim lives on the agent until the change it admitted ends, so no moment has more
changing nodes than the limit.

The reads are shared: nodes of one wave claim at about the same time, and one read that began
after a node's claim was placed verifies it as well as a read of its own would, so a wave of N
nodes costs about two reads of the scope, not N (`ClaimReads`). The scope is what the caller
says counts against the limit (a reconcile pass: the rule's nodes; a `fleet apply`: the nodes
it selected), never the whole fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Mapping

from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.rollout.execute import Notes
from agent.coordinator.rollout.record import RolloutRecord
from agent.coordinator.rollout.schedule import parse_max_unavailable
from agent.errors import AgentError, Busy

__all__ = ["ClaimReads", "claimed_nodes", "hold", "release"]

#: the first pause after a refused claim, and the longest
FIRST_PAUSE_S = 0.2
MAX_PAUSE_S = 5.0


async def claimed_nodes(fleet: Fleet, scope: Mapping[str, Target]) -> dict[str, str]:
    """Node -> who claims it, for every claimed node in ``scope``; a node that does not
    answer is counted as claimed ("unknown": it may be changing)."""

    async def one(node: str) -> tuple[str, str | None]:
        try:
            claim = await fleet.client(scope[node]).mig_claim()
        except AgentError:
            return node, "unknown (no answer)"
        if claim is None:
            return node, None
        return node, claim.holder or f"an apply outside any rollout ({claim.operation})"

    found = await asyncio.gather(*(one(n) for n in sorted(scope)))
    return {node: who for node, who in found if who is not None}


class ClaimReads:
    """Reads of ``scope``'s claims shared by the nodes claiming at once (one rollout)."""

    def __init__(self, fleet: Fleet, scope: Mapping[str, Target]) -> None:
        self._fleet = fleet
        self._scope = dict(scope)
        #: claims placed so far, numbered; and the read in flight with the number it covers
        self._placed = 0
        self._reading: asyncio.Future[dict[str, str]] | None = None
        self._covers = 0

    async def after_claim(self) -> dict[str, str]:
        """The claims as read by a read that began after the caller's claim was placed."""
        self._placed += 1
        mine = self._placed
        while True:
            if self._reading is None or (self._reading.done() and self._covers < mine):
                self._covers = self._placed  # every claim placed so far precedes this read
                self._reading = asyncio.ensure_future(claimed_nodes(self._fleet, self._scope))
            reading, covers = self._reading, self._covers
            found = await asyncio.shield(reading)
            if covers >= mine:
                return dict(found)
            # That read began before this claim was placed: read again once it is done.


async def hold(
    fleet: Fleet,
    scope: Mapping[str, Target],
    record: RolloutRecord,
    node: str,
    holder: str,
    notes: Notes,
    *,
    draw: Callable[[], float] = random.random,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    reads: ClaimReads | None = None,
) -> None:
    """Return once ``holder`` claims ``node`` and the claims in ``scope`` fit the limit;
    ``reads`` shares the verifying reads with the rollout's other nodes."""
    reads = reads or ClaimReads(fleet, scope)
    limit = parse_max_unavailable(record.max_unavailable, len(record.nodes))
    client = fleet.client(scope[node])
    pause = FIRST_PAUSE_S
    while True:
        try:
            await client.claim_mig(holder, record.id, record.max_unavailable)
        except Busy as exc:
            notes.progress(f"waiting: {exc}")
        else:
            claimed = await reads.after_claim()
            claimed[node] = holder
            if len(claimed) <= limit:
                return
            await release(fleet, scope[node], holder)
            others = ", ".join(f"{n} by {who}" for n, who in sorted(claimed.items()) if n != node)
            notes.progress(f"waiting: max-unavailable {limit} is taken ({others})")
        await sleep(pause * (0.5 + draw()))  # spread out so two claimers do not meet again
        pause = min(2 * pause, MAX_PAUSE_S)


async def release(fleet: Fleet, target: Target, holder: str) -> None:
    """Drop an unbound claim; if that fails it ends on its own (its time to live)."""
    with contextlib.suppress(AgentError):
        await fleet.client(target).release_mig_claim(holder)
