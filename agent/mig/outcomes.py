"""What a MIG apply, restore or recovery did, GPU by GPU: the records MigService answers with
and the API and the CLI read (agent/wire/mig.py)."""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import AgentError, Conflict

__all__ = [
    "NOT_ANSWERING",
    "UNROLLED_FIX",
    "ApplyResult",
    "GpuOutcome",
    "NotApplied",
    "RecoveryOutcome",
    "Unrolled",
    "unrecovered",
    "unrolled_said",
    "unrolled_status",
]

_PENDING = "MIG mode change pending"

#: The statuses of a GPU the config selects that does not answer: never applied.
NOT_ANSWERING = ("lost", "unread")


class NotApplied(AgentError):
    """An apply or restore that ended without error but not at the config: a GPU's MIG mode
    change waits for a reset or a reboot, or a GPU it selects is lost (`ApplyResult.not_done`).
    Its operation ends failed with this, keeping what it did (docs/mig.md)."""


class Unrolled(Conflict):
    """Refused over an earlier apply's journal whose rollback failed (`unrecovered`). An apply
    retries that rollback first, so a plan's refusal holds only until a retry succeeds: the
    coordinator, refused a plan so, goes on to the apply (agent/coordinator/rollout)."""


def unrecovered(what: str, failed: str) -> Unrolled:
    """The refusal of ``what`` (an apply, and its plan) over an earlier apply's journal whose
    rollback failed (``failed``: per GPU, why): its snapshots are the layouts to return to."""
    return Unrolled(
        f"{what} not applied: an interrupted apply could not be rolled back yet ({failed}). "
        "Nothing was changed; the journal is kept and the next apply or agent start retries "
        "the rollback"
    )


#: What to do about a journal whose rollback failed (`unrolled_said`).
UNROLLED_FIX = (
    "fix what failed the rollback (the agent's log names it: a process holding the GPU, a "
    "driver error), then run `gpu-agent mig apply` again or restart the agent: either retries "
    "the rollback first"
)


def unrolled_said(failed: str) -> str:
    """A kept journal whose rollback failed (``failed``: per GPU, why; "" for none), for the
    node's status and doctor: which GPUs, and that every apply is refused until it succeeds."""
    if not failed:
        return ""
    return (
        f"an interrupted MIG apply could not be rolled back, its journal is kept ({failed}): "
        "every MIG apply is refused until the rollback succeeds"
    )


def unrolled_status(failed: str) -> str:
    """`unrolled_said` and what to do: the node's "mig" component ("" when none is kept)."""
    said = unrolled_said(failed)
    return f"{said}; {UNROLLED_FIX}" if said else ""


@dataclass(frozen=True, slots=True)
class GpuOutcome:
    gpu: int
    uuid: str
    #: "unchanged" | "applied" | "pending" | "lost" | "unread" (selected, not answering; unread:
    #: not lost, but a read of it fails, its message naming the call)
    status: str
    kept: int = 0
    destroyed: int = 0
    created: int = 0
    message: str = ""
    #: pending until this (passthrough) VM reboots, not until a GPU reset
    reboot: bool = False


@dataclass(frozen=True, slots=True)
class RecoveryOutcome:
    """What ``recover`` did to one GPU an interrupted apply had started to change."""

    gpu: int
    uuid: str
    action: str  # "rolled-back" | "untouched" | "completed" | "failed"
    detail: str


@dataclass(frozen=True, slots=True)
class ApplyResult:
    config: str
    gpus: tuple[GpuOutcome, ...]
    mutations: int
    recovered: tuple[RecoveryOutcome, ...] = ()
    #: what was done so the device plugin advertises the new layout, or why not ("": no GPU
    #: changed, or no device plugin serves the node)
    device_plugin: str = ""
    #: when the config selected no GPU (nothing applied): why its assert fails, one line each
    assert_mismatches: tuple[str, ...] = ()

    @property
    def pending(self) -> tuple[GpuOutcome, ...]:
        return tuple(g for g in self.gpus if g.status == "pending")

    @property
    def lost(self) -> tuple[GpuOutcome, ...]:
        """GPUs the config selects (or may) that do not answer (lost or unread): not applied."""
        return tuple(g for g in self.gpus if g.status in NOT_ANSWERING)

    def not_done(self) -> str:
        """Why the config is not yet what the GPUs hold, in one line ("" when it is): each
        pending GPU with what applies its mode (a GPU reset, a reboot of this passthrough VM),
        then each lost GPU."""
        parts = []
        reboot = [str(g.gpu) for g in self.pending if g.reboot]
        if reboot:
            parts.append(
                f"{_PENDING}: a reboot of this (passthrough) VM applies it on GPU "
                f"{', '.join(reboot)}"
            )
        for g in self.pending:
            if not g.reboot:  # its message says which reset, and how
                parts.append(f"{_PENDING}: {g.message.replace(_PENDING + '; ', '')}")
        parts += [g.message for g in self.lost]
        return "; ".join(parts)
