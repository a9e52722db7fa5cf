"""OperationsService on the wire: stored operations as messages, and operation names.

An operation's metadata and result are kept as the JSON of their messages (`message_dict`),
so a stored operation reads back as the message it was.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from google.protobuf import json_format

from agent._proto.gpuagent.v1 import cache_pb2, operations_pb2, types_pb2
from agent.errors import AgentError, FieldViolation, InvalidSpec
from agent.operation import Operation
from agent.redact import redact_text
from agent.wire.errors import OPERATION_BLOCKER_PREFIX, operation_failure, recorded_code
from agent.wire.prewarm import ItemStatus, item_status_from
from agent.wire.timestamps import timestamp

__all__ = [
    "OPERATION_PREFIX",
    "ItemProgress",
    "MigApplied",
    "MigGpuOutcome",
    "MigProgress",
    "OperationView",
    "PrewarmProgress",
    "message_dict",
    "operation_from",
    "operation_id_from",
    "operation_name",
    "operation_pb",
    "without_processes",
]

OPERATION_PREFIX = "operations/"

_OP_STATES = {
    "pending": operations_pb2.OPERATION_STATE_PENDING,
    "running": operations_pb2.OPERATION_STATE_RUNNING,
    "succeeded": operations_pb2.OPERATION_STATE_SUCCEEDED,
    "failed": operations_pb2.OPERATION_STATE_FAILED,
    "cancelled": operations_pb2.OPERATION_STATE_CANCELLED,
}


_OP_STATES_FROM = {pb: state for state, pb in _OP_STATES.items()}


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
        if op.result:  # what it did all the same (agent.api.operations.EndedShort)
            json_format.ParseDict(op.result, msg.failed_response, ignore_unknown_fields=True)
    elif op.state == "succeeded":
        json_format.ParseDict(op.result or {}, msg.response, ignore_unknown_fields=True)
    return msg


PROCESSES_WITHHELD = (
    "running processes are in the way; which ones is shown to the mig and admin roles"
)


def without_processes(op: operations_pb2.Operation) -> operations_pb2.Operation:
    """``op`` as a caller that sees no processes gets it (agent/api/auth.py, PROCESS_ROLES): an
    error whose blockers name processes (a MIG apply that processes on the GPU blocked) keeps
    its code, reason and the operations in its way, and says no pid. ``op`` is not changed."""
    if all(b.startswith(OPERATION_BLOCKER_PREFIX) for b in op.error.blockers):
        return op
    shown = operations_pb2.Operation()
    shown.CopyFrom(op)
    kept = [b for b in op.error.blockers if b.startswith(OPERATION_BLOCKER_PREFIX)]
    del shown.error.blockers[:]
    shown.error.blockers.extend(kept)
    shown.error.message = PROCESSES_WITHHELD
    return shown


def message_dict(message: Any) -> dict[str, Any]:
    """A message as the JSON dict we store (proto field names, defaults left out)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _prewarm_words(p: PrewarmProgress, items: Sequence[ItemProgress]) -> str:
    """``1 ready, 1 failed of 3 items, 1 in progress``: ended items by how they ended (a
    failed item is not "done"); by count alone from an agent that names no item states."""
    ended = Counter(i.state for i in items)
    if not items or any(not i.state for i in items):
        words = f"{p.items_done}/{p.items_total} items ended"
    else:
        said = ", ".join(f"{ended[s]} {s}" for s in ("ready", "failed", "evicted") if ended[s])
        words = f"{said or '0 ready'} of {p.items_total} items"
    left = p.items_total - p.items_done
    return words + (f", {left} in progress" if left > 0 else "")


# -- back into records, for clients ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ItemProgress:
    """How far one item of a prewarm got."""

    item_id: str
    done_bytes: int
    #: None while the item's size is not known
    total_bytes: int | None
    rate_bytes_per_second: float
    #: None while the rate gives no estimate
    eta_seconds: float | None
    name: str = ""
    #: queued, fetching, ready, failed, evicted ("" when not told)
    state: str = ""
    #: while the fetch waits to resume after a transient failure: the attempt, wait and why
    retrying: str = ""


@dataclass(frozen=True, slots=True)
class MigProgress:
    """Where a MIG apply (or restore) is: its phase and the mutation being made."""

    config_name: str
    phase: str
    steps_done: int
    current_step: str
    #: GPUs the plan changes, and those finished
    gpus_total: int
    gpus_done: int
    #: mutations the plan expects
    steps_total: int
    #: the GPUs finished, in the order they finished (empty from an agent before the field)
    done_gpus: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PrewarmProgress:
    """A prewarm's items in the request, and those ready or failed."""

    items_total: int
    items_done: int


@dataclass(frozen=True, slots=True)
class MigGpuOutcome:
    """What an apply did to one GPU (the fields, in order, of the API's MigGpuOutcome)."""

    gpu_index: int
    gpu_uuid: str
    #: unchanged, applied, or pending (the MIG mode waits for a reset or a reboot: ``message``)
    status: str
    kept: int
    destroyed: int
    created: int
    message: str


