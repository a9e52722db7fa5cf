"""OperationsService on the wire: stored operations as messages, and operation names.

An operation's metadata and result are kept as the JSON of their messages (`message_dict`),
so a stored operation reads back as the message it was.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from agent._proto.gpuagent.v1 import operations_pb2, types_pb2
from agent.errors import FieldViolation, InvalidSpec
from agent.redact import redact_text
from agent.state import Operation
from agent.wire.errors import recorded_code
from agent.wire.timestamps import timestamp

__all__ = [
    "OPERATION_PREFIX",
    "message_dict",
    "operation_id_from",
    "operation_name",
    "operation_pb",
]

OPERATION_PREFIX = "operations/"

_OP_STATES = {
    "pending": operations_pb2.OPERATION_STATE_PENDING,
    "running": operations_pb2.OPERATION_STATE_RUNNING,
    "succeeded": operations_pb2.OPERATION_STATE_SUCCEEDED,
    "failed": operations_pb2.OPERATION_STATE_FAILED,
    "cancelled": operations_pb2.OPERATION_STATE_CANCELLED,
}


def operation_name(op_id: str) -> str:
    return OPERATION_PREFIX + op_id


def operation_id_from(name: str, field: str = "name") -> str:
    """``operations/<id>`` (or a bare id) -> id; InvalidSpec for anything else."""
    op_id = name.removeprefix(OPERATION_PREFIX)
    if not op_id or len(op_id) > 64 or not all(c in "0123456789abcdef" for c in op_id):
        raise InvalidSpec(
            f"{name!r} is not an operation name",
            [FieldViolation(field, "must be operations/<id>, as returned by the call")],
        )
    return op_id


def operation_error_pb(record: dict[str, Any]) -> operations_pb2.OperationError:
    return operations_pb2.OperationError(
        code=recorded_code(record),
        reason=str(record.get("type", "")),
        message=redact_text(str(record.get("message", ""))),
        blockers=[str(b) for b in record.get("blockers", ())],
        violations=[
            types_pb2.FieldViolation(
                field=str(v.get("field", "")), description=str(v.get("description", ""))
            )
            for v in record.get("violations", ())
        ],
    )


def operation_pb(op: Operation) -> operations_pb2.Operation:
    """A stored operation; metadata and result are kept as the JSON of their messages."""
    msg = operations_pb2.Operation(
        name=operation_name(op.id),
        kind=op.kind,
        state=_OP_STATES[op.state],
        done=op.done,
        request_id=op.request_id or "",
        create_time=timestamp(op.created_at),
        update_time=timestamp(op.updated_at),
        cancel_requested=op.cancel_requested,
    )
    json_format.ParseDict(op.metadata, msg.metadata, ignore_unknown_fields=True)
    if op.state in ("failed", "cancelled"):
        msg.error.CopyFrom(
            operation_error_pb(op.error or {"type": "Cancelled", "message": "cancelled"})
        )
    elif op.state == "succeeded":
        json_format.ParseDict(op.result or {}, msg.response, ignore_unknown_fields=True)
    return msg


def message_dict(message: Any) -> dict[str, Any]:
    """A message as the JSON dict we store (proto field names, defaults left out)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
