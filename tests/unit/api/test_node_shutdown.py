"""An agent embedded in another program never ends its host (issue 13).

When a shutdown overruns its deadline, `Node.run` logs what still runs and raises; only
``serve`` (``exit_if_stuck``) ends its process. The hung part here is a prewarm stop that never
returns in time, as a worker blocked in an uninterruptible call would.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

import agent.node
from agent.errors import AgentError
from agent.prewarm.service import PrewarmService
from tests.unit.api.support import InProcessAgent, agent_config

SHUTDOWN_GRACE_S = 3.0


def test_an_overrun_shutdown_raises_in_the_host_and_names_what_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(agent.node, "SHUTDOWN_GRACE_S", SHUTDOWN_GRACE_S)
    release = threading.Event()
    harness = InProcessAgent(tmp_path, agent_config(tmp_path))
    caplog.set_level(logging.ERROR, logger="agent.node")
    stop = PrewarmService.stop

    def hung_stop(self: PrewarmService) -> None:
        # asyncio.run in the host thread waits for this thread: free it after the deadline,
        # counted from the stop itself (a start slowed by load must not use up the hang).
        threading.Timer(SHUTDOWN_GRACE_S + 1.0, release.set).start()
        release.wait(30)
        stop(self)

    monkeypatch.setattr(PrewarmService, "stop", hung_stop)
    try:
        with pytest.raises(AgentError, match="shutdown took over"), harness as running:
            assert running.socket.exists()  # serving; leaving the block stops it
    finally:
        release.set()
        # The overrun cancelled the rest of the stop: the driver's parts (the telemetry
        # threads) would go on logging into later tests, so the test stops them itself.
        harness.node.services.driver.stop()
    assert "exiting now" not in caplog.text  # the host (this test process) lives on
    assert "still running at shutdown: thread" in caplog.text
    assert "hung_stop (" in caplog.text  # the thread, named by where it waits
