"""Server reflection: ``grpc.reflection.v1`` beside ``grpc.reflection.v1alpha``.

grpcio-reflection (1.85) serves only v1alpha, while current tools (grpcurl, grpcui, Postman) ask
for v1 first. v1 is the same protocol under another package: its messages are those of v1alpha
field for field (proto/grpc/reflection/v1/reflection.proto), so the same bytes mean the same
thing in both, and one servicer answers both. Importing the generated v1 module puts its
descriptor in the default pool, so v1 is listed and described like every other service.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha import _async as reflection_aio
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agent._proto.grpc.reflection.v1 import reflection_pb2 as v1_pb2

__all__ = ["SERVICE_NAMES", "enable_reflection"]

SERVICE_NAMES = (
    v1_pb2.DESCRIPTOR.services_by_name["ServerReflection"].full_name,
    reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"].full_name,
)


def enable_reflection(service_names: Sequence[str], server: grpc.aio.Server) -> None:
    """Serve reflection (both versions) listing ``service_names`` and the reflection services."""
    servicer = reflection_aio.ReflectionServicer(
        (*service_names, *SERVICE_NAMES), pool=descriptor_pool.Default()
    )
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    # v1 calls decode as v1alpha messages and v1alpha answers encode as v1 ones: same bytes.
    v1 = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE_NAMES[0], {"ServerReflectionInfo": v1}),)
    )
