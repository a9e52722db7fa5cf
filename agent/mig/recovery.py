"""MIG recovery after the start: a killed apply's journal is finished when the driver attaches
again, and when the allocation mode comes to allow MIG changes (e.g. unknown at the start,
device-plugin once the API server answered). The start's own recovery, which also records how
each interrupted apply ended, is `agent.api.restart.recover_at_start`."""

from __future__ import annotations

import logging
from collections.abc import Callable

from agent.dra.detect import NO_API
from agent.dra.mode import AllocationMode
from agent.dra.watch import AllocationSource
from agent.gpu.attach import DriverLink
from agent.mig.service import MigService
from agent.tasks import Task

log = logging.getLogger(__name__)

__all__ = ["REFUSING", "ModeFollower", "follow_driver"]

#: Modes under which MIG is not touched (agent.dra.gate).
REFUSING = (AllocationMode.UNKNOWN, AllocationMode.DRA_DYNAMIC_MIG)
#: How often the allocation mode is looked at without a change (a change wakes it).
ALLOCATION_CHECK_S = 30.0


def follow_driver(link: DriverLink, mig: MigService, *, writable: bool) -> None:
    """After a driver came back (``again``), finish what a killed apply left, before anything
    reads the GPUs. Read-only, nothing is recovered: the start said what is left."""

    def attach(again: bool) -> None:
        if again and writable:
            for outcome in mig.recover():
                log.warning("MIG recovery after the driver attached: %s", outcome)

    link.register(attach=attach)


class ModeFollower:
    """Follows the allocation mode: shows a change, and recovers a MIG journal a refusing mode
    left alone once the mode allows it."""

    def __init__(
        self,
        source: AllocationSource,
        mig: MigService,
        driver: DriverLink,
        show: Callable[[], None],
    ) -> None:
        self._source = source
        self._mig = mig
        self._driver = driver
        self._show = show
        self._seen = NO_API

    def start(self) -> None:
        self._seen = self._source.current()
        log.info("GPU allocation mode: %s", self._seen.describe())

    def tasks(self) -> list[Task]:
        watch = self._source.watch
        if watch is None:  # a mode set in config does not move
            return []

        def woken_by(wake: Callable[[], None]) -> None:
            watch.on_change = wake

        return [Task("allocation", self.moved, ALLOCATION_CHECK_S, wakes=(woken_by,))]

    def moved(self) -> None:
        now, was = self._source.current(), self._seen
        self._show()
        if now.mode is was.mode:
            return
        self._seen = now
        log.warning("GPU allocation mode changed: %s (was %s)", now.describe(), was.mode.value)
        if was.mode in REFUSING and now.mode not in REFUSING:
            self._driver.while_attached(self._recover)

    def _recover(self) -> None:
        for outcome in self._mig.recover():
            log.warning("MIG recovery once the allocation mode allowed it: %s", outcome)
