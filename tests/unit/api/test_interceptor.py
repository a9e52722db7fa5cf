"""The interceptor wraps every handler: bugs become INTERNAL with an incident id and no text of
the exception, domain errors their status, in unary and streaming calls alike."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agent._proto.gpuagent.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    events_pb2,
    events_pb2_grpc,
)
from agent.api.auth import Policy
from agent.api.interceptor import ApiInterceptor
from agent.errors import NotFound


class Buggy(agent_pb2_grpc.NodeServiceServicer):
    async def GetNode(self, request, context):  # type: ignore[no-untyped-def]
        raise KeyError("/var/lib/secret-path")


class Streams(events_pb2_grpc.EventsServiceServicer):
    async def WatchEvents(self, request, context) -> AsyncIterator[events_pb2.WatchEventsResponse]:  # type: ignore[no-untyped-def]
        yield events_pb2.WatchEventsResponse(event=events_pb2.Event(sequence=1))
        raise NotFound("the stream's source went away")


async def serve_and_call(
    socket: Path,
) -> tuple[grpc.aio.AioRpcError, list[int], grpc.aio.AioRpcError]:
    server = grpc.aio.server(interceptors=[ApiInterceptor(Policy.of({}))])
    agent_pb2_grpc.add_NodeServiceServicer_to_server(Buggy(), server)
    events_pb2_grpc.add_EventsServiceServicer_to_server(Streams(), server)
    server.add_insecure_port(f"unix:{socket}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as unary:
                await agent_pb2_grpc.NodeServiceStub(channel).GetNode(agent_pb2.GetNodeRequest())
            seen: list[int] = []
            with pytest.raises(grpc.aio.AioRpcError) as stream:
                call = events_pb2_grpc.EventsServiceStub(channel).WatchEvents(
                    events_pb2.WatchEventsRequest()
                )
                async for answer in call:
                    seen.append(answer.event.sequence)
    finally:
        await server.stop(None)
    return unary.value, seen, stream.value


def test_bugs_are_internal_and_streams_map_domain_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="agent.api.interceptor"):
        unary, seen, stream = asyncio.run(serve_and_call(tmp_path / "s.sock"))
    assert unary.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in unary.details() and "incident" in unary.details()
    incident = unary.details().rsplit("incident ", 1)[1].rstrip(")")
    assert any(incident in r.getMessage() and r.exc_info for r in caplog.records)
    assert seen == [1]
    assert stream.code() == grpc.StatusCode.NOT_FOUND
    assert stream.details() == "the stream's source went away"
