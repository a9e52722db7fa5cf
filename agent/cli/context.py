"""What every CLI command gets on ``ctx.obj``: the resolved config and lazily opened services."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.cli.share import RemoteSharing
    from agent.client import AgentClient
    from agent.config import AgentConfig


_WAIT_S = 0.1
SIGTERM_EXIT = 143


def _stop_gracefully_on_sigterm() -> None:
    """While this command's embedded agent runs, SIGTERM ends the command through its closers,
    so the agent stops as ``serve`` does (a MIG apply is suspended before its next mutation
    and the next start finishes it) instead of the process dying mid-call."""
    if threading.current_thread() is not threading.main_thread():
        return  # handlers are the main thread's (tests invoke commands in threads)

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(SIGTERM_EXIT)

    signal.signal(signal.SIGTERM, terminate)


@dataclass
class CliContext:
    """Resolved lazily so ``--help`` and bad-config errors never start or reach an agent."""

    config_file: Path | None
    flags: Mapping[str, Any]
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    _config: AgentConfig | None = None
    _agent: AgentClient | None = None
    _embedded: bool = False
    _closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def config(self) -> AgentConfig:
        if self._config is None:
            from agent.config import load_config

            self._config = load_config(self.config_file, self.env, self.flags)
        return self._config

    def agent(self) -> AgentClient:
        """The node's agent: the running one on ``socket_path``, else one embedded in this
        process for this command (agent/embedded.py). Either way the same API, so every
        command has one code path; while an agent runs, it alone changes node state.

        Resolved once per command. PermissionDenied when an agent runs but this user may not
        use its socket (root only). While another process owns the node (an agent starting,
        or another command's embedded agent) it waits, saying for whom.
        """
        if self._agent is None:
            self._agent = self._connect()
            self._closers.append(self._agent.close)
        return self._agent

    def _connect(self) -> AgentClient:
        from agent.client import AgentClient
        from agent.ownership import NodeOwnership

        cfg = self.config
        ownership = NodeOwnership(cfg.state_dir)
        told = False
        while True:
            client = AgentClient.connect(cfg.socket_path)
            if client is not None:
                return client
            if ownership.try_acquire(f"gpu-agent {' '.join(sys.argv[1:3])}".strip()):
                self._closers.append(ownership.release)
                return self._embed(cfg)
            if not told:
                holder = ownership.holder() or "another gpu-agent process (starting)"
                print(f"waiting for {holder}, which owns this node's state", file=sys.stderr)
                told = True
            time.sleep(_WAIT_S)

    def _embed(self, config: AgentConfig) -> AgentClient:
        from agent.client import AgentClient
        from agent.embedded import EmbeddedAgent

        embedded = EmbeddedAgent(config)
        embedded.start()
        self._closers.append(embedded.stop)
        self._embedded = True
        _stop_gracefully_on_sigterm()
        return AgentClient(embedded.socket_path)

    @property
    def embedded(self) -> bool:
        """Whether ``agent()`` started an agent inside this command (none was running)."""
        return self._embedded

    def sharing_service(self) -> RemoteSharing:
        from agent.cli.share import RemoteSharing

        return RemoteSharing(self.agent())

    def close(self) -> None:
        while self._closers:
            self._closers.pop()()
