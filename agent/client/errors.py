"""A failed call as the agent's domain error, for both clients (sync and asyncio).

The status <-> error mapping itself is agent/wire/errors.py; what is the client's is reading a
failed call's trailers, and naming a call that never reached an agent (down, unreachable,
handshake failed, deadline): `Unreachable`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import cast

import grpc
from google.rpc import status_pb2

from agent.errors import AgentError
from agent.wire.errors import BY_CODE, DETAILS_KEY, rebuild

__all__ = ["Unreachable", "domain_error"]


class Unreachable(AgentError):
    """The agent did not answer (down, unreachable, or the TLS handshake failed)."""

    exit_code = 9


# Transport failures: the agent is not there (or the handshake failed).
_BY_CODE: Mapping[grpc.StatusCode, type[AgentError]] = {
    **BY_CODE,
    grpc.StatusCode.UNAVAILABLE: Unreachable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unreachable,
}


# gRPC core's connect failure: "failed to connect to all addresses; last error: CODE: ADDRESS:
# REASON", where a Unix socket's REASON is again "connect failed: addr: ADDRESS error: WHY".
_CONNECT = re.compile(r"failed to connect to all addresses; last error: [A-Z_]+: \S+: (?P<why>.+)")
_SOCKET = re.compile(r"connect failed: addr: \S+ error: (?P<why>.+)")
# and a name that does not resolve: "errors resolving HOST:PORT: [field:...: WHY]"
_RESOLVE = re.compile(r"errors resolving \S+: \[.*: (?P<why>[^:\]]+)\]")


def _why_not_connected(details: str) -> str:
    """gRPC's connect text cut to the reason, the address named once by the caller; any other
    text as it came."""
    if match := _CONNECT.fullmatch(details):
        details = match["why"]
        if match := _SOCKET.fullmatch(details):
            details = f"connect failed: {match['why']}"
    elif match := _RESOLVE.fullmatch(details):
        details = f"name lookup failed: {match['why']}"
    return details


def domain_error(exc: grpc.RpcError, address: str | None = None) -> AgentError:
    """The domain error behind a failed call; ``address`` prefixes the message (the fleet's
    clients name the agent it came from; the local CLI has one agent and names none)."""
    # A sync call's error is a grpc.Call, an asyncio one an AioRpcError: both have these.
    if not isinstance(exc, grpc.Call | grpc.aio.AioRpcError):
        return Unreachable(f"{address}: {exc}" if address else str(exc))
    code = exc.code()
    status = None
    # grpc-stubs type these as objects; at run time both kinds of metadata yield pairs.
    trailers = cast(Iterable[tuple[str, object]], exc.trailing_metadata() or ())
    for key, value in trailers:
        if key == DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status.FromString(value)
    details = exc.details() or code.name
    if status is None and code is grpc.StatusCode.UNAVAILABLE:
        details = f"the agent did not answer: {_why_not_connected(details)}"
    return rebuild(code, f"{address}: {details}" if address else details, status, _BY_CODE)
