"""A failing GPU is said when it starts failing, when the reason changes and once it reads
again; a loss between two failures (said by the lost path) makes the next failure news."""

from __future__ import annotations

import logging

import pytest

from agent.telemetry.failing import FailingGpus


def test_a_failure_after_a_loss_is_said_again_even_with_the_same_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It failed, was lost, answered and failed the same way: nothing was logged, the reason
    kept from before the loss."""
    log = logging.getLogger("test.failing")
    failing = FailingGpus(log, "collection")
    with caplog.at_level(logging.WARNING, logger="test.failing"):
        for _ in range(3):
            failing.failed(0, "nvmlDeviceGetMigMode: Unknown Error")
        failing.lost(0)
        failing.failed(0, "nvmlDeviceGetMigMode: Unknown Error")
    said = [r.getMessage() for r in caplog.records if r.name == "test.failing"]
    assert len(said) == 2 and all("Unknown Error" in s for s in said), said
