"""An apply in the test's own process that a SIGTERM suspends before its next mutation, as
the agent's operation worker does when the agent stops (agent/api/mig.py): what the fault
tests drive at every mutation point to check that the next start rolls it forward."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

from agent.mig.apply import ProgressEvent, Suspended
from agent.mig.outcomes import ApplyResult
from agent.mig.service import MigService
from agent.mig.spec import MigSpec


def direct_apply(
    service: MigService,
    spec: MigSpec,
    selected: str | None,
    *,
    force: bool,
    skip_reset: bool,
    progress: Callable[[ProgressEvent], None],
    mode_only: bool = False,
) -> ApplyResult:
    """An apply in this process, as the agent's worker runs it: a SIGTERM suspends
    it before its next mutation (Suspended, exit 143) for the next start to finish."""
    stopping: list[int] = []

    def step(event: ProgressEvent) -> None:
        progress(event)
        if stopping and event.phase == "apply":
            raise Suspended(
                f"SIGTERM: suspended before {event.message}; the next `mig apply` or agent "
                "start finishes it"
            )

    with _suspend_on_sigterm(stopping):
        return service.apply(
            spec, selected, force=force, skip_reset=skip_reset, progress=step, mode_only=mode_only
        )


@contextlib.contextmanager
def _suspend_on_sigterm(flag: list[int]) -> Iterator[None]:
    """While applying, SIGTERM sets ``flag`` (the apply stops before its next mutation) instead
    of ending the process mid-call; the previous handler comes back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread (tests invoke in threads)
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: flag.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
