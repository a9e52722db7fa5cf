"""Domain records <-> protobuf messages. Pure functions: no I/O, no service calls.

Servicers parse with the ``*_from_*`` functions (raising `InvalidSpec` naming the request field)
and answer with the ``*_pb`` ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

from google.protobuf import json_format, timestamp_pb2

from agent._proto.gpuagent.v1 import (
    agent_pb2,
    cache_pb2,
    events_pb2,
    operations_pb2,
    prewarm_pb2,
    sharing_pb2,
    types_pb2,
)
from agent.api.errors import recorded_code
from agent.errors import FieldViolation, InvalidSpec
from agent.gpu.types import GiProfile, GpuInstance, GpuLayout, Placement, Process
from agent.health.machine import Mark, State
from agent.health.monitor import HealthChange
from agent.prewarm import kinds
from agent.prewarm.kinds import source_for
from agent.prewarm.model import (
    CacheItem,
    ImageWarmth,
    ItemState,
    PullPolicy,
    Warmth,
    item_kind,
)
from agent.prewarm.source import SourceRequest
from agent.prewarm.store import Usage
from agent.prewarm.target import PULL_POLICY_PB, FieldType, message_values
from agent.redact import redact_text
from agent.sharing import Advertised, ApplyResult, PluginConfig, ReloadReport, SharingView
from agent.sharing.schema import render
from agent.state import Operation

OPERATION_PREFIX = "operations/"


def timestamp(epoch_s: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(epoch_s * 1e9))
    return ts


# -- node -----------------------------------------------------------------------------------------


_HEALTH_STATES = {
    State.HEALTHY: agent_pb2.HEALTH_STATE_HEALTHY,
    State.DEGRADED: agent_pb2.HEALTH_STATE_DEGRADED,
    State.FAILED: agent_pb2.HEALTH_STATE_FAILED,
}


def health_mark_pb(mark: Mark, reason: str) -> agent_pb2.HealthMark:
    """``reason``: the mark's reason as shown (`Mark.describe`)."""
    return agent_pb2.HealthMark(
        state=_HEALTH_STATES[mark.state],
        reason=reason,
        since=timestamp(mark.since),
        action=mark.action,
        pods=list(mark.pods),
    )


def health_event_pb(change: HealthChange) -> events_pb2.HealthEvent:
    return events_pb2.HealthEvent(
        gpu_index=max(change.gpu_index, 0),
        gpu_uuid=change.target.gpu_uuid,
        gpu_instance_id=change.target.gpu_instance,
        previous=_HEALTH_STATES[change.before],
        mark=health_mark_pb(change.mark, change.reason),
        held=change.held,
    )


def placement_pb(p: Placement) -> agent_pb2.Placement:
    return agent_pb2.Placement(start=p.start, size=p.size)


def gpu_instance_pb(gi: GpuInstance) -> agent_pb2.GpuInstance:
    return agent_pb2.GpuInstance(
        id=gi.id,
        profile_id=gi.profile_id,
        profile_name=gi.profile_name,
        placement=placement_pb(gi.placement),
        compute_instances=[
            agent_pb2.ComputeInstance(
                id=ci.id,
                profile_id=ci.profile_id,
                placement=placement_pb(ci.placement),
                uuid=ci.uuid or "",
            )
            for ci in gi.compute_instances
        ],
    )


def process_pb(p: Process) -> agent_pb2.Process:
    # pids of processes in other namespaces can exceed nothing here, but keep uint32 safe.
    return agent_pb2.Process(
        pid=p.pid & 0xFFFFFFFF,
        used_memory_bytes=p.used_memory_bytes,
        gpu_instance_id=p.gpu_instance_id,
        compute_instance_id=p.compute_instance_id,
    )


def mig_profile_pb(p: GiProfile) -> agent_pb2.MigProfile:
    return agent_pb2.MigProfile(
        id=p.id,
        name=p.name,
        slice_count=p.slice_count,
        memory_slices=p.memory_slices,
        instance_count=p.instance_count,
        memory_mb=p.memory_mb,
        placements=[placement_pb(x) for x in p.placements],
        constant=p.constant,
    )


