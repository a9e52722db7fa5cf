"""A failed call as the agent's domain error, for both clients (sync and asyncio).

The status <-> error mapping itself is agent/wire/errors.py; what is the client's is reading a
failed call's trailers, and naming a call that never reached an agent (down, unreachable,
handshake failed, deadline): `Unreachable`.
"""

from __future__ import annotations

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
        details = f"the agent did not answer: {details}"
    return rebuild(code, f"{address}: {details}" if address else details, status, _BY_CODE)
