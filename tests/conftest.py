"""Suite-wide fixtures: a fake Kubernetes API server shared by sharing and MIG tests, each
test's logging as the suite began, and the host's PID namespace for in-process code.

Every agent the suite starts (in-process, embedded in a CLI command, or a ``serve`` process,
which inherits the environment) runs the simulated driver at memory speed: the modelled NVML
latencies (a second per MIG mode change) are for benchmarks and ``serve`` on a newcomer's
machine. A test about timing sets ``GPU_AGENT_SIMULATE_LATENCY=true`` itself.
"""

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from agent import pidns

os.environ.setdefault("GPU_AGENT_SIMULATE_LATENCY", "false")

# Property tests draw the same examples every run (a failure is the code's, reproducible from the
# log) and are timed by nobody: hypothesis' default 200 ms per example is the machine's load, not
# the code's behaviour (test_any_config_round_trips_through_render missed it once in a run at load
# 5, and passed alone and over 3,000 examples). A test that asks for more examples sets them itself.
settings.register_profile(
    "suite", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("suite")

pytest_plugins = ["tests.kube.fixtures", "tests.strict_skips"]


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """Each test starts with the logging the suite began with: a CLI command run in-process
    (`logs.configure`) or an embedded agent (which quiets "agent" while it runs) leaves the
    root's handlers and the levels as it set them, and a later test's ``caplog`` would then miss
    a warning it waits for, depending on which tests ran before it in the same worker."""
    root, agent = logging.getLogger(), logging.getLogger("agent")
    saved = (root.handlers[:], root.level, agent.level)
    yield
    root.handlers[:], root.level = saved[0], saved[1]
    agent.setLevel(saved[2])


@pytest.fixture(autouse=True)
def _host_pid_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process code reading the real /proc is told it runs in the node's PID namespace (as
    the DaemonSet's hostPID gives it): a runner in a container is in a child one, and the
    sharing verdicts (not-loaded, or not observable without hostPID) would depend on where the
    suite runs. A test of that reads a /proc of its own, which is read as it is."""
    read = pidns.namespace
    monkeypatch.setattr(pidns, "namespace", lambda p: "node" if p == Path("/proc") else read(p))