def gpu_pb(
    layout: GpuLayout,
    *,
    lost: bool = False,
    idle_seconds: float | None = None,
    lost_detail: str = "",
) -> agent_pb2.Gpu:
    """``idle_seconds``: from the telemetry sampler; None leaves the field absent (unknown).
    ``lost_detail``: the driver's error for a lost GPU."""
    g = layout.gpu
    gpu = agent_pb2.Gpu(
        index=g.index,
        uuid=g.uuid,
        name=g.name,
        pci_bus_id=g.pci_bus_id,
        memory_total_bytes=g.memory_total_bytes,
        mig_capable=g.mig_capable,
        instances=[gpu_instance_pb(gi) for gi in layout.instances],
        processes=[process_pb(p) for p in layout.processes],
        pci_device_id=g.pci_device_id & 0xFFFFFFFF,
        pci_subsystem_id=g.pci_subsystem_id & 0xFFFFFFFF,
        mig_profiles=[mig_profile_pb(p) for p in layout.profiles],
        health=agent_pb2.GPU_HEALTH_LOST if lost else agent_pb2.GPU_HEALTH_OK,
        idle_seconds=idle_seconds,
        health_detail=lost_detail if lost else "",
    )
    if g.mig_mode is not None:
        gpu.mig_mode.CopyFrom(
            agent_pb2.MigMode(current=g.mig_mode.current, pending=g.mig_mode.pending)
        )
    return gpu


# -- cache ----------------------------------------------------------------------------------------

#: kind -> the API's CACHE_ITEM_KIND_<KIND>; a kind the API does not name yet shows as
#: UNSPECIFIED (a new kind adds its value to cache.proto to be named)
_KINDS: dict[str, cache_pb2.CacheItemKind] = {
    name.removeprefix("CACHE_ITEM_KIND_").lower(): cast(cache_pb2.CacheItemKind, value)
    for name, value in cache_pb2.CacheItemKind.items()
    if value != cache_pb2.CACHE_ITEM_KIND_UNSPECIFIED
}
_KINDS_FROM = {value: item_kind(kind) for kind, value in _KINDS.items()}
_STATES: dict[ItemState, cache_pb2.CacheItemState] = {
    ItemState.QUEUED: cache_pb2.CACHE_ITEM_STATE_QUEUED,
    ItemState.FETCHING: cache_pb2.CACHE_ITEM_STATE_FETCHING,
    ItemState.READY: cache_pb2.CACHE_ITEM_STATE_READY,
    ItemState.FAILED: cache_pb2.CACHE_ITEM_STATE_FAILED,
    ItemState.EVICTED: cache_pb2.CACHE_ITEM_STATE_EVICTED,
}


def item_state_pb(state: ItemState) -> cache_pb2.CacheItemState:
    return _STATES[state]


_WARMTH: dict[Warmth, cache_pb2.ImageWarmthLevel] = {
    Warmth.FULL: cache_pb2.IMAGE_WARMTH_LEVEL_FULL,
    Warmth.PARTIAL: cache_pb2.IMAGE_WARMTH_LEVEL_PARTIAL,
    Warmth.BOOTSTRAP_ONLY: cache_pb2.IMAGE_WARMTH_LEVEL_BOOTSTRAP_ONLY,
    Warmth.UNKNOWN: cache_pb2.IMAGE_WARMTH_LEVEL_UNKNOWN,
}


def image_warmth_pb(w: ImageWarmth) -> cache_pb2.ImageWarmth:
    return cache_pb2.ImageWarmth(
        level=_WARMTH[w.warmth],
        lazy=w.lazy,
        blobs_total=max(w.blobs_total, 0),
        blobs_warm=max(w.blobs_warm, 0),
        bytes_total=max(w.bytes_total, 0),
        bytes_warm=max(w.bytes_warm, 0),
    )


_PRIVATE_OPTION = "header:"  # where a request's secrets are read from: not for readers


def _source_pb(i: CacheItem) -> str:
    """An item's source as readers see it, as its kind says (agent/prewarm/source.py): a URL
    redacted (`redact_url`), an image reference whole (it has no query or user info)."""
    return source_for(i.kind).describe(i)


