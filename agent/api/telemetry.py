"""TelemetryService: the sampler's latest snapshot, the same one /metrics renders."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection

import grpc

from agent._proto.gpuagent.v1 import telemetry_pb2, telemetry_pb2_grpc
from agent.api.auth import granted, sees_processes
from agent.api.convert import timestamp
from agent.errors import DriverUnavailable, NotSupported
from agent.telemetry.snapshot import Entity, Snapshot
from dcgm.fields import BY_ID

__all__ = ["Exposition", "SnapshotSource", "TelemetryServicer", "snapshot_pb"]

SnapshotSource = Callable[[], Snapshot | None]
#: openmetrics -> the /metrics body and its content type (TelemetryService.exposition)
Exposition = Callable[[bool], tuple[bytes, str]]


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


class TelemetryServicer(telemetry_pb2_grpc.TelemetryServiceServicer):
    def __init__(
        self,
        source: SnapshotSource,
        require_gpu: Callable[[str], None],
        exposition: Exposition | None = None,
    ) -> None:
        """``require_gpu``: the node's driver guard; the snapshot is of GPUs, the metrics
        are the agent's too and serve without a driver."""
        self._source = source
        self._require_gpu = require_gpu
        self._exposition = exposition

    async def GetTelemetrySnapshot(
        self, request: telemetry_pb2.GetTelemetrySnapshotRequest, context: grpc.aio.ServicerContext
    ) -> telemetry_pb2.GetTelemetrySnapshotResponse:
        self._require_gpu("a telemetry snapshot")
        snapshot = self._source()
        if snapshot is None:
            raise DriverUnavailable("no telemetry sample yet; the sampler is starting")
        return telemetry_pb2.GetTelemetrySnapshotResponse(
            snapshot=snapshot_pb(snapshot, request.field_ids, pods=sees_processes(granted()))
        )

    async def GetMetrics(
        self, request: telemetry_pb2.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> telemetry_pb2.GetMetricsResponse:
        snapshot = self._source()
        if self._exposition is None:
            raise NotSupported("this agent serves no metrics exposition")
        # Rendered at most once per sample (the exporter caches it); off the loop when not.
        body, content_type = await asyncio.to_thread(self._exposition, request.openmetrics)
        response = telemetry_pb2.GetMetricsResponse(body=body, content_type=content_type)
        if snapshot is not None:  # none while the driver is away: the agent's own series only
            response.sample_time.CopyFrom(timestamp(snapshot.taken_at))
        return response
