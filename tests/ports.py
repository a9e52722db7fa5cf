"""Start a server that must be told its port and cannot report the one it bound.

Picking a free port and closing it before the server binds is a race: another process may take
it meanwhile, and a "port open" check then talks to the wrong server. Here a port is picked,
the server launched, and it counts as up only when the launched process itself (or one of its
children) listens on that port, as the kernel's socket table says; a launch that lost the race
(the process exited: address in use) is retried on another port.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Sequence

import psutil


def pick_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` or one of its descendants listens on TCP ``port``."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for proc in procs:
        try:
            conns = proc.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns):
            return True
    return False


def launch_listening(
    launch: Callable[[int], Sequence[subprocess.Popen[bytes]]],
    *,
    listener: int = 0,
    timeout: float = 30.0,
    attempts: int = 5,
) -> tuple[int, list[subprocess.Popen[bytes]]]:
    """``launch(port)`` starts the processes of one server set; ``listener`` is the index of the
    one that must listen on ``port``. Returns the port and the processes, once it listens."""
    for _ in range(attempts):
        port = pick_port()
        procs = list(launch(port))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if listens_on(procs[listener].pid, port):
                return port, procs
            if procs[listener].poll() is not None:
                break  # lost the race for the port (or failed): try another
            time.sleep(0.05)
        else:
            stop(procs)
            raise TimeoutError(f"{launch} did not listen on port {port} within {timeout}s")
        stop(procs)
    raise RuntimeError(f"{launch} could not bind a port in {attempts} attempts")


def stop(procs: Sequence[subprocess.Popen[bytes]], timeout: float = 20.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
