"""TelemetryService on the wire: the sampler's snapshot as a message."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from agent._proto.gpuagent.v1 import telemetry_pb2
from agent.telemetry.snapshot import Entity, PodRef, Snapshot, SourceStatus
from agent.wire.timestamps import seconds, timestamp
from dcgm.fields import BY_ID

__all__ = [
    "PodUse",
    "Sample",
    "SampledEntity",
    "Scrape",
    "TelemetryView",
    "scrape_from",
    "snapshot_pb",
    "telemetry_from",
]


def _entity_pb(entity: Entity) -> telemetry_pb2.TelemetryEntity:
    msg = telemetry_pb2.TelemetryEntity(gpu_index=entity.gpu.index, gpu_uuid=entity.gpu.uuid)
    if entity.instance is not None:
        msg.gpu_instance_id = entity.instance.gpu_instance_id
        msg.profile = entity.instance.profile
    return msg


def snapshot_pb(
    snapshot: Snapshot, field_ids: Collection[int] = (), *, pods: bool = True
) -> telemetry_pb2.TelemetrySnapshot:
    """``field_ids`` narrows the values returned; empty returns all. Without ``pods`` the pod
    of every sample and the per-container usage are withheld (and the snapshot says so)."""
    wanted = frozenset(field_ids)
    msg = telemetry_pb2.TelemetrySnapshot(
        time=timestamp(snapshot.taken_at),
        hostname=snapshot.hostname,
        driver_version=snapshot.driver_version,
        gpus=[
            telemetry_pb2.GpuUp(gpu_index=g.gpu.index, gpu_uuid=g.gpu.uuid, up=g.up)
            for g in snapshot.gpus
            if g.up is not None  # never read: whether it answers is unknown
        ],
        xids=[
            telemetry_pb2.XidCount(entity=_entity_pb(x.entity), xid=x.xid, count=x.count)
            for x in snapshot.xids
        ],
        pods_hidden=not pods,
        sources=[
            telemetry_pb2.SourceState(
                source=src.source, up=src.degraded is None, reason=src.degraded or ""
            )
            for src in snapshot.sources
        ],
    )
    for sample in snapshot.entities:
        entry = msg.entities.add(entity=_entity_pb(sample.entity), idle_seconds=sample.idle_seconds)
        for field_id, value in sorted(sample.values.items()):
            if wanted and field_id not in wanted:
                continue
            known = BY_ID.get(field_id)
            entry.values.add(field_id=field_id, name=known.name if known else "", value=value)
        if pods and sample.pod is not None:
            entry.pod.namespace = sample.pod.namespace
            entry.pod.name = sample.pod.name
            entry.pod.container = sample.pod.container
    for usage in snapshot.pods if pods else ():
        msg.pods.add(
            entity=_entity_pb(usage.entity),
            pod=telemetry_pb2.PodRef(
                namespace=usage.pod.namespace, name=usage.pod.name, container=usage.pod.container
            ),
            memory_used_bytes=usage.memory_used_bytes,
            sm_utilization=usage.sm_utilization,
        )
    return msg


@dataclass(frozen=True, slots=True)
class Scrape:
    """What the agent's /metrics returns now (GetMetrics)."""

    body: bytes
    content_type: str
    #: when the sample rendered was taken; None while there is none (no driver)
    sample_time: float | None


def scrape_from(response: telemetry_pb2.GetMetricsResponse) -> Scrape:
    sample = seconds(response.sample_time) if response.HasField("sample_time") else None
    return Scrape(response.body, response.content_type, sample)


# -- a snapshot, back into records, for clients ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class SampledEntity:
    """What a sample is of: a whole GPU, or one of its MIG GPU instances."""

    gpu_index: int
    gpu_uuid: str
    #: the GPU instance; None for a whole GPU
    gpu_instance_id: int | None
    #: the instance's profile; "" for a whole GPU
    profile: str


@dataclass(frozen=True, slots=True)
class Sample:
    entity: SampledEntity
    #: DCGM field id -> value
    values: Mapping[int, float]
    #: the container on the entity; None when none (or withheld)
    pod: PodRef | None
    idle_seconds: float | None


@dataclass(frozen=True, slots=True)
class PodUse:
    """One container's use of a shared device."""

    entity: SampledEntity
    pod: PodRef
    memory_used_bytes: float | None
    sm_utilization: float | None


@dataclass(frozen=True, slots=True)
class TelemetryView:
    """GetTelemetrySnapshot's snapshot: the latest samples and per-container use."""

    taken_at: float
    hostname: str
    driver_version: str
    samples: tuple[Sample, ...]
    pods: tuple[PodUse, ...]
    #: the caller's roles do not show pods: every sample's pod and the usage were withheld
    pods_hidden: bool
    #: each collection source chosen for the counters; ``degraded`` says why one was not read
    sources: tuple[SourceStatus, ...] = ()


def _entity_from(e: telemetry_pb2.TelemetryEntity) -> SampledEntity:
    gi = e.gpu_instance_id if e.HasField("gpu_instance_id") else None
    return SampledEntity(e.gpu_index, e.gpu_uuid, gi, e.profile)


def _pod_from(p: telemetry_pb2.PodRef) -> PodRef:
    return PodRef(p.namespace, p.name, p.container)


def telemetry_from(snapshot: telemetry_pb2.TelemetrySnapshot) -> TelemetryView:
    """`snapshot_pb` read back, for clients."""
    return TelemetryView(
        taken_at=seconds(snapshot.time),
        hostname=snapshot.hostname,
        driver_version=snapshot.driver_version,
        samples=tuple(
            Sample(
                _entity_from(s.entity),
                {v.field_id: v.value for v in s.values},
                _pod_from(s.pod) if s.HasField("pod") else None,
                s.idle_seconds if s.HasField("idle_seconds") else None,
            )
            for s in snapshot.entities
        ),
        pods=tuple(
            PodUse(
                _entity_from(u.entity),
                _pod_from(u.pod),
                u.memory_used_bytes if u.HasField("memory_used_bytes") else None,
                u.sm_utilization if u.HasField("sm_utilization") else None,
            )
            for u in snapshot.pods
        ),
        pods_hidden=snapshot.pods_hidden,
        sources=tuple(SourceStatus(s.source, None if s.up else s.reason) for s in snapshot.sources),
    )
