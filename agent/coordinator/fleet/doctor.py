"""``fleet doctor``: every agent's checks at once, and the fleet's problems grouped.

One ``Doctor`` call per agent, concurrently (`Fleet.each`); then, pure: the checks that are
not ok grouped by (duty, check, state) with the nodes that have them, most nodes first, so an
operator reads "37 nodes: telemetry/profiling failed" before any single node. A node that does
not answer is a group of its own (``agent/reachable``), never dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import Target
from agent.wire.doctor import Check, CheckState, DoctorReport

__all__ = ["Finding", "NodeDoctor", "doctor_document", "findings", "sweep"]

#: Node names shown per group in the table; JSON carries them all.
SHOWN_NODES = 5
UNREACHABLE_FIX = "check the agent pod on the node (kubectl -n gpu-agent get pods -o wide)"


@dataclass(frozen=True, slots=True)
class NodeDoctor:
    """One node's answer: its report, or why there is none."""

    name: str
    address: str
    report: DoctorReport | None
    error: str | None = None

    @property
    def worst(self) -> CheckState:
        return self.report.worst if self.report is not None else CheckState.FAILED

    def problems(self) -> tuple[Check, ...]:
        if self.report is None:
            return (
                Check("agent", "reachable", CheckState.FAILED, self.error or "", UNREACHABLE_FIX),
            )
        return tuple(c for c in self.report.checks if c.state is not CheckState.OK)


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem shared by nodes: a check with the most common fix and, as an example, the
    evidence of a node that fix is for, and the nodes that have it. ``other_fix``: the nodes
    whose own doctor gives another fix (another cause of the same check, e.g. health/xid
    without NVML beside XID 79): the fix shown is not theirs."""

    check: Check
    nodes: tuple[str, ...]
    other_fix: tuple[str, ...] = ()


async def sweep(fleet: Fleet, targets: Sequence[Target] | None = None) -> tuple[NodeDoctor, ...]:
    chosen = await fleet.targets() if targets is None else targets
    outcomes = await fleet.each(chosen, lambda client: client.doctor())
    nodes = [
        NodeDoctor(
            o.target.node or (o.value.node if o.value else "") or o.target.address,
            o.target.address,
            o.value,
            None if o.value is not None else str(o.error),
        )
        for o in outcomes
    ]
    return tuple(sorted(nodes, key=lambda n: n.name))


def findings(nodes: Sequence[NodeDoctor]) -> list[Finding]:
    grouped: dict[tuple[str, str, CheckState], list[tuple[str, Check]]] = {}
    for node in nodes:
        for check in node.problems():
            grouped.setdefault((check.duty, check.name, check.state), []).append((node.name, check))
    out = []
    for (duty, name, state), found in grouped.items():
        fix = Counter(c.fix for _, c in found).most_common(1)[0][0]
        example = next(c for _, c in found if c.fix == fix)  # the evidence that fix answers
        names = tuple(sorted(n for n, _ in found))
        other = tuple(sorted(n for n, c in found if c.fix != fix))
        out.append(Finding(Check(duty, name, state, example.evidence, fix), names, other))
    return sorted(
        out, key=lambda f: (-f.check.state.rank, -len(f.nodes), f.check.duty, f.check.name)
    )


def doctor_document(nodes: Sequence[NodeDoctor]) -> dict[str, Any]:
    """What ``fleet doctor -o json`` prints (and the table renders)."""
    worst = Counter(n.worst.value for n in nodes)
    return {
        "nodes": [
            {
                "name": n.name,
                "address": n.address,
                "state": n.worst.value,
                "error": n.error,
                "failed": [f"{c.duty}/{c.name}" for c in n.problems() if c.state.rank == 2],
                "degraded": [f"{c.duty}/{c.name}" for c in n.problems() if c.state.rank == 1],
            }
            for n in nodes
        ],
        "findings": [
            {
                "duty": f.check.duty,
                "name": f.check.name,
                "state": f.check.state.value,
                "count": len(f.nodes),
                "nodes": list(f.nodes),
                "evidence": f.check.evidence,
                "fix": f.check.fix,
                "other_fix_nodes": list(f.other_fix),
            }
            for f in findings(nodes)
        ],
        "totals": {
            "nodes": len(nodes),
            **{s.value: worst.get(s.value, 0) for s in CheckState},
        },
    }
