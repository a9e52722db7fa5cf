"""A node whose MIG apply can be held in the middle, served over a real server, interceptor and
MIG service on the simulator: what test_mig_servicer.py and test_mig_claims.py stand on.

A daemon holds GPU 0, so its MIG mode stays pending until the node's reset, which waits for the
test (``release``): an apply is held there as a slow drain-and-reset would hold it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_status import rpc_status

from agent._proto.gpuagent.v1 import mig_pb2_grpc, operations_pb2_grpc
from agent.api.auth import Policy
from agent.api.events import EventBus
from agent.api.interceptor import ApiInterceptor
from agent.api.mig import MigServicer
from agent.api.operations import OperationRunner, OperationsServicer
from agent.gpu import open_driver
from agent.gpu.nvml import GpuDriver
from agent.gpu.sim import SimControl
from agent.gpu.types import GpuInfo
from agent.mig.lock import PartitionLock
from agent.mig.service import MigService
from agent.state import StateStore

HOLDER = "nvidia-persistenced"


def config(devices: str, mig_devices: str) -> str:
    return (
        "version: v1\nmig-configs:\n  it:\n"
        f"    - devices: {devices}\n      mig-enabled: true\n      mig-devices: {mig_devices}\n"
    )


def details(exc: grpc.aio.AioRpcError, kind: type) -> list:  # type: ignore[type-arg]
    status = rpc_status.from_call(exc)
    assert status is not None
    found = []
    for detail in status.details:
        message = kind()
        if detail.Unpack(message):
            found.append(message)
    return found


@dataclass(frozen=True)
class HeldNode:
    driver: GpuDriver
    mig: mig_pb2_grpc.MigServiceStub
    ops: operations_pb2_grpc.OperationsServiceStub
    #: set when an apply reached GPU 0's reset; ``release`` lets the reset go on
    entered: threading.Event
    release: threading.Event


@asynccontextmanager
async def held_node(tmp_path: Path) -> AsyncIterator[HeldNode]:
    state_dir = tmp_path / "node"
    driver = open_driver("dgx-h100", state_dir)
    control = SimControl(state_dir)
    control.add_holder(0, HOLDER)
    entered, release = threading.Event(), threading.Event()

    def reset(gpu: GpuInfo) -> None:
        entered.set()
        release.wait(30)
        control.remove_holder(gpu.index, HOLDER)
        control.reset_gpu(gpu.index)

    store = StateStore(tmp_path / "agent.db")
    service = MigService(driver, store, PartitionLock(state_dir), reset)
    bus = EventBus()
    runner = OperationRunner(store, bus)
    loop = asyncio.get_running_loop()
    bus.bind(loop)
    runner.bind(loop)
    server = grpc.aio.server(interceptors=[ApiInterceptor(Policy.of({}))])
    mig_pb2_grpc.add_MigServiceServicer_to_server(
        MigServicer(service, runner, lambda: None, lambda: None, lambda _feature: None), server
    )
    operations_pb2_grpc.add_OperationsServiceServicer_to_server(OperationsServicer(runner), server)
    server.add_insecure_port(f"unix:{tmp_path / 's.sock'}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{tmp_path / 's.sock'}") as channel:
            yield HeldNode(
                driver,
                mig_pb2_grpc.MigServiceStub(channel),
                operations_pb2_grpc.OperationsServiceStub(channel),
                entered,
                release,
            )
    finally:
        release.set()
        await server.stop(None)
        await runner.shutdown(5)
        store.close()
        driver.close()
