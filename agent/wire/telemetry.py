"""TelemetryService on the wire: the sampler's snapshot as a message."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from agent._proto.gpuagent.v1 import telemetry_pb2
from agent.telemetry.snapshot import Entity, Snapshot
from agent.wire.timestamps import seconds, timestamp
from dcgm.fields import BY_ID

__all__ = ["Scrape", "scrape_from", "snapshot_pb"]


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
        ],
        xids=[
            telemetry_pb2.XidCount(entity=_entity_pb(x.entity), xid=x.xid, count=x.count)
            for x in snapshot.xids
        ],
        pods_hidden=not pods,
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
