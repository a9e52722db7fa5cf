"""The one decoder of the agent's errors, for both clients (sync and asyncio).

The server (agent/api/errors.py) puts the error's class name in an ErrorInfo and its data in
BadRequest / PreconditionFailure details; `domain_error` rebuilds the same AgentError from
them, so a caller handles one error tree wherever it runs. A call that never reached an agent
(down, unreachable, handshake failed, deadline) is `Unreachable`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

import grpc
from google.rpc import error_details_pb2, status_pb2

from agent._proto.gpuagent.v1 import operations_pb2
from agent.errors import (
    AgentError,
    Busy,
    Conflict,
    DeviceLost,
    DriverNotReady,
    DriverUnavailable,
    FieldViolation,
    InvalidSpec,
    ModeRefused,
    NotFound,
    NotSupported,
    PermissionDenied,
    StateUnavailable,
)
from agent.prewarm.errors import Cancelled, DigestMismatch, DiskFull, FetchFailed

__all__ = ["Unreachable", "domain_error", "operation_failure"]

_DETAILS_KEY = "grpc-status-details-bin"


#: Error class by the name the server sends in its ErrorInfo.
BY_NAME: Mapping[str, type[AgentError]] = {
    cls.__name__: cls
    for cls in (
        AgentError,
        Busy,
        Cancelled,
        Conflict,
        DeviceLost,
        DigestMismatch,
        DiskFull,
        DriverNotReady,
        DriverUnavailable,
        FetchFailed,
        InvalidSpec,
        ModeRefused,
        NotFound,
        NotSupported,
        PermissionDenied,
        StateUnavailable,
    )
}
#: Without an ErrorInfo (a status from grpc itself), go by the code.
BY_CODE: Mapping[grpc.StatusCode, type[AgentError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidSpec,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: Conflict,
    grpc.StatusCode.ABORTED: Busy,
    grpc.StatusCode.UNIMPLEMENTED: NotSupported,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDenied,
}


def rebuild(
    code: grpc.StatusCode,
    message: str,
    status: status_pb2.Status | None,
    by_code: Mapping[grpc.StatusCode, type[AgentError]] = BY_CODE,
) -> AgentError:
    """The domain error for a failed call; ``by_code`` lets a client name transport failures."""
    name: str | None = None
    violations: list[FieldViolation] = []
    blockers: list[str] = []
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        bad = error_details_pb2.BadRequest()
        failure = error_details_pb2.PreconditionFailure()
        if detail.Unpack(info):
            name = info.metadata.get("error")
        elif detail.Unpack(bad):
            violations += [FieldViolation(v.field, v.description) for v in bad.field_violations]
        elif detail.Unpack(failure):
            blockers += [v.subject for v in failure.violations]
    cls = BY_NAME.get(name or "") or by_code.get(code, AgentError)
    if issubclass(cls, InvalidSpec):
        return cls(message, violations)
    if issubclass(cls, Busy):
        return cls(message, blockers)
    return cls(message)


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
        if key == _DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status.FromString(value)
    details = exc.details() or code.name
    if status is None and code is grpc.StatusCode.UNAVAILABLE:
        details = f"the agent did not answer: {details}"
    return rebuild(code, f"{address}: {details}" if address else details, status, _BY_CODE)


def operation_failure(error: operations_pb2.OperationError) -> AgentError:
    """The domain error an operation ended with (its reason names the error class)."""
    cls = BY_NAME.get(error.reason, AgentError)
    message = f"{error.reason}: {error.message}" if cls is AgentError else error.message
    if issubclass(cls, InvalidSpec):
        return cls(message, [FieldViolation(v.field, v.description) for v in error.violations])
    if issubclass(cls, Busy):
        return cls(message, list(error.blockers))
    return cls(message)
