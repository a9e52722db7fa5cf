"""The client side of agent/api/errors.py: a gRPC status back into the domain error it was.

The server puts the error's class name in an ErrorInfo and its data in BadRequest /
PreconditionFailure details; both clients (the CLI over the socket, the coordinator over mTLS)
rebuild the same AgentError from them, so a caller handles one error tree wherever it runs.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from google.rpc import error_details_pb2, status_pb2

from agent.errors import (
    AgentError,
    Busy,
    Conflict,
    DeviceLost,
    DriverUnavailable,
    FieldViolation,
    InvalidSpec,
    NotFound,
    NotSupported,
    PermissionDenied,
)
from agent.prewarm.errors import Cancelled, DigestMismatch, DiskFull, FetchFailed

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
        DriverUnavailable,
        FetchFailed,
        InvalidSpec,
        NotFound,
        NotSupported,
        PermissionDenied,
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
