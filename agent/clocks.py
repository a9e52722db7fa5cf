"""Carrying times across a restart without letting a clock step move them.

Timers, retries and durations run on ``time.monotonic``, which no NTP or admin step moves. What
must outlive the process is stored as wall-clock time (the only clock two processes share), and
turned back into a monotonic time once, when a process first reads it. These are the two
conversions, pure so that tests step the clocks by hand.
"""

from __future__ import annotations

__all__ = ["deadline_from_wall", "start_from_wall"]


def deadline_from_wall(
    due_wall: float, *, wall_now: float, mono_now: float, bound_s: float
) -> float:
    """The monotonic deadline for a stored wall-clock one: no earlier than now and no later than
    ``bound_s`` from now (the longest wait it was ever given), so a clock stepped forward cannot
    make it run early by more than what was left, and one stepped back cannot make it run late."""
    return mono_now + min(max(0.0, due_wall - wall_now), bound_s)


def start_from_wall(started_wall: float, *, wall_now: float, mono_now: float) -> float:
    """The monotonic start of something that began at a stored wall-clock time (never in the
    future: a clock stepped back cannot make a duration negative)."""
    return mono_now - max(0.0, wall_now - started_wall)
