"""The agent inside another program: what a CLI command runs on when no agent serves.

The same `Node` as ``serve`` (same services, servicers, validation, operations and errors), with
its API on a private Unix socket in a fresh 0700 directory and nothing else: no TCP or HTTP
listener and no cluster duties (label controllers). Its loop runs on a thread of the host; the
host talks to it with the one client over that socket, so every command has one code path
whether an agent runs or not. The caller must own the node (`agent.ownership`) first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import tempfile
import threading
from pathlib import Path

from agent.api.socket_dir import SOCKET_PATH_MAX, over_length
from agent.config import AgentConfig
from agent.errors import AgentError, FieldViolation, InvalidSpec

_START_TIMEOUT_S = 120.0
_SOCKET = "agent.sock"
_SILENT = logging.CRITICAL + 1  # above every level: no record passes
_PREFIX = "gpu-agent-"
#: The longest TMPDIR whose private socket binds: "/", the prefix, mkdtemp's 8 random
#: characters, "/" and the socket's name follow it.
_TMPDIR_MAX = SOCKET_PATH_MAX - len(f"/{_PREFIX}/{_SOCKET}") - 8


def embedded_config(config: AgentConfig, socket_dir: Path) -> AgentConfig:
    """``config`` with every listener but a private socket switched off."""
    return dataclasses.replace(
        config,
        socket_path=socket_dir / _SOCKET,
        grpc_insecure_listen=None,
        tls=dataclasses.replace(config.tls, cert_file=None, key_file=None),
    )


def _private_dir() -> Path:
    """A fresh 0700 directory for the private socket, this user's only; `InvalidSpec` naming
    TMPDIR when the socket's path in it would be too long to bind."""
    made = Path(tempfile.mkdtemp(prefix=_PREFIX))
    size = over_length(made / _SOCKET)
    if size is not None:
        made.rmdir()
        raise InvalidSpec(
            f"the command's embedded agent cannot serve on {made / _SOCKET}: {size} bytes, "
            f"longer than the {SOCKET_PATH_MAX} a Unix socket path may have; its directory is "
            f"made in {made.parent} (TMPDIR): set TMPDIR to a shorter directory",
            [FieldViolation("TMPDIR", f"a directory of at most {_TMPDIR_MAX} bytes")],
        )
    return made


class EmbeddedAgent:
    def __init__(self, config: AgentConfig) -> None:
        self._dir = _private_dir()
        self._node_socket = config.socket_path  # where the node's own agent serves
        self.config = embedded_config(config, self._dir)
        self.socket_path = self.config.socket_path
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._node: object | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._log_level = logging.NOTSET

    def start(self) -> None:
        """Build and start the node; returns once its API serves (or raises why it could not)."""
        from agent.node import Node, build_services

        # The agent's log is not the command's output, errors included: what fails reaches
        # the command as an API error, and a lost GPU is in the node it reads.
        # GPU_AGENT_LOG_LEVEL=debug shows it all.
        quiet = logging.DEBUG if self.config.log_level == "debug" else _SILENT
        self._log_level = logging.getLogger("agent").level  # given back when it stops
        logging.getLogger("agent").setLevel(quiet)

        services = build_services(self.config)
        if services.doctor is not None:  # it checks the node's socket, not this private one
            services.doctor.facts.socket_path = self._node_socket
        node = Node(services, embedded=True)
        self._node = node

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            await node.run(handle_signals=False, ready=self._started.set)

        def serve() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:  # handed to the host in start() or stop()
                self._error = exc
            finally:
                self._started.set()

        self._thread = threading.Thread(target=serve, name="embedded-agent", daemon=True)
        self._thread.start()
        if not self._started.wait(_START_TIMEOUT_S):
            raise AgentError(f"the embedded agent did not start in {_START_TIMEOUT_S:.0f}s")
        if self._error is not None:
            error, self._error = self._error, None
            self._cleanup()
            raise error

    def stop(self) -> None:
        """Stop the node (operations checkpoint as in ``serve``) and remove the socket dir."""
        from agent.node import Node

        if self._thread is None:
            return
        node = self._node
        if self._loop is not None and isinstance(node, Node) and self._thread.is_alive():
            self._loop.call_soon_threadsafe(node.request_stop)
        self._thread.join()
        self._thread = None
        self._cleanup()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _cleanup(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
        logging.getLogger("agent").setLevel(self._log_level)  # the host's logging, as it was
