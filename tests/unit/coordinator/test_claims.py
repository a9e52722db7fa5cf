"""Claim-then-verify against agents' real claim books (agent.mig.claim): a coordinator that
finds max-unavailable taken by another holder's claim releases its own, changes nothing, and
tries again after a jittered, growing pause; a node that does not answer counts as claimed."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from agent._proto.gpuagent.v1 import mig_pb2
from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.rollout import claims
from agent.coordinator.rollout.record import RolloutRecord
from agent.errors import AgentError
from agent.mig.claim import ClaimBook

#: the coordinators' identity: replicas of one Deployment share its certificate
COORDINATORS = "spiffe://cluster.local/ns/gpu-agent/sa/gpu-agent-coordinator"


class Agent:
    """A fake agent's claim calls, served by the agent's own claim book."""

    def __init__(self) -> None:
        self.book = ClaimBook()
        self.down = False

    async def claim_mig(self, holder: str, rollout: str, max_unavailable: str) -> Any:
        return self.book.take(holder, rollout, max_unavailable, 0, set(), COORDINATORS)

    async def mig_claim(self) -> mig_pb2.MigClaim | None:
        if self.down:
            raise AgentError("did not answer")
        claim = self.book.current(set())
        return None if claim is None else mig_pb2.MigClaim(holder=claim.holder)

    async def release_mig_claim(self, holder: str) -> bool:
        return self.book.release(holder, COORDINATORS)


class Notes:
    timed_out = False

    def __init__(self) -> None:
        self.said: list[str] = []

    def operation(self, name: str) -> None:
        """The rollout's operation names are not what these tests look at."""

    def progress(self, text: str) -> None:
        self.said.append(text)


def setup(names: list[str]) -> tuple[dict[str, Agent], Fleet, RolloutRecord]:
    agents = {n: Agent() for n in names}
    fleet = cast(Fleet, type("F", (), {"client": lambda self, t: agents[t]})())
    record = RolloutRecord.start(
        "mig", {}, names, selector="", max_unavailable="1", max_failures=1, node_timeout_s=60.0
    )
    return agents, fleet, record


def test_a_taken_budget_releases_the_claim_and_retries_after_a_jittered_pause() -> None:
    agents, fleet, record = setup(["n1", "n2", "n3"])
    agents["n2"].book.take("other", "r0", "1", 0, set(), COORDINATORS)  # another's change
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        assert agents["n1"].book.current(set()) is None  # released while it waits
        if len(pauses) == 2:
            agents["n2"].book.release("other", COORDINATORS)  # the other's change ended

    notes = Notes()
    scope = cast(Any, {n: n for n in agents})
    asyncio.run(claims.hold(fleet, scope, record, "n1", "me", notes, draw=lambda: 0.0, sleep=sleep))
    assert pauses == [0.1, 0.2]  # 0.2 s doubling, times (0.5 + draw)
    held = agents["n1"].book.current(set())
    assert held is not None and held.holder == "me"
    assert notes.said[0] == "waiting: max-unavailable 1 is taken (n2 by other)"


def test_a_node_that_does_not_answer_counts_as_claimed() -> None:
    agents, fleet, _ = setup(["n1", "n2"])
    agents["n2"].down = True
    found = asyncio.run(claims.claimed_nodes(fleet, cast(Any, {n: n for n in agents})))
    assert found == {"n2": "unknown (no answer)"}
