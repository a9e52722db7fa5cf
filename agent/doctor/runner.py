"""Run every check at once, each on its own thread, under one deadline; never raise.

A check that raises is ``failed`` with the exception as its evidence; one still running at the
deadline is ``failed`` saying so (its thread is a daemon and is left to finish on its own: a
hung NVML or API call must not hold the answer). The answer keeps the checks' order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.wire.doctor import Check, CheckState

__all__ = ["DEADLINE_S", "Probe", "run_checks"]

#: The whole run's budget: the issue's promise is an answer in under 10 s on a node.
DEADLINE_S = 8.0


@dataclass(frozen=True, slots=True)
class Probe:
    """One check: its duty and name (said when it cannot answer) and what reads it."""

    duty: str
    name: str
    read: Callable[[], Check]


def run_checks(probes: Sequence[Probe], deadline_s: float = DEADLINE_S) -> tuple[Check, ...]:
    results: list[Check | None] = [None] * len(probes)
    threads = []
    for i, probe in enumerate(probes):
        thread = threading.Thread(
            target=_one, args=(probe, results, i), name=f"doctor-{probe.name}", daemon=True
        )
        thread.start()
        threads.append(thread)
    end = time.monotonic() + deadline_s
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    return tuple(
        found
        if found is not None
        else Check(
            p.duty,
            p.name,
            CheckState.FAILED,
            f"the check did not finish in {deadline_s:.0f} s (a call that hangs: the driver or "
            "the API server)",
            "look at the agent's log for the call that hangs; run gpu-agent doctor again",
        )
        for p, found in zip(probes, list(results), strict=True)
    )


def _one(probe: Probe, results: list[Check | None], i: int) -> None:
    try:
        results[i] = probe.read()
    except Exception as exc:  # a check that errs is a failed check, never a failed doctor
        results[i] = Check(
            probe.duty,
            probe.name,
            CheckState.FAILED,
            f"the check raised {type(exc).__name__}: {exc}",
            "report it with the agent's log (a bug in the check)",
        )