def cache_item_pb(i: CacheItem) -> cache_pb2.CacheItem:
    """An item as every reader sees it: no credential (source and error redacted, no header
    file paths), so it may go into replies, stored operation results and events alike."""
    item = cache_pb2.CacheItem(
        id=i.id,
        kind=_KINDS.get(i.kind, cache_pb2.CACHE_ITEM_KIND_UNSPECIFIED),
        name=i.name,
        source=_source_pb(i),
        state=_STATES[i.state],
        pinned=i.pinned,
        size_bytes=i.size,
        sha256=i.sha256 or "",
        expected_sha256=i.expected_sha256 or "",
        fetched_bytes=max(i.fetched_bytes, 0),
        hits=max(i.hits, 0),
        error=redact_text(i.error or ""),
        warm_seconds=i.warm_seconds,
        create_time=timestamp(i.created_at),
        options={k: v for k, v in i.options.items() if not k.startswith(_PRIVATE_OPTION)},
    )
    if i.finished_at is not None:
        item.finish_time.CopyFrom(timestamp(i.finished_at))
    if i.last_used is not None:
        item.last_use_time.CopyFrom(timestamp(i.last_used))
    if i.image_warmth is not None:
        item.image_warmth.CopyFrom(image_warmth_pb(i.image_warmth))
    return item


_STATES_FROM = {pb: state for state, pb in _STATES.items()}


def cache_usage_pb(u: Usage) -> cache_pb2.CacheUsage:
    return cache_pb2.CacheUsage(
        used_bytes=max(u.used_bytes, 0),
        reserved_bytes=max(u.reserved_bytes, 0),
        pinned_bytes=max(u.pinned_bytes, 0),
        capacity_bytes=max(u.capacity_bytes, 0),
        budget_bytes=max(u.budget_bytes, 0),
        volume_bytes=max(u.volume_bytes, 0),
    )


def cache_inventory_pb(usage: Usage, items: Iterable[CacheItem]) -> cache_pb2.CacheInventory:
    return cache_pb2.CacheInventory(
        usage=cache_usage_pb(usage), items=[cache_item_pb(i) for i in items]
    )


_MAX_TARGETS = 1000


def prewarm_requests_from(targets: Sequence[prewarm_pb2.PrewarmTarget]) -> list[SourceRequest]:
    """The request's targets as prewarm requests, each read by its kind's target schema
    (agent/prewarm/target.py); shape errors name ``targets[i].<kind>.<field>``."""
    if not 1 <= len(targets) <= _MAX_TARGETS:
        raise InvalidSpec(
            f"a prewarm needs 1 to {_MAX_TARGETS} targets, got {len(targets)}",
            [FieldViolation("targets", f"give 1 to {_MAX_TARGETS} targets")],
        )
    requests: list[SourceRequest] = []
    bad: list[FieldViolation] = []
    for i, target in enumerate(targets):
        which = target.WhichOneof("target")
        schema = kinds.schema_for(which) if which else None
        if schema is None:
            names = [s.kind for s in kinds.schemas()]
            bad.append(
                FieldViolation(f"targets[{i}]", f"set {', '.join(names[:-1])} or {names[-1]}")
            )
            continue
        assert which is not None
        values = message_values(schema, getattr(target, which), f"targets[{i}].{which}", bad)
        requests.append(schema.build(values))
    if bad:
        raise InvalidSpec("the prewarm request is malformed", bad)
    return requests


def prewarm_targets_pb(requests: Iterable[SourceRequest]) -> list[prewarm_pb2.PrewarmTarget]:
    """Requests (a manifest's, a command's) as the API's targets: `prewarm_requests_from`
    inverted, so a client says exactly what the agent will read back."""
    targets = []
    for r in requests:
        schema = kinds.for_request(r).schema
        if schema is None:
            raise InvalidSpec(f"a {kinds.for_request(r).kind} request has no API target")
        fields: dict[str, Any] = {}
        for name, value in schema.values(r).items():
            kind = schema.fields[name]
            if kind is FieldType.PULL_POLICY:
                fields[name] = PULL_POLICY_PB[PullPolicy(value)]
            elif kind is FieldType.TEXT:
                fields[name] = value or ""
            else:
                fields[name] = value
        message = _TARGET_MESSAGES[schema.kind]
        targets.append(prewarm_pb2.PrewarmTarget(**{schema.kind: message(**fields)}))
    return targets


#: PrewarmTarget's field -> its message class (FileTarget, ImageTarget, ModelTarget, ...)
_TARGET_MESSAGES: dict[str, Any] = {
    f.name: getattr(prewarm_pb2, f.message_type.name)
    for f in prewarm_pb2.PrewarmTarget.DESCRIPTOR.oneofs_by_name["target"].fields
    if f.message_type is not None
}


