"""``serve``'s start-up checks: every precondition, before anything starts.

A refusal found halfway through the start (after the prewarm queue resumed downloads, the TCP
listener bound, the driver attached) came after work that then had to be stopped again, and its
line was followed by the shutdown's. So ``serve`` checks here, in one step and before it builds
a single service, what would make it refuse: the socket's directory (agent/api/socket_dir.py),
every listen address it will bind, and the files the listeners need. The config itself was
validated when it was loaded. A refusal is then the process's last line, with its error's
exit code (docs/operations.md, "Start-up checks and a bounded shutdown").
"""

from __future__ import annotations

import socket
from pathlib import Path

from agent.api.socket_dir import prepare_socket
from agent.config import AgentConfig
from agent.errors import Conflict, FieldViolation, InvalidSpec
from agent.webconfig import load_web_config

__all__ = ["listen_refusal", "preflight", "split_listen"]

#: What to change for each listen setting, named in its refusal.
_SETTING_FIX = {
    "metrics_listen": "--metrics-listen or GPU_AGENT_METRICS_LISTEN",
    "grpc_listen": "grpc_listen or GPU_AGENT_GRPC_LISTEN",
    "grpc_insecure_listen": "grpc_insecure_listen",
}


def preflight(config: AgentConfig) -> None:
    """Raise the refusal ``serve`` would otherwise meet later; start nothing, bind nothing that
    stays bound. The socket directory is made (0700) when missing and a stale socket removed,
    as the server's own bind does."""
    prepare_socket(config.socket_path)
    _bindable("metrics_listen", config.metrics_listen)
    if config.metrics_web_config is not None:
        load_web_config(config.metrics_web_config)
    tls = config.tls
    if tls.cert_file is not None:
        _bindable("grpc_listen", config.grpc_listen)
        for name, path in (("cert_file", tls.cert_file), ("key_file", tls.key_file)):
            _readable(f"tls.{name}", path)
        _readable("tls.ca_file", tls.ca_file)
    if config.grpc_insecure_listen is not None:
        _bindable("grpc_insecure_listen", config.grpc_insecure_listen)


def split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``) as the host and port to bind; an empty host is all."""
    host, _, port = listen.rpartition(":")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def listen_refusal(setting: str, listen: str, exc: OSError) -> Conflict:
    """The one line for a listen address the agent cannot bind."""
    return Conflict(
        f"{setting} {listen}: cannot listen ({exc.strerror or exc}); another process (an agent, "
        "dcgm-exporter) may hold the port: stop it, or pick another address with "
        f"{_SETTING_FIX.get(setting, setting)}"
    )


def _bindable(setting: str, listen: str) -> None:
    """Bind the address once and let it go: the listener itself binds it moments later (a port
    taken in between still refuses, there, with the same line)."""
    host, port = split_listen(listen)
    if port == 0:  # any free port: always bindable
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do
            probe.bind(address)
    except OSError as exc:
        raise listen_refusal(setting, listen, exc) from exc


def _readable(setting: str, path: Path | None) -> None:
    if path is None:
        return
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise InvalidSpec(
            f"{setting}: cannot read {path} ({exc.strerror or exc})",
            [FieldViolation(setting, "a readable PEM file")],
        ) from exc
