"""Domain errors map to gRPC codes and google.rpc details in one table."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2

from agent.errors import (
    AgentError,
    Busy,
    Conflict,
    DeviceLost,
    DriverNotReady,
    DriverUnavailable,
    FieldViolation,
    InvalidSpec,
    NotFound,
    NotSupported,
    PermissionDenied,
)
from agent.operation import INTERRUPTED
from agent.prewarm.errors import Cancelled, DigestMismatch, DiskFull, FetchFailed
from agent.wire.errors import code_of, error_record, internal_status, recorded_code, status_of

S = grpc.StatusCode


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidSpec("bad"), S.INVALID_ARGUMENT),
        (NotFound("gone"), S.NOT_FOUND),
        (Conflict("does not fit"), S.FAILED_PRECONDITION),
        (Busy("processes", ["pid 4242"]), S.FAILED_PRECONDITION),
        (Busy("a MIG apply runs", ["operations/abc123"]), S.ABORTED),
        (NotSupported("no MIG"), S.UNIMPLEMENTED),
        (DeviceLost("fell off the bus"), S.FAILED_PRECONDITION),
        (PermissionDenied("no CAP_KILL"), S.PERMISSION_DENIED),
        (DriverUnavailable("no driver"), S.UNAVAILABLE),
        (DriverNotReady("mig apply needs the NVIDIA driver"), S.FAILED_PRECONDITION),
        (Cancelled("cancelled"), S.CANCELLED),
        (DiskFull("full"), S.RESOURCE_EXHAUSTED),
        (DigestMismatch("sha"), S.UNAVAILABLE),
        (FetchFailed("404"), S.UNAVAILABLE),
        (AgentError("plain"), S.UNKNOWN),
    ],
)
def test_each_domain_error_has_its_code(error: AgentError, code: grpc.StatusCode) -> None:
    assert code_of(error) is code
    assert status_of(error).code == code.value[0]
    assert error_record(error)["code"] == code.value[0]


def unpack(status, kind):  # type: ignore[no-untyped-def]
    found = []
    for detail in status.details:
        message = kind()
        if detail.Unpack(message):
            found.append(message)
    return found


def test_invalid_spec_carries_every_field_violation() -> None:
    error = InvalidSpec(
        "two problems",
        [
            FieldViolation("spec.resources[0].replicas", ">= 2"),
            FieldViolation("spec.strategy", "x"),
        ],
    )
    status = status_of(error)
    (bad,) = unpack(status, error_details_pb2.BadRequest)
    assert [(v.field, v.description) for v in bad.field_violations] == [
        ("spec.resources[0].replicas", ">= 2"),
        ("spec.strategy", "x"),
    ]
    (info,) = unpack(status, error_details_pb2.ErrorInfo)
    assert (info.reason, info.domain, info.metadata["error"]) == (
        "INVALID_SPEC",
        "gpu-agent.io",
        "InvalidSpec",
    )


def test_busy_names_the_blocking_processes() -> None:
    status = status_of(Busy("GPU 0 is busy", ["pid 4242", "holder nvidia-persistenced"]))
    (failure,) = unpack(status, error_details_pb2.PreconditionFailure)
    assert [(v.type, v.subject) for v in failure.violations] == [
        ("BUSY", "pid 4242"),
        ("BUSY", "holder nvidia-persistenced"),
    ]


def test_a_running_reconfiguration_is_aborted_naming_the_operation() -> None:
    status = status_of(Busy("another apply runs", ["operations/0f0f"]))
    assert status.code == S.ABORTED.value[0]
    (failure,) = unpack(status, error_details_pb2.PreconditionFailure)
    assert failure.violations[0].type == "OPERATION"


def test_internal_status_tells_nothing_but_the_incident() -> None:
    status = internal_status("abc123")
    assert status.code == S.INTERNAL.value[0]
    assert "abc123" in status.message and "Traceback" not in status.message


def test_bugs_are_recorded_without_their_text() -> None:
    record = error_record(KeyError("/etc/secret-path"))
    assert record["type"] == "Internal" and "secret" not in record["message"]
    assert record["code"] == S.INTERNAL.value[0]


def test_records_written_by_the_store_get_a_code_by_type() -> None:
    assert recorded_code({"type": INTERRUPTED, "message": "x"}) == S.ABORTED.value[0]
    assert recorded_code({"type": "Busy", "code": 9}) == 9


def test_an_error_sends_a_bounded_text_whatever_it_carries() -> None:
    """A refusal never carries its input: the message, the number of violations and each
    violation's field and description are capped (docs/api.md, Errors)."""
    exc = InvalidSpec(
        "x" * 100_000,
        [FieldViolation("f" * 5000, "d" * 50_000) for _ in range(500)],
    )
    status = status_of(exc)
    assert len(status.message) <= 1024
    bad = error_details_pb2.BadRequest()
    assert any(d.Unpack(bad) for d in status.details)
    assert len(bad.field_violations) == 21
    assert bad.field_violations[-1].description == "and 480 more"
    assert all(len(v.field) <= 200 and len(v.description) <= 300 for v in bad.field_violations)
    assert len(status.SerializeToString()) < 16 * 1024
    record = error_record(exc)
    assert len(record["message"]) <= 1024 and len(record["violations"]) == 21