@dataclass(frozen=True, slots=True)
class MigApplied:
    """What a MIG apply did (the fields, in order, of the API's MigApplyResult)."""

    config_name: str
    changed_gpu_uuids: tuple[str, ...]
    changed: bool
    gpus: tuple[MigGpuOutcome, ...]
    mutations: int
    #: what finishing an earlier, interrupted apply did first, in words
    recovered: tuple[str, ...]
    #: what the agent did so the device plugin advertises the new layout, or why not ("": no
    #: GPU changed, or no device plugin serves the node)
    device_plugin: str = ""
    #: when the config selected no GPU (nothing applied): why its assert fails, one line each
    assert_mismatches: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OperationView:
    """An operation as a client follows it: its state, its kind's progress, how it ended."""

    name: str
    kind: str
    #: pending, running, succeeded, failed or cancelled (the state store's names)
    state: str
    done: bool
    #: the domain error it ended with; None unless it failed or was cancelled
    error: AgentError | None
    #: a prewarm's items ((): another kind)
    prewarm: tuple[ItemProgress, ...]
    #: a MIG apply's progress (None: another kind)
    mig_progress: MigProgress | None
    #: what a MIG apply did, once it succeeded, or all the same when it failed because it left
    #: a GPU's mode pending or a GPU lost (the API's ``failed_response``)
    mig_result: MigApplied | None
    #: a prewarm's counts of items (None: another kind)
    prewarm_progress: PrewarmProgress | None
    #: a prewarm's items as they ended, once it succeeded
    prewarm_result: tuple[ItemStatus, ...]
    #: the error as the agent reported it: the domain error's name and its message ("" when
    #: none), for a one-line account that names even an error this client does not know
    error_reason: str
    error_message: str

    @property
    def state_name(self) -> str:
        """The state as the API names it, e.g. ``OPERATION_STATE_CANCELLED``."""
        return operations_pb2.OperationState.Name(_OP_STATES[self.state])

    @property
    def progress(self) -> str:
        """How far it got, in words (its name for a kind without progress)."""
        m = self.mig_progress
        if m is not None:
            return (
                f"{m.phase}: {m.gpus_done}/{m.gpus_total} GPUs, step {m.steps_done}/{m.steps_total}"
            )
        p = self.prewarm_progress
        if p is not None:
            return _prewarm_words(p, self.prewarm)
        return self.name

    @property
    def failure(self) -> str:
        """Why it did not succeed, in one line."""
        if self.error is not None:
            return f"{self.error_reason}: {self.error_message}"
        return f"ended {self.state_name}"


def _item_state_word(state: int) -> str:
    """``fetching`` for CACHE_ITEM_STATE_FETCHING; "" for one this client does not know."""
    try:
        name = cache_pb2.CacheItemState.Name(cast(cache_pb2.CacheItemState, state))
    except ValueError:
        return ""
    return "" if name.endswith("UNSPECIFIED") else name.removeprefix("CACHE_ITEM_STATE_").lower()


def operation_from(op: operations_pb2.Operation) -> OperationView:
    """`operation_pb` read back, for clients; an unknown state reads as "pending"."""
    meta = op.metadata
    mig = meta.mig_apply if meta.HasField("mig_apply") else None
    warming = meta.prewarm if meta.HasField("prewarm") else None
    # A failed apply that left GPUs pending or lost says what it did in failed_response.
    response = op.failed_response if op.HasField("failed_response") else op.response
    result = response.mig_apply if response.HasField("mig_apply") else None
    warmed = op.response.prewarm.items if op.response.HasField("prewarm") else ()
    return OperationView(
        name=op.name,
        kind=op.kind,
        state=_OP_STATES_FROM.get(op.state, "pending"),
        done=op.done,
        error=operation_failure(op.error) if op.HasField("error") else None,
        prewarm=tuple(
            ItemProgress(
                i.item_id,
                i.done_bytes,
                i.total_bytes if i.HasField("total_bytes") else None,
                i.rate_bytes_per_second,
                i.eta_seconds if i.HasField("eta_seconds") else None,
                i.name,
                _item_state_word(i.state),
                i.retrying,
            )
            for i in meta.prewarm.items
        ),
        mig_progress=None
        if mig is None
        else MigProgress(
            mig.config_name,
            mig.phase,
            mig.steps_done,
            mig.current_step,
            mig.gpus_total,
            mig.gpus_done,
            mig.steps_total,
            tuple(mig.gpus_done_indices),
        ),
        mig_result=None if result is None else _mig_applied(result),
        prewarm_progress=None
        if warming is None
        else PrewarmProgress(warming.items_total, warming.items_done),
        prewarm_result=tuple(item_status_from(i) for i in warmed),
        error_reason=op.error.reason,
        error_message=op.error.message,
    )


def _mig_applied(result: operations_pb2.MigApplyResult) -> MigApplied:
    return MigApplied(
        config_name=result.config_name,
        changed_gpu_uuids=tuple(result.changed_gpu_uuids),
        changed=result.changed,
        gpus=tuple(
            MigGpuOutcome(
                g.gpu_index, g.gpu_uuid, g.status, g.kept, g.destroyed, g.created, g.message
            )
            for g in result.gpus
        ),
        mutations=result.mutations,
        recovered=tuple(result.recovered),
        device_plugin=result.device_plugin,
        assert_mismatches=tuple(result.assert_mismatches),
    )
