"""What the start does about the work the last process left, before the API serves: the
previous process may have been killed in the middle of long work. The MIG service restores
what a killed apply left (from its journal) and the apply's operation records how it ended
(finished, rolled back, or failed with the reason); every other operation still pending or
running is failed as interrupted with the reason. None stays "running" forever."""

from __future__ import annotations

import logging

from agent.api.mig import interrupted_apply
from agent.api.operations import MIG_APPLY
from agent.mig.apply import Progress
from agent.mig.service import MigService
from agent.state import StateStore

log = logging.getLogger(__name__)

__all__ = ["INTERRUPTED_REASON", "recover_at_start"]

INTERRUPTED_REASON = (
    "the agent stopped while this operation ran (killed or restarted) and could not resume it"
)


def recover_at_start(
    state: StateStore, mig: MigService, *, attached: bool, progress: Progress | None = None
) -> None:
    """Let the MIG service restore what a killed apply left, record on the apply's operation
    how it ended, then fail whatever else was left pending or running. Without a driver (not
    ``attached``) the MIG journal waits for the attach (agent/mig/recovery.py). ``progress``
    hears each MIG step before it is made."""
    if state.read_only is not None:
        _recover_later(state, mig)
        return
    outcomes = mig.recover(progress) if attached else ()
    for op in state.list_operations(kind=MIG_APPLY, done=False):
        ended = state.update_operation(op.id, **interrupted_apply(outcomes))
        log.warning("operation %s (mig.apply) was interrupted: it %s", op.id, ended.state)
    for op in state.mark_interrupted_operations(INTERRUPTED_REASON):
        log.warning("operation %s (%s) was interrupted by the last stop", op.id, op.kind)


def _recover_later(state: StateStore, mig: MigService) -> None:
    """Read-only: recovery writes (the journal, the operations), so nothing is recovered;
    a MIG change cut short is said in the state's health (MIG changes are refused anyway,
    as every change is) and recovered at the first start with a writable state dir."""
    if mig.interrupted():
        left = (
            "a MIG apply was cut short and its journal cannot be recovered (rolled back or "
            "forward) without writing: the GPUs may be between layouts until the agent "
            "restarts with a writable state dir"
        )
        log.error("%s", left)
        state.note(left)
    undone = state.list_operations(done=False)
    if undone:
        state.note(
            f"{len(undone)} operation(s) the last stop left unfinished are shown as they "
            "were recorded, until the agent can mark them interrupted"
        )
