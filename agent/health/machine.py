"""The health state machine of one GPU or MIG instance: pure, every transition explicit.

States are healthy, degraded and failed. What moves them (docs/health.md, "States and
transitions"):

- a *failing* signal (an XID that needs a reset or a reboot, a lost GPU, uncorrectable ECC
  errors, a failed row remap) enters failed at once, from any state;
- a *degrading* signal (an application XID, clocks held down for heat or power, a pending row
  remap) counts in a sliding window: ``degrade_events`` of them within ``degrade_window_s``
  enter degraded from healthy (hysteresis: one application XID does nothing);
- a mark clears only after ``hold_down_s`` with no signal of its severity: failed goes to
  degraded when the window still holds enough degrading signals, else to healthy; degraded goes
  to healthy; or sooner once its action is taken (a reset the agent made, a reboot);
- every change is counted: with ``max_changes_per_hour`` changes in the last hour, a mark does
  not improve (it stays at the worse state and says so) until the hour has room again. Getting
  worse is never held back.

Times are wall-clock seconds (they are persisted and compared across agent restarts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

__all__ = [
    "REBOOTED",
    "RESET",
    "Change",
    "Mark",
    "Policy",
    "Signal",
    "State",
    "action_done",
    "action_rank",
    "observe",
    "settle",
]

HOUR_S = 3600.0


class State(Enum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    FAILED = "failed"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {State.HEALTHY: 0, State.DEGRADED: 1, State.FAILED: 2}
#: actions from weakest to strongest: a failed mark keeps the strongest one it was given
_ACTIONS = ("none", "restart-application", "reset-gpu", "reboot-node")
RESET_GPU = "reset-gpu"
REBOOT_NODE = "reboot-node"
#: evidence that an action was taken: the agent reset the GPU, or the node rebooted
RESET, REBOOTED = "reset", "rebooted"
#: the actions each evidence completes (a reboot resets every GPU too), and how it is said
_DONE = {
    RESET: ((RESET_GPU,), "the GPU was reset"),
    REBOOTED: ((RESET_GPU, REBOOT_NODE), "the node was rebooted"),
}


@dataclass(frozen=True, slots=True)
class Policy:
    """The ``health.*`` settings the machine follows (agent/config/sections.py documents them)."""

    degrade_events: int = 3
    degrade_window_s: float = 300.0
    hold_down_s: float = 600.0
    max_changes_per_hour: int = 6


@dataclass(frozen=True, slots=True)
class Signal:
    """One piece of evidence against a GPU or instance."""

    #: DEGRADED (counts in the window) or FAILED (enters failed at once)
    severity: State
    #: what it is, e.g. "XID 79 (GPU has fallen off the bus)"
    reason: str
    #: what clears it: none, restart-application, reset-gpu, reboot-node
    action: str
    at: float


@dataclass(frozen=True, slots=True)
class Mark:
    state: State = State.HEALTHY
    #: what set the state (empty while healthy from the start)
    reason: str = ""
    since: float = 0.0
    action: str = "none"
    #: pods (namespace/name) on the GPU or instance when the state was entered
    pods: tuple[str, ...] = ()
    #: the last signal of the state's severity (the hold-down counts from it)
    bad_at: float = 0.0
    #: times of the latest degrading signals within the window (at most degrade_events)
    recent: tuple[float, ...] = ()
    #: the last degrading signal's reason
    recent_reason: str = ""
    #: times of the latest state changes within the last hour (at most the cap)
    changes: tuple[float, ...] = ()
    #: True while a due improvement is held back by the cap on changes
    held: bool = False

    def describe(self, policy: Policy) -> str:
        """The reason as shown: with why the mark stays, while the cap holds it."""
        if not self.held:
            return self.reason
        return (
            f"{self.reason}; held {self.state.value}: {len(self.changes)} changes in the last "
            f"hour reach health.max_changes_per_hour ({policy.max_changes_per_hour})"
        )


@dataclass(frozen=True, slots=True)
class Change:
    """A transition to publish: the state before, the mark after; ``held`` when the mark did
    not change state but a due improvement is now held back by the cap."""

    before: State
    mark: Mark
    held: bool = False


def observe(
    mark: Mark, signal: Signal, policy: Policy, pods: Sequence[str] = ()
) -> tuple[Mark, Change | None]:
    """The mark after ``signal``, and the change it made (None: no state change)."""
    at = signal.at
    mark = _pruned(mark, at, policy)
    if signal.severity is State.FAILED:
        if mark.state is State.FAILED:
            if _stronger(signal.action, mark.action):
                mark = replace(mark, reason=signal.reason, action=signal.action)
            return replace(mark, bad_at=max(mark.bad_at, at)), None
        return _enter(policy, mark, State.FAILED, signal.reason, signal.action, at, at, pods)
    recent = (*mark.recent, at)[-policy.degrade_events :]  # enough to tell "N in the window"
    mark = replace(mark, recent=recent, recent_reason=signal.reason)
    if mark.state is State.DEGRADED:
        return replace(mark, bad_at=max(mark.bad_at, at)), None
    if mark.state is State.FAILED or len(recent) < policy.degrade_events:
        return mark, None
    reason = _window_reason(signal.reason, len(recent), policy)
    return _enter(policy, mark, State.DEGRADED, reason, signal.action, at, at, pods)


def settle(
    mark: Mark, now: float, policy: Policy, pods: Sequence[str] = ()
) -> tuple[Mark, Change | None]:
    """The mark at ``now`` with no new signal: cleared once the hold-down has passed, unless
    the cap on changes holds it (then it says so, once)."""
    mark = _pruned(mark, now, policy)
    if mark.state is State.HEALTHY or now - mark.bad_at < policy.hold_down_s:
        return mark, None
    quiet = f"no new error for {now - mark.bad_at:.0f} s since {mark.reason}"
    return _improve(mark, now, policy, pods, quiet)


def action_done(
    mark: Mark, now: float, policy: Policy, pods: Sequence[str] = (), *, evidence: str
) -> tuple[Mark, Change | None]:
    """The mark once its action was taken (``evidence``: a reset the agent made, or a reboot
    since the mark): done with its hold-down (the cap on changes still holds it); a fault that
    outlasts it fails it again with its next signal. Any other mark is left to its hold-down:
    a reset is no reboot, and a mark with no action (clocks held down) has nothing done."""
    mark = _pruned(mark, now, policy)
    actions, said = _DONE[evidence]
    if mark.state is State.HEALTHY or mark.action not in actions:
        return mark, None
    return _improve(mark, now, policy, pods, f"{said} since {mark.reason}")


def _improve(
    mark: Mark, now: float, policy: Policy, pods: Sequence[str], why: str
) -> tuple[Mark, Change | None]:
    """One step better (failed to degraded while the window still holds enough degrading
    signals, else to healthy), unless the cap on changes holds it (then it says so, once)."""
    if len(mark.changes) >= policy.max_changes_per_hour:
        if mark.held:
            return mark, None
        held = replace(mark, held=True)
        return held, Change(mark.state, held, held=True)
    if mark.state is State.FAILED and len(mark.recent) >= policy.degrade_events:
        reason = f"{_window_reason(mark.recent_reason, len(mark.recent), policy)}; {why}"
        return _enter(policy, mark, State.DEGRADED, reason, "none", now, mark.recent[-1], pods)
    return _enter(policy, mark, State.HEALTHY, why, "none", now, 0.0, pods)


def _enter(
    policy: Policy,
    mark: Mark,
    state: State,
    reason: str,
    action: str,
    at: float,
    bad_at: float,
    pods: Sequence[str],
) -> tuple[Mark, Change]:
    after = replace(
        mark,
        state=state,
        reason=reason,
        since=at,
        action=action,
        pods=tuple(sorted(set(pods))),
        bad_at=bad_at,
        changes=(*mark.changes, at)[-policy.max_changes_per_hour :],
        held=False,
    )
    return after, Change(mark.state, after)


def _pruned(mark: Mark, now: float, policy: Policy) -> Mark:
    recent = tuple(t for t in mark.recent if t > now - policy.degrade_window_s)
    changes = tuple(t for t in mark.changes if t > now - HOUR_S)
    if recent == mark.recent and changes == mark.changes:
        return mark
    held = mark.held and len(changes) >= policy.max_changes_per_hour
    return replace(mark, recent=recent, changes=changes, held=held)


def _window_reason(reason: str, count: int, policy: Policy) -> str:
    return f"{reason} ({count} degrading signals within {policy.degrade_window_s:g} s)"


def _stronger(action: str, than: str) -> bool:
    return action_rank(action) > action_rank(than)


def action_rank(action: str) -> int:
    """How strong an action is: a stronger one (reboot-node) also does a weaker (reset-gpu)."""
    return _ACTIONS.index(action) if action in _ACTIONS else 0
