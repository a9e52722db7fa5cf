"""The doctor's answer on the wire: one record per check, and the node's report.

The agent's checks (agent/doctor) build these records; `doctor_pb` puts them on the wire and
`report_from` reads them back for the CLI and the coordinator, so both render the same
records whether the agent runs or is embedded in the command.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agent._proto.gpuagent.v1 import agent_pb2
from agent.safeyaml import capped

__all__ = ["Check", "CheckState", "DoctorReport", "doctor_pb", "report_from"]


class CheckState(enum.Enum):
    """Ordered by how bad: a report is as bad as its worst check."""

    OK = "ok"
    DEGRADED = "degraded"
    FAILED = "failed"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {CheckState.OK: 0, CheckState.DEGRADED: 1, CheckState.FAILED: 2}
_TO_PB = {
    CheckState.OK: agent_pb2.DOCTOR_STATE_OK,
    CheckState.DEGRADED: agent_pb2.DOCTOR_STATE_DEGRADED,
    CheckState.FAILED: agent_pb2.DOCTOR_STATE_FAILED,
}
_FROM_PB = {v: k for k, v in _TO_PB.items()}
#: Bounds of what one check says: evidence and fix are one line each, never a dump.
MAX_TEXT = 600


@dataclass(frozen=True, slots=True)
class Check:
    """One read-only check of what a duty needs: its state, what was found, the one fix."""

    duty: str
    name: str
    state: CheckState
    evidence: str
    fix: str = ""


@dataclass(frozen=True, slots=True)
class DoctorReport:
    node: str
    checks: tuple[Check, ...]

    @property
    def worst(self) -> CheckState:
        return max((c.state for c in self.checks), key=lambda s: s.rank, default=CheckState.OK)


def _bounded(text: str) -> str:
    return capped(" ".join(text.split()), MAX_TEXT)  # one line: a log line or a table cell


def doctor_pb(report: DoctorReport) -> agent_pb2.DoctorResponse:
    return agent_pb2.DoctorResponse(
        node=report.node,
        checks=[
            agent_pb2.DoctorCheck(
                duty=c.duty,
                name=c.name,
                state=_TO_PB[c.state],
                evidence=_bounded(c.evidence),
                fix=_bounded(c.fix),
            )
            for c in report.checks
        ],
    )


def report_from(pb: agent_pb2.DoctorResponse) -> DoctorReport:
    """An unknown state (a newer agent's) reads as failed: never a false ok."""
    return DoctorReport(
        node=pb.node,
        checks=tuple(
            Check(c.duty, c.name, _FROM_PB.get(c.state, CheckState.FAILED), c.evidence, c.fix)
            for c in pb.checks
        ),
    )
