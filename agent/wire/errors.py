"""Domain errors <-> gRPC status codes with google.rpc details: the ONE mapping of the API, in
both directions, so the server's encoding and the clients' decoding cannot drift apart.

Encoding: every handler runs under `agent.api.interceptor`, which sends any `AgentError`
through `status_of`; servicers never pick a status code themselves. The rich status
(google.rpc.Status with ``ErrorInfo`` and, where they apply, ``BadRequest`` or
``PreconditionFailure``) travels in the ``grpc-status-details-bin`` trailer, so any client
can read the field violations and the blockers; `grpc_status.rpc_status.from_call` decodes it.

Operations that fail record the same mapping (`error_record`), so ``Operation.error.code`` agrees
with what the call would have returned.

Decoding: the error's class name travels in the ErrorInfo and its data in BadRequest /
PreconditionFailure details; `rebuild` makes the same AgentError from them (and
`operation_failure` from a failed operation), so a caller handles one error tree wherever it
runs. Reading a failed call's trailers, and naming a call that never reached an agent, is the
client's (agent/client/errors.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from agent._proto.gpuagent.v1 import operations_pb2
from agent.errors import (
    AgentError,
    Busy,
    Claimed,
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
from agent.mig.outcomes import Unrolled
from agent.operation import INTERRUPTED
from agent.prewarm.errors import Cancelled, DigestMismatch, DiskFull, FetchFailed
from agent.safeyaml import capped

__all__ = [
    "BY_CODE",
    "BY_NAME",
    "DETAILS_KEY",
    "DOMAIN",
    "OPERATION_BLOCKER_PREFIX",
    "code_of",
    "error_record",
    "grpc_code",
    "internal_status",
    "operation_failure",
    "reason_of",
    "rebuild",
    "recorded_code",
    "status_of",
    "trailing_metadata",
]

DOMAIN = "gpu-agent.io"
DETAILS_KEY = "grpc-status-details-bin"
OPERATION_BLOCKER_PREFIX = "operations/"
"""A `Busy` whose blockers name an operation ("operations/<id>") is a running reconfiguration:
the caller should retry after it (ABORTED), not fix the node (FAILED_PRECONDITION)."""


def _names_operation(exc: AgentError) -> bool:
    blockers: Sequence[str] = getattr(exc, "blockers", ())
    return any(b.startswith(OPERATION_BLOCKER_PREFIX) for b in blockers)


@dataclass(frozen=True, slots=True)
class _Rule:
    error: type[AgentError]
    code: grpc.StatusCode
    when: Callable[[AgentError], bool] | None = None


# Most specific first: the first rule whose class (and condition) matches wins. A subclass that
# needs another code gets its own row above its base.
_RULES: tuple[_Rule, ...] = (
    _Rule(Cancelled, grpc.StatusCode.CANCELLED),
    _Rule(DiskFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    _Rule(FetchFailed, grpc.StatusCode.UNAVAILABLE),
    _Rule(InvalidSpec, grpc.StatusCode.INVALID_ARGUMENT),
    _Rule(NotFound, grpc.StatusCode.NOT_FOUND),
    _Rule(Claimed, grpc.StatusCode.ABORTED),
    _Rule(Busy, grpc.StatusCode.ABORTED, when=_names_operation),
    _Rule(Busy, grpc.StatusCode.FAILED_PRECONDITION),
    _Rule(Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    _Rule(NotSupported, grpc.StatusCode.UNIMPLEMENTED),
    # Retrying does not bring a GPU back; a person must look: a precondition, not UNAVAILABLE.
    _Rule(DeviceLost, grpc.StatusCode.FAILED_PRECONDITION),
    _Rule(PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    # The node has no driver yet (or it is being upgraded): fix the node, not the call.
    _Rule(DriverNotReady, grpc.StatusCode.FAILED_PRECONDITION),
    # The node's GPU allocation mode forbids the change, or is not known yet (docs/dra.md).
    _Rule(ModeRefused, grpc.StatusCode.FAILED_PRECONDITION),
    _Rule(DriverUnavailable, grpc.StatusCode.UNAVAILABLE),
    # The state dir took no write (read-only, full): retry once an admin has freed it.
    _Rule(StateUnavailable, grpc.StatusCode.UNAVAILABLE),
    # A deliberate error without a better class (e.g. an NVML error with no domain meaning).
    _Rule(AgentError, grpc.StatusCode.UNKNOWN),
)

# Codes of errors recorded on operations by name (they are no exception class here).
_RECORDED_CODES: Mapping[str, grpc.StatusCode] = {
    INTERRUPTED: grpc.StatusCode.ABORTED,
    "Internal": grpc.StatusCode.INTERNAL,
}

#: Bounds on what one error sends: a refusal never carries the input it refused.
MAX_MESSAGE_CHARS = 1024
MAX_FIELD_CHARS = 200
MAX_VIOLATIONS = 20

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def code_of(exc: AgentError) -> grpc.StatusCode:
    for rule in _RULES:
        if isinstance(exc, rule.error) and (rule.when is None or rule.when(exc)):
            return rule.code
    raise AssertionError("unreachable: AgentError is the last rule")


def reason_of(name: str) -> str:
    """``ErrorInfo.reason``: the domain class in UPPER_SNAKE_CASE, e.g. ``INVALID_SPEC``."""
    return _CAMEL.sub("_", name).upper()


def _packed(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _details(exc: AgentError, code: grpc.StatusCode) -> list[any_pb2.Any]:
    details = [
        _packed(
            error_details_pb2.ErrorInfo(
                reason=reason_of(type(exc).__name__), domain=DOMAIN, metadata=_info(exc)
            )
        )
    ]
    violations = _violations(exc)
    if violations:
        details.append(
            _packed(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(
                            field=v.field, description=v.description
                        )
                        for v in violations
                    ]
                )
            )
        )
    blockers: Sequence[str] = getattr(exc, "blockers", ())
    if blockers:
        kind = "OPERATION" if code is grpc.StatusCode.ABORTED else "BUSY"
        details.append(
            _packed(
                error_details_pb2.PreconditionFailure(
                    violations=[
                        error_details_pb2.PreconditionFailure.Violation(
                            type=kind, subject=b, description=f"{b} is in the way"
                        )
                        for b in blockers
                    ]
                )
            )
        )
    return details


def _message(exc: AgentError) -> str:
    return capped(str(exc) or type(exc).__name__, MAX_MESSAGE_CHARS)


def _violations(exc: AgentError) -> list[FieldViolation]:
    """At most MAX_VIOLATIONS, each capped: the trailer stays small whatever the input held."""
    violations: Sequence[FieldViolation] = getattr(exc, "violations", ())
    out = [
        FieldViolation(capped(v.field, MAX_FIELD_CHARS), capped(v.description))
        for v in violations[:MAX_VIOLATIONS]
    ]
    if len(violations) > MAX_VIOLATIONS:
        out.append(FieldViolation("", f"and {len(violations) - MAX_VIOLATIONS} more"))
    return out


def _info(exc: AgentError) -> dict[str, str]:
    # The domain class name lets a client map the status back to the same error (agent.cli).
    return {"error": type(exc).__name__}


def status_of(exc: AgentError) -> status_pb2.Status:
    """The google.rpc.Status for a domain error: its code, message and typed details."""
    code = code_of(exc)
    return status_pb2.Status(code=code.value[0], message=_message(exc), details=_details(exc, code))


def internal_status(incident: str) -> status_pb2.Status:
    """A bug: no text of the exception leaves the agent (it may hold paths or secrets)."""
    return status_pb2.Status(
        code=grpc.StatusCode.INTERNAL.value[0],
        message=f"internal error in the agent; the agent log has the details (incident {incident})",
        details=[
            _packed(
                error_details_pb2.ErrorInfo(
                    reason="INTERNAL", domain=DOMAIN, metadata={"incident": incident}
                )
            )
        ],
    )


def trailing_metadata(status: status_pb2.Status) -> tuple[tuple[str, bytes], ...]:
    return ((DETAILS_KEY, status.SerializeToString()),)


def grpc_code(status: status_pb2.Status) -> grpc.StatusCode:
    return next(c for c in grpc.StatusCode if c.value[0] == status.code)


def error_record(exc: BaseException) -> dict[str, Any]:
    """What an operation stores when it fails: enough to rebuild its status after a restart."""
    if not isinstance(exc, AgentError):
        return {
            "type": "Internal",
            "code": grpc.StatusCode.INTERNAL.value[0],
            "message": "internal error in the agent; the agent log has the details",
        }
    record: dict[str, Any] = {
        "type": type(exc).__name__,
        "code": code_of(exc).value[0],
        "message": _message(exc),
    }
    blockers: Sequence[str] = getattr(exc, "blockers", ())
    violations = _violations(exc)
    if blockers:
        record["blockers"] = list(blockers)
    if violations:
        record["violations"] = [
            {"field": v.field, "description": v.description} for v in violations
        ]
    return record


def recorded_code(record: Mapping[str, Any]) -> int:
    """The code of a stored error; records written without one (StateStore) go by their type."""
    code = record.get("code")
    if isinstance(code, int):
        return code
    return _RECORDED_CODES.get(str(record.get("type")), grpc.StatusCode.UNKNOWN).value[0]


# -- decoding: a status (or a failed operation) back into the domain error --------------------

#: Error class by the name the server sends in its ErrorInfo: every class a rule encodes, and
#: the subclasses sent under their base's rule.
BY_NAME: Mapping[str, type[AgentError]] = {
    cls.__name__: cls for cls in (*(rule.error for rule in _RULES), DigestMismatch, Unrolled)
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


def operation_failure(error: operations_pb2.OperationError) -> AgentError:
    """The domain error an operation ended with (its reason names the error class)."""
    cls = BY_NAME.get(error.reason, AgentError)
    message = f"{error.reason}: {error.message}" if cls is AgentError else error.message
    if issubclass(cls, InvalidSpec):
        return cls(message, [FieldViolation(v.field, v.description) for v in error.violations])
    if issubclass(cls, Busy):
        return cls(message, list(error.blockers))
    return cls(message)
