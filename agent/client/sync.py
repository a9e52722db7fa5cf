"""The sync client of the node's agent (the CLI): its gRPC API over the local Unix socket.

Its methods and their requests are the asyncio client's (agent/client/requests.py); it only
sends them, watching that the agent is alive. Errors are the agent's domain errors (same
class, message, field violations and blockers: agent/wire/errors.py), so the CLI's one-line
messages and exit codes are the agent's own.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agent.client.base import channel_options
from agent.client.errors import Unreachable, domain_error
from agent.client.requests import Call, Requests, SyncSender
from agent.errors import PermissionDenied
from agent.wire.operations import OperationView

__all__ = ["PROBE_AFTER_S", "PROBE_TIMEOUT_S", "AgentClient"]

_TIMEOUT_S = 60.0
PROBE_AFTER_S = 2.0
"""A call the agent has not answered in this long makes the client check the agent is alive."""
PROBE_TIMEOUT_S = 3.0
"""How long that check (a health Check on a new connection) may take; then the call ends with
a message naming the agent, so a stopped or wedged agent is reported in under 10 s."""
_PROBE_EVERY_S = 5.0
_CONNECT_TIMEOUT_S = 5.0
R = TypeVar("R")


class AgentClient(Requests, SyncSender):
    """Calls on the agent (`Requests`); every method raises the agent's domain error when
    refused."""

    def __init__(
        self, socket_path: Path, timeout_s: float = _TIMEOUT_S, peer_pid: int | None = None
    ) -> None:
        """``peer_pid``: the agent process behind the socket, when known (`connect`)."""
        self.socket_path = socket_path
        self.peer_pid = peer_pid
        self._timeout = timeout_s
        self._channel = grpc.insecure_channel(f"unix:{socket_path}", options=channel_options())

    @classmethod
    def connect(cls, socket_path: Path) -> AgentClient | None:
        """A client when an agent serves on ``socket_path``; None when none runs there.

        A socket only root may open raises PermissionDenied: the CLI must never act beside a
        running agent it cannot reach.
        """
        if not socket_path.exists():
            return None
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(_CONNECT_TIMEOUT_S)  # a full backlog: the agent accepts nothing
        try:
            probe.connect(str(socket_path))
            # The listening process, as the kernel knows it (SO_PEERCRED: pid, uid, gid).
            creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid = struct.unpack("3i", creds)[0] or None
        except PermissionError as exc:
            raise PermissionDenied(
                f"an agent serves on {socket_path}, which only root may use: run as root"
            ) from exc
        except (ConnectionRefusedError, FileNotFoundError):
            return None  # left behind by an agent that was killed
        except TimeoutError:
            raise Unreachable(
                f"the agent on {socket_path} accepts no connection in {_CONNECT_TIMEOUT_S:.0f}s "
                "(stopped, wedged or out of file descriptors): look at its log and restart it"
            ) from None
        finally:
            probe.close()
        return cls(socket_path, peer_pid=pid)

    def close(self) -> None:
        self._channel.close()

    def _send(self, call: Call[R]) -> R:
        # The future form, so the watchdog can cancel a call the agent will never answer.
        future = call.target(self).future(call.request, timeout=call.timeout_s(self._timeout))
        with self._watchdog(future.cancel) as verdict:
            try:
                return call.decode(future.result())
            except (grpc.RpcError, grpc.FutureCancelledError) as exc:
                if verdict:
                    raise Unreachable(verdict[0]) from None
                assert isinstance(exc, grpc.RpcError)
                raise domain_error(exc) from None

    @contextmanager
    def _watchdog(self, cancel: Callable[[], object]) -> Iterator[list[str]]:
        """While the block waits for the agent: from PROBE_AFTER_S on, check now and then that
        the agent answers at all; when it does not, put why in the list and ``cancel`` the call
        (the block then raises `Unreachable` with it). A slow answer from a live agent is
        waited for as long as the call's deadline allows."""
        verdict: list[str] = []
        done = threading.Event()

        def watch() -> None:
            wait = PROBE_AFTER_S
            while not done.wait(wait):
                why = self._unanswered()
                if why is not None and not done.is_set():
                    verdict.append(why)
                    cancel()
                    return
                wait = _PROBE_EVERY_S

        watcher = threading.Thread(target=watch, name="agent-watchdog", daemon=True)
        watcher.start()
        try:
            yield verdict
        finally:
            done.set()

    def _unanswered(self) -> str | None:
        """None when the agent answers a health check on a new connection in PROBE_TIMEOUT_S;
        else a message naming it (pid, socket) and what to do."""
        channel = grpc.insecure_channel(f"unix:{self.socket_path}", options=channel_options())
        try:
            health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=PROBE_TIMEOUT_S
            )
            return None
        except grpc.RpcError as exc:
            if exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                return None  # it answered, if only to refuse
        finally:
            channel.close()
        pid = self.peer_pid
        who = f"the agent on {self.socket_path}" + (f" (pid {pid})" if pid else "")
        if pid is not None and _process_state(pid) == "T":
            return (
                f"{who} is stopped (SIGSTOP or a debugger) and answers nothing: "
                f"resume it with kill -CONT {pid}"
            )
        how = f"restart it (kill -TERM {pid})" if pid else "restart it"
        return (
            f"{who} did not answer a health check in {PROBE_TIMEOUT_S:.0f}s: it is wedged or "
            f"overloaded; look at its log, or {how}"
        )

    # -- streams: the one kind of call a client reads its own way -----------------------------

    def watch_operation(self, name: str) -> Iterator[OperationView]:
        """The operation at every change until it is done (no deadline: long work is long)."""
        watch = self._watch(name)
        call = watch.target(self)(watch.request)
        with self._watchdog(call.cancel) as verdict:
            try:
                for answer in call:
                    yield watch.decode(answer)
            except grpc.RpcError as exc:
                if verdict:
                    raise Unreachable(verdict[0]) from None
                raise domain_error(exc) from None

    def follow(
        self, op: OperationView, on_update: Callable[[OperationView], None]
    ) -> OperationView:
        """Watch an operation to its end, passing each update on; raise its error if it failed."""
        for update in self.watch_operation(op.name):
            on_update(update)
            op = update
        if op.error is not None:
            raise op.error
        return op


def _process_state(pid: int) -> str | None:
    """The state letter of ``pid`` in /proc (R, S, D, T for stopped, ...); None when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0] if ")" in stat else None
