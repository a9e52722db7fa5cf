"""Several real agents (`gpu-agent … serve` processes) on simulated nodes, over mTLS, and the
`gpu-agent fleet` CLI pointed at them: support for the multi-agent integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import grpc
from click.testing import CliRunner

from agent._proto.gpuagent.v1 import (
    cache_pb2,
    operations_pb2,
    operations_pb2_grpc,
    prewarm_pb2,
    prewarm_pb2_grpc,
)
from agent.cli.coordinator import coordinator
from agent.cli.fleet import fleet
from agent.errors import AgentError
from tests.integration.prewarm_fixtures.cli import run as run_cli
from tests.unit.api.support import REPO, AgentProcess, Pki, agent_config


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    output: str


def invoke_process(args: Sequence[str], timeout: float = 240) -> Outcome:
    """`gpu-agent ARGS` in a process of its own, as an operator runs it: nothing of this test
    process (its gRPC AsyncIO poller, other tests' threads and loops) is shared with it. In
    process, a fleet command's call now and then never completed (its deadline included) after
    other tests had run: seen in test_remediate in 2 of 8 runs beside the fleet tests."""
    done = run_cli(list(args), dict(os.environ), timeout)
    return Outcome(done.returncode, done.stdout + done.stderr)


def invoke(group: click.Group, args: Sequence[str]) -> Outcome:
    """Run a command group as `gpu-agent` does: a domain error is one line and its exit code."""
    result = CliRunner().invoke(group, list(args))
    error = result.exception
    if isinstance(error, AgentError):
        return Outcome(error.exit_code, f"{result.output}error: {error}\n")
    if error is not None and not isinstance(error, SystemExit):
        raise error
    return Outcome(result.exit_code, result.output)


class AgentFleet:
    """One agent per node name, each on its own simulated preset and state dir."""

    def __init__(
        self,
        root: Path,
        pki: Pki,
        presets: Mapping[str, str],
        config: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.root = root
        self.pki = pki
        self.agents: dict[str, AgentProcess] = {}
        for name, preset in presets.items():
            home = root / name
            home.mkdir(parents=True, exist_ok=True)
            extra = dict((config or {}).get(name, {}))
            path = agent_config(home, pki, node_name=name, **extra)
            self.agents[name] = AgentProcess(home, path, preset=preset)

    def __enter__(self) -> AgentFleet:
        with ThreadPoolExecutor(len(self.agents)) as pool:
            list(pool.map(lambda a: a.start(timeout=120), self.agents.values()))
        return self

    def __exit__(self, *exc: object) -> None:
        for agent in self.agents.values():
            agent.stop()

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.agents[name].tcp_port}"

    def args(self, names: Sequence[str] | None = None) -> list[str]:
        """Connection flags for `gpu-agent fleet …`: the agents, and the coordinator's cert."""
        chosen = names or list(self.agents)
        return [
            "--agents",
            ",".join(self.address(n) for n in chosen),
            "--tls-cert",
            str(self.pki.coordinator.cert),
            "--tls-key",
            str(self.pki.coordinator.key),
            "--tls-ca",
            str(self.pki.ca),
        ]

    def fleet(self, *args: str, names: Sequence[str] | None = None) -> Outcome:
        """Run `gpu-agent fleet ARGS` in-process; the subcommand's own args come first."""
        return invoke(fleet, [*args, *self.args(names)])

    def fleet_process(self, *args: str, timeout: float = 240) -> Outcome:
        """`gpu-agent fleet ARGS` in a process of its own (`invoke_process`)."""
        return invoke_process(["fleet", *args, *self.args()], timeout)

    def coordinator(self, *args: str) -> Outcome:
        return invoke(coordinator, [*args, *self.args()])

    def sim(self, name: str, *args: str) -> None:
        """`gpu-agent --simulate PRESET --state-dir D sim ARGS` on that node's simulator."""
        agent = self.agents[name]
        subprocess.run(
            [
                sys.executable,
                "-m",
                "agent.cli.main",
                "--simulate",
                agent.preset,
                "--state-dir",
                str(agent.state_dir),
                "sim",
                *args,
            ],
            cwd=REPO,
            check=True,
            capture_output=True,
            timeout=60,
        )

    def operations(self, name: str, kind: str) -> list[operations_pb2.Operation]:
        """The agent's own operation records (over its root-only Unix socket)."""
        with grpc.insecure_channel(f"unix:{self.agents[name].socket}") as channel:
            stub = operations_pb2_grpc.OperationsServiceStub(channel)
            request = operations_pb2.ListOperationsRequest(kind=kind, page_size=1000)
            return list(stub.ListOperations(request, timeout=30).operations)

    def cache(self, name: str) -> list[cache_pb2.CacheItem]:
        """The agent's ready items, as it answers ListCache (over its Unix socket)."""
        with grpc.insecure_channel(f"unix:{self.agents[name].socket}") as channel:
            stub = prewarm_pb2_grpc.PrewarmServiceStub(channel)
            return list(stub.ListCache(prewarm_pb2.ListCacheRequest(), timeout=30).cache.items)


def most_at_once(intervals: Sequence[tuple[float, float]]) -> int:
    """The largest number of [start, end] intervals that overlap at one moment."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    most = now = 0
    for _, step in events:  # at equal times an end (-1) sorts before a start (+1)
        now += step
        most = max(most, now)
    return most


def op_intervals(ops: Sequence[operations_pb2.Operation]) -> list[tuple[float, float]]:
    return [
        (op.create_time.ToNanoseconds() / 1e9, op.update_time.ToNanoseconds() / 1e9)
        for op in ops
        if op.done
    ]
