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

from agent.cli.waits import stopped_by
from agent.errors import Conflict

if TYPE_CHECKING:
    from agent.cli.share import RemoteSharing
    from agent.client import AgentClient
    from agent.config import AgentConfig
    from agent.ownership import NodeOwnership


_WAIT_S = 0.1
#: How long a command waits for a ``serve`` that says it serves but does not answer on its
#: socket: past the agent's 20 s shutdown budget (a stopping one lets go of the node by then).
SILENT_SERVE_S = 30.0
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
        or another command's embedded agent) it waits, saying for whom; `Conflict` at once
        when the owner is a ``serve`` on another socket, which would never let go of it, and
        `Unreachable` when a ``serve`` that said its API serves leaves its socket silent for
        `SILENT_SERVE_S`.
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
        silent_since: float | None = None
        with stopped_by(signal.SIGTERM) as stop:
            while True:
                client = AgentClient.connect(cfg.socket_path)
                if client is not None and self._asked_for(client, ownership):
                    return client
                if ownership.try_acquire(f"gpu-agent {' '.join(sys.argv[1:3])}".strip()):
                    self._closers.append(ownership.release)
                    break
                _refuse_a_serve_elsewhere(ownership, cfg.socket_path)
                silent_since = _refuse_a_silent_serve(ownership, cfg.socket_path, silent_since)
                if not told:
                    holder = ownership.holder() or "another gpu-agent process (starting)"
                    print(f"waiting for {holder}, which owns this node's state", file=sys.stderr)
                    told = True
                if stop.wait(_WAIT_S):
                    raise SystemExit(SIGTERM_EXIT)
        # Out of the wait's handler first: the embedded agent sets its own (a graceful stop).
        return self._embed(cfg)

    def _asked_for(self, client: AgentClient, ownership: NodeOwnership) -> bool:
        """Whether the agent on the socket is the node this command was asked about.

        Checked when the user named the node, whatever the spelling (the --state-dir and
        --simulate flags, GPU_AGENT_STATE_DIR / GPU_AGENT_SIMULATE, the config file): the agent
        must hold that state dir's lock, and run that simulated preset. False (the client
        closed) when nobody owns the named state dir: the command then runs on its own embedded
        agent. An agent of another node raises `Conflict` naming it: never an answer from
        another node.
        """
        from agent.config import DEFAULT_STATE_DIR

        cfg = self.config
        named = cfg.state_dir != DEFAULT_STATE_DIR  # by env or config file
        if self.flags.get("state_dir") is not None or named:
            serves = _holds(client.peer_pid, ownership.path)
            if serves is False:
                holder = ownership.holder()
                if holder is None and ownership.try_acquire("gpu-agent (checking)"):
                    ownership.release()
                    client.close()
                    return False
                who = f"pid {client.peer_pid}" if client.peer_pid else "an agent"
                raise Conflict(
                    f"the agent answering on {cfg.socket_path} ({who}) does not serve the state "
                    f"dir {cfg.state_dir} asked for (flag, GPU_AGENT_STATE_DIR or config)"
                    + (f", which {holder} owns" if holder else "")
                    + ": point socket_path (--config or GPU_AGENT_SOCKET_PATH) at that node's "
                    "agent, or leave out --state-dir to ask the agent on the socket"
                )
        wanted = cfg.simulate
        if wanted is not None:
            preset = client.node().simulated_preset
            if preset != wanted:
                runs = f"simulated node {preset}" if preset else "the real NVML"
                raise Conflict(
                    f"the agent answering on {cfg.socket_path} runs {runs}, not --simulate "
                    f"{wanted} (flag, GPU_AGENT_SIMULATE or config): point socket_path "
                    "(--config or GPU_AGENT_SOCKET_PATH) at that node's agent, or leave out "
                    "--simulate to ask the agent on the socket"
                )
        return True

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


def _refuse_a_serve_elsewhere(ownership: NodeOwnership, socket_path: Path) -> None:
    """`Conflict` when the node's owner is a ``serve`` that serves on another socket than
    ``socket_path``: it holds the node for its whole life, so a wait for it would never end.
    A ``serve`` on this socket is starting (it owns the node before it listens): waited for."""
    from agent.ownership import SERVE_ROLE

    pid, socket = ownership.serving(SERVE_ROLE)
    if socket is None or socket == os.path.realpath(socket_path):
        return
    who = f"gpu-agent serve (pid {pid})" if pid else "gpu-agent serve"
    raise Conflict(
        f"the agent serving the state dir {ownership.state_dir}, {who}, does not answer on "
        f"{socket_path}: it serves on {socket}; point socket_path (--config or "
        "GPU_AGENT_SOCKET_PATH) at that socket"
    )


def _refuse_a_silent_serve(
    ownership: NodeOwnership, socket_path: Path, since: float | None
) -> float | None:
    """`Unreachable` when the node's ``serve`` has said its API serves, yet nothing answers on
    its socket for `SILENT_SERVE_S` (its socket file removed, or the agent hung): a wait for it
    would never end. Returns since when it has been so (None: it is not)."""
    from agent.ownership import SERVE_ROLE

    if not ownership.says_serving(SERVE_ROLE):
        return None
    now = time.monotonic()
    if since is None or now - since < SILENT_SERVE_S:
        return now if since is None else since
    from agent.client.errors import Unreachable

    raise Unreachable(
        f"the agent serving the state dir {ownership.state_dir}, {ownership.holder()}, says it "
        f"serves on {socket_path}, but nothing has answered there for {SILENT_SERVE_S:.0f} s: "
        "its socket file was removed, or the agent hangs; restart the agent (its pod)"
    )


def _holds(pid: int | None, lock: Path) -> bool | None:
    """Whether process ``pid`` has the state dir's lock file open (an agent holds it for its
    whole life); None when that cannot be seen (pid unknown, /proc not readable). By file
    identity, not by pid: it holds when the agent runs in another pid namespace (a pod)."""
    try:
        target = os.stat(lock)
    except OSError:
        return False  # no lock file: no agent ever served this state dir
    if pid is None:
        return None
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        fds = list(fd_dir.iterdir())
    except OSError:
        return None
    for fd in fds:
        try:
            opened = os.stat(fd)
        except OSError:
            continue  # closed meanwhile
        if (opened.st_dev, opened.st_ino) == (target.st_dev, target.st_ino):
            return True
    return False