def cache_item_from(pb: cache_pb2.CacheItem) -> CacheItem:
    """`cache_item_pb` inverted, for a client that renders items (round trip tested); an
    image's warmth travels in its options, as the agent keeps it."""
    return CacheItem(
        id=pb.id,
        kind=_KINDS_FROM[pb.kind],
        name=pb.name,
        source=pb.source,
        state=_STATES_FROM[pb.state],
        pinned=pb.pinned,
        size=pb.size_bytes if pb.HasField("size_bytes") else None,
        sha256=pb.sha256 or None,
        expected_sha256=pb.expected_sha256 or None,
        fetched_bytes=pb.fetched_bytes,
        created_at=_seconds(pb.create_time) or 0.0,
        finished_at=_seconds(pb.finish_time) if pb.HasField("finish_time") else None,
        last_used=_seconds(pb.last_use_time) if pb.HasField("last_use_time") else None,
        hits=pb.hits,
        error=pb.error or None,
        warm_seconds=pb.warm_seconds if pb.HasField("warm_seconds") else None,
        options=dict(pb.options),
    )


def _seconds(ts: timestamp_pb2.Timestamp) -> float:
    return ts.ToNanoseconds() / 1e9


# -- sharing --------------------------------------------------------------------------------------

_STRATEGIES = {
    "none": sharing_pb2.SHARING_STRATEGY_NONE,
    "time-slicing": sharing_pb2.SHARING_STRATEGY_TIME_SLICING,
    "mps": sharing_pb2.SHARING_STRATEGY_MPS,
}


def sharing_config_pb(config: PluginConfig) -> sharing_pb2.SharingConfig:
    active = config.sharing.active
    return sharing_pb2.SharingConfig(
        strategy=_STRATEGIES[config.sharing.strategy],
        mig_strategy=config.mig_strategy,
        rename_by_default=active is not None and active.rename_by_default,
        fail_requests_greater_than_one=config.sharing.fail_requests_greater_than_one,
        resources=[
            sharing_pb2.SharedResource(name=r.name, replicas=_uint32(r.replicas))
            for r in (active.resources if active is not None else ())
        ],
        config_yaml=render(config),
    )


def advertised_pb(advertised: Iterable[Advertised]) -> list[sharing_pb2.AdvertisedResource]:
    return [
        sharing_pb2.AdvertisedResource(
            resource=a.resource,
            devices=_uint32(a.devices),
            replicas=_uint32(a.replicas),
            count=_uint32(a.count),
        )
        for a in advertised
    ]


def _uint32(value: int) -> int:
    """Saturated, so a file on disk the rules refuse still shows (its problems say why)."""
    return min(max(value, 0), 0xFFFFFFFF)


def reload_pb(report: ReloadReport) -> sharing_pb2.PluginReload:
    return sharing_pb2.PluginReload(
        method=report.method,
        done=report.done,
        detail=report.detail,
        time=timestamp(report.at),
        pids=[p & 0xFFFFFFFF for p in report.pids],
    )


def violations_pb(violations: Iterable[FieldViolation]) -> list[types_pb2.FieldViolation]:
    return [types_pb2.FieldViolation(field=v.field, description=v.description) for v in violations]


def sharing_view_pb(view: SharingView) -> sharing_pb2.GetSharingResponse:
    response = sharing_pb2.GetSharingResponse(
        config=sharing_config_pb(view.config),
        config_path=str(view.config_path),
        exists=view.exists,
        advertised=advertised_pb(view.advertised),
        plugin_state=view.pickup.state,
        plugin_detail=view.pickup.detail,
        problems=violations_pb(view.problems),
    )
    last = view.last_write
    if last is not None:
        response.last_write.CopyFrom(
            sharing_pb2.SharingWrite(action=last.action, write_time=timestamp(last.written_at))
        )
        if last.reload is not None:
            response.last_write.reload.CopyFrom(reload_pb(last.reload))
    return response


def sharing_change_pb(result: ApplyResult) -> sharing_pb2.SharingChange:
    change = sharing_pb2.SharingChange(
        action=result.action,
        changed=result.changed,
        config=sharing_config_pb(result.config),
        config_path=str(result.config_path),
        advertised=advertised_pb(result.advertised),
    )
    if result.reload is not None:
        change.reload.CopyFrom(reload_pb(result.reload))
    return change


# -- operations -----------------------------------------------------------------------------------

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
