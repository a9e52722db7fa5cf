"""The MIG apply journal: what each entry says, and how a history of entries reads back.

An apply writes, in scope ``mig:apply`` of the state store: one ``begin`` (the operation, the GPUs
it will change and what each should become), then per GPU a ``gpu`` entry with its snapshot, a
``step`` before every mutation and a ``done`` after its last one. A failure writes ``rollback``
before restoring; a SIGTERM writes ``suspend`` (the apply is finished after the restart). A
finished or rolled-back apply clears the scope.

A journal can hold several applies (one whose rollback failed, then the next; or a database from
an older agent), so :func:`records` splits it at each ``begin``: every entry belongs to the apply
that began last before it, and recovery reads each apply from its own entries only.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.errors import AgentError
from agent.gpu.types import GpuInfo
from agent.mig.desired import Desired
from agent.mig.outcomes import GpuOutcome
from agent.mig.state import GpuMigState

log = logging.getLogger(__name__)

SCOPE = "mig:apply"
#: The GPUs whose pending MIG mode waits for a reboot of this passthrough VM, as the apply that
#: left it pending found (the driver says so only to the call that sets the mode): one
#: ``{"uuid": ...}`` entry each, kept across restarts (`remember_reboot`).
REBOOT_SCOPE = "mig:reboot"


class Journal(Protocol):
    """The part of agent.state.StateStore the MIG journal uses."""

    def journal_append(self, scope: str, entry: dict[str, Any]) -> int: ...

    def journal_entries(self, scope: str) -> list[tuple[int, dict[str, Any]]]: ...

    def journal_clear(self, scope: str) -> None: ...


def desired_to_dict(desired: Desired) -> dict[str, Any]:
    return {
        "mig_enabled": desired.mig_enabled,
        "counts": [[name, n] for name, n in desired.counts],
        "source": desired.source,
    }


def desired_from_dict(data: Mapping[str, Any]) -> Desired:
    return Desired(
        bool(data["mig_enabled"]),
        tuple((str(name), int(n)) for name, n in data["counts"]),
        str(data.get("source", "")),
    )


def begin_entry(
    operation: str, desired: Mapping[str, Desired], *, force: bool, skip_reset: bool
) -> dict[str, Any]:
    """``desired`` maps each GPU the apply changes (by UUID, in order) to its wanted layout."""
    return {
        "event": "begin",
        "operation": operation,
        "gpus": list(desired),
        "desired": {uuid: desired_to_dict(d) for uuid, d in desired.items()},
        "force": force,
        "skip_reset": skip_reset,
    }


def gpu_entry(gpu: GpuInfo, before: GpuMigState) -> dict[str, Any]:
    """A GPU the apply starts on, with the snapshot a rollback returns it to."""
    return {"event": "gpu", "uuid": gpu.uuid, "index": gpu.index, "before": before.to_dict()}


@dataclass
class ApplyRecord:
    """One apply as its own journal entries tell it."""

    operation: str = "mig apply"
    planned: list[str] = field(default_factory=list)
    #: wanted layout per planned GPU; empty in journals of agents that did not record it.
    desired: dict[str, Desired] = field(default_factory=dict)
    force: bool = False
    skip_reset: bool = False
    #: snapshot of each GPU the apply started on, in the order it started them.
    befores: dict[str, GpuMigState] = field(default_factory=dict)
    #: each begun GPU's index then: what names one that is lost now (its UUID is not known)
    indices: dict[str, int] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    rolling_back: bool = False
    suspended: bool = False

    @property
    def finished(self) -> bool:
        """Every planned GPU reached its layout, and nothing began to undo it."""
        return bool(self.planned) and set(self.planned) <= self.done and not self.rolling_back

    @property
    def resumable(self) -> bool:
        """Stopped by SIGTERM between two mutations, knowing what each GPU should become."""
        return (
            self.suspended
            and not self.rolling_back
            and set(self.planned) <= set(self.desired)
            and bool(self.planned)
        )


def records(entries: Iterable[Mapping[str, Any]]) -> list[ApplyRecord]:
    """The applies in a journal, oldest first, each with only the entries it wrote."""
    out: list[ApplyRecord] = []
    for entry in entries:
        event = entry.get("event")
        if event == "begin" or not out:
            out.append(ApplyRecord())
        record = out[-1]
        if event == "begin":
            record.operation = str(entry.get("operation") or "mig apply")
            record.planned = [str(u) for u in entry.get("gpus", [])]
            record.desired = {
                str(u): desired_from_dict(d) for u, d in (entry.get("desired") or {}).items()
            }
            record.force = bool(entry.get("force", False))
            record.skip_reset = bool(entry.get("skip_reset", False))
        elif event == "gpu":
            # The first snapshot of a GPU within its apply is the one to return to.
            record.befores.setdefault(str(entry["uuid"]), GpuMigState.from_dict(entry["before"]))
            record.indices.setdefault(str(entry["uuid"]), int(entry.get("index", -1)))
        elif event == "done":
            record.done.add(str(entry["uuid"]))
        elif event == "rollback":
            record.rolling_back = True
        elif event == "suspend":
            record.suspended = True
    return out


def reboot_waits(journal: Journal) -> frozenset[str]:
    """The GPUs (UUIDs) whose pending mode waits for a reboot of this VM (`REBOOT_SCOPE`)."""
    return frozenset(str(e.get("uuid")) for _, e in journal.journal_entries(REBOOT_SCOPE))


def remember_reboot(journal: Journal, outcomes: Iterable[GpuOutcome]) -> None:
    """Keep which of the GPUs an apply or restore reached wait for a reboot of this VM, and
    forget the others; a state dir that takes no write keeps what it had (said in the log)."""
    seen = {g.uuid: g.reboot for g in outcomes}
    if not seen:
        return
    try:
        kept = (reboot_waits(journal) - set(seen)) | {u for u, waits in seen.items() if waits}
        journal.journal_clear(REBOOT_SCOPE)
        for uuid in sorted(kept):
            journal.journal_append(REBOOT_SCOPE, {"uuid": uuid})
    except (AgentError, sqlite3.Error) as exc:
        log.warning("which GPUs wait for a VM reboot is not kept: %s", exc)
