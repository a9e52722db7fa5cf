"""The rollout record: where a rollout is, in a JSON file the user names.

The coordinator keeps no state of its own (the thin rule), so a rollout's progress lives where
the user can see and keep it: this file, rewritten atomically at every change. It holds what is
being applied and each node's state, attempt and operation, so ``fleet resume FILE`` carries a
halted or interrupted rollout on: finished nodes are skipped, failed ones retried, and nodes
left mid-operation are re-attached (the same request id returns the agent's same operation).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.coordinator.rollout.schedule import NODE_TIMEOUT_MAX_S, NodeState, parse_max_unavailable
from agent.durable import replace_file
from agent.errors import FieldViolation, InvalidSpec

__all__ = ["KINDS", "ON_UNHEALTHY", "NodeRecord", "RolloutRecord"]

VERSION = 1
KINDS = ("mig", "power", "share", "prewarm")
#: what a node that turns unhealthy (a GPU failed) during the rollout does: ``stop`` halts the
#: rollout, ``skip`` fails that node alone (max-failures decides). The first is the default.
ON_UNHEALTHY = ("stop", "skip")


@dataclass
class NodeRecord:
    state: str = NodeState.PENDING.value
    attempt: int = 1
    operation: str = ""
    detail: str = ""
    started: float | None = None
    finished: float | None = None


@dataclass
class RolloutRecord:
    """One rollout. ``spec`` is what to apply, as JSON-able data (by kind)."""

    kind: str
    spec: dict[str, Any]
    selector: str
    max_unavailable: str
    max_failures: int
    node_timeout_s: float
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    created: float = field(default_factory=time.time)
    halted: str | None = None
    #: ON_UNHEALTHY; records from before the field read as the default
    on_unhealthy: str = ON_UNHEALTHY[0]
    path: Path | None = field(default=None, compare=False)

    @classmethod
    def start(
        cls, kind: str, spec: dict[str, Any], nodes: Sequence[str], **fields: Any
    ) -> RolloutRecord:
        record = cls(kind, spec, **fields)
        record.nodes = {n: NodeRecord() for n in nodes}
        return record

    def state(self, node: str) -> NodeState:
        return NodeState(self.nodes[node].state)

    def states(self) -> Mapping[str, NodeState]:
        return {n: NodeState(r.state) for n, r in self.nodes.items()}

    def request_id(self, node: str) -> str:
        """Stable per node and attempt: a retry of the same attempt finds the same operation."""
        return f"rollout-{self.id}/{node}/{self.nodes[node].attempt}"

    def resume(self) -> list[str]:
        """Make the record ready to carry on; returns the node order to schedule.

        Nodes left mid-operation come first and keep their attempt, so they re-attach to the
        agent's operation; failed nodes get a new attempt (a new operation); finished ones stay.
        """
        self.halted = None
        running = [n for n, r in self.nodes.items() if r.state == NodeState.RUNNING.value]
        for rec in self.nodes.values():
            if rec.state == NodeState.FAILED.value:
                rec.attempt += 1
            if rec.state in (NodeState.FAILED.value, NodeState.RUNNING.value):
                rec.state = NodeState.PENDING.value
                rec.finished = None
        return running + [n for n in self.nodes if n not in running]

    def check_limits(self) -> None:
        """The limits as the flags take them; InvalidSpec naming the record's fields (the file
        is the user's, and may be edited by hand)."""
        bad = []
        try:
            parse_max_unavailable(str(self.max_unavailable), max(1, len(self.nodes)))
        except InvalidSpec as exc:
            bad.append(FieldViolation("record.max_unavailable", str(exc)))
        failures = self.max_failures
        if isinstance(failures, bool) or not isinstance(failures, int) or failures < 0:
            bad.append(FieldViolation("record.max_failures", "an integer, 0 or more (0: never)"))
        timeout = self.node_timeout_s
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 1 <= timeout <= NODE_TIMEOUT_MAX_S
        ):
            bad.append(
                FieldViolation("record.node_timeout_s", f"seconds, 1 to {NODE_TIMEOUT_MAX_S}")
            )
        if bad:
            raise InvalidSpec(
                f"rollout record {self.path}: {bad[0]} (a flag of `fleet resume` replaces it)",
                bad,
            )

    # -- the file ----------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("path")
        data["version"] = VERSION
        return data

    def save(self) -> None:
        if self.path is None:
            return
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        replace_file(self.path, (text + "\n").encode())  # a crash leaves one record, whole

    @classmethod
    def load(cls, path: Path) -> RolloutRecord:
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise InvalidSpec(
                f"cannot read rollout record {path}: {exc.strerror}",
                [FieldViolation("record", str(exc))],
            ) from exc
        except ValueError as exc:
            raise InvalidSpec(
                f"rollout record {path} is not JSON: {exc}", [FieldViolation("record", str(exc))]
            ) from exc
        try:
            if data.pop("version") != VERSION or data["kind"] not in KINDS:
                raise ValueError("version or kind")
            if data.get("on_unhealthy", ON_UNHEALTHY[0]) not in ON_UNHEALTHY:
                raise ValueError(f"on_unhealthy {data['on_unhealthy']!r}")
            nodes = {str(n): NodeRecord(**r) for n, r in data.pop("nodes").items()}
            for r in nodes.values():
                NodeState(r.state)
            record = cls(**data, nodes=nodes, path=path)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidSpec(
                f"{path} is not a rollout record of this version ({exc})",
                [FieldViolation("record", "written by `gpu-agent fleet apply --record`")],
            ) from exc
        return record
