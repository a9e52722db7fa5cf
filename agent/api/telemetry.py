"""TelemetryService: the sampler's latest snapshot, the same one /metrics renders."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from agent._proto.gpuagent.v1 import telemetry_pb2, telemetry_pb2_grpc
from agent.api.auth import granted, sees_processes
from agent.errors import DriverUnavailable, NotSupported
from agent.telemetry.snapshot import Snapshot
from agent.wire.telemetry import snapshot_pb
from agent.wire.timestamps import timestamp

__all__ = ["Exposition", "SnapshotSource", "TelemetryServicer"]

SnapshotSource = Callable[[], Snapshot | None]
#: openmetrics -> the /metrics body and its content type (TelemetryService.exposition)
Exposition = Callable[[bool], tuple[bytes, str]]


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
