"""A fake kubelet PodResources server on a Unix socket, speaking our v1 proto over real gRPC."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import grpc

from agent._proto.k8s.podresources.v1 import api_pb2, api_pb2_grpc

#: (namespace, pod, container, resource name, device ids)
Row = tuple[str, str, str, str, Sequence[str]]
#: (namespace, pod, container, claim name, driver, pool, device): a DRA claim's device
DraRow = tuple[str, str, str, str, str, str, str]


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, rows: Sequence[Row] = (), dra_rows: Sequence[DraRow] = ()) -> None:
        self.rows = list(rows)
        self.dra_rows = list(dra_rows)
        self.calls = 0
        self.fail_with: grpc.StatusCode | None = None

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        self.calls += 1
        if self.fail_with is not None:
            context.abort(self.fail_with, "rejected by rate limit")
        pods: dict[tuple[str, str], api_pb2.PodResources] = {}
        for namespace, pod, container, resource, ids in self.rows:
            entry = pods.setdefault(
                (namespace, pod), api_pb2.PodResources(name=pod, namespace=namespace)
            )
            found = [c for c in entry.containers if c.name == container]
            target = found[0] if found else entry.containers.add(name=container)
            target.devices.add(resource_name=resource, device_ids=list(ids))
        for namespace, pod, container, claim, driver, pool, device in self.dra_rows:
            entry = pods.setdefault(
                (namespace, pod), api_pb2.PodResources(name=pod, namespace=namespace)
            )
            found = [c for c in entry.containers if c.name == container]
            target = found[0] if found else entry.containers.add(name=container)
            dynamic = target.dynamic_resources.add(claim_name=claim, claim_namespace=namespace)
            dynamic.claim_resources.add(driver_name=driver, pool_name=pool, device_name=device)
        return api_pb2.ListPodResourcesResponse(pod_resources=list(pods.values()))


@contextmanager
def serve(socket: Path, kubelet: FakeKubelet) -> Iterator[FakeKubelet]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield kubelet
    finally:
        server.stop(grace=None).wait()
