"""A GPU's failing collection said when it starts, when its reason changes, and when the GPU
is read again: never every tick (one waiting for a reset fails each tick, 86,400 lines a day at
a one-second interval). The failures are still counted each tick
(``gpu_agent_telemetry_errors_total{kind="nvml"}``) and named in the snapshot."""

from __future__ import annotations

import logging

__all__ = ["FailingGpus"]


class FailingGpus:
    """What ``log`` said of each GPU whose ``what`` failed ("collection", "readings")."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what
        #: GPU index -> the failure last said
        self._said: dict[int, str] = {}

    def failed(self, gpu: int, why: str) -> None:
        if self._said.get(gpu) != why:
            self._log.warning(
                "GPU %d: %s failed (said again when the reason changes, and once it is read): %s",
                gpu,
                self._what,
                why,
            )
            self._said[gpu] = why

    def read(self, gpu: int) -> None:
        if self._said.pop(gpu, None) is not None:
            self._log.warning("GPU %d: %s read again", gpu, self._what)

    def lost(self, gpu: int) -> None:
        """Lost is said elsewhere; a failure after it answers again is said anew."""
        self._said.pop(gpu, None)
