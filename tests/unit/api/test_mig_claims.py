"""The node as arbiter of fleet MIG changes, over a real server on the simulator: a claim
changes nothing and keeps every other holder's change (and any apply outside a rollout) out;
an apply bound to it keeps it alive until the operation ends, whoever asked for a release;
an unbound claim ends on its own after its time to live; bad fields are refused by name."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import grpc
from google.rpc import error_details_pb2

from agent._proto.gpuagent.v1 import mig_pb2, mig_pb2_grpc, operations_pb2, operations_pb2_grpc
from agent.api.auth import Policy
from agent.api.events import EventBus
from agent.api.interceptor import ApiInterceptor
from agent.api.mig import MigServicer
from agent.api.operations import OperationRunner, OperationsServicer
from agent.gpu import open_driver
from agent.gpu.sim import SimControl
from agent.gpu.types import GpuInfo
from agent.mig.lock import PartitionLock
from agent.mig.service import MigService
from agent.state import StateStore
from tests.unit.api.test_mig_servicer import HOLDER, config, details

HALVES = config("[0]", "{3g.40gb: 2}")


async def refused(call: object, code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == code, exc
        return exc
    raise AssertionError(f"expected {code.name}")


async def scenario(tmp_path: Path) -> None:
    state_dir = tmp_path / "node"
    driver = open_driver("dgx-h100", state_dir)
    control = SimControl(state_dir)
    control.add_holder(0, HOLDER)  # the apply waits in its reset until the test lets it go
    entered, go = threading.Event(), threading.Event()

    def reset(gpu: GpuInfo) -> None:
        entered.set()
        go.wait(30)
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
            mig = mig_pb2_grpc.MigServiceStub(channel)
            ops = operations_pb2_grpc.OperationsServiceStub(channel)

            async def claim() -> mig_pb2.GetMigClaimResponse:
                return await mig.GetMigClaim(mig_pb2.GetMigClaimRequest())

            async def listed() -> int:
                request = operations_pb2.ListOperationsRequest(kind="mig.apply")
                return len((await ops.ListOperations(request)).operations)

            assert not (await claim()).HasField("claim")
            for bad, field in (
                (mig_pb2.ClaimMigRequest(holder=""), "holder"),
                (mig_pb2.ClaimMigRequest(holder="a", ttl_seconds=301), "ttl_seconds"),
                (mig_pb2.ClaimMigRequest(holder="a", rollout="x" * 254), "rollout"),
            ):
                exc = await refused(mig.ClaimMig(bad), grpc.StatusCode.INVALID_ARGUMENT)
                (request_error,) = details(exc, error_details_pb2.BadRequest)
                assert [v.field for v in request_error.field_violations] == [field]
            assert not (await claim()).HasField("claim")  # a refusal changes nothing

            a = mig_pb2.ClaimMigRequest(holder="coord-a", rollout="r1", max_unavailable="1")
            held = (await mig.ClaimMig(a)).claim
            assert (held.holder, held.rollout, held.max_unavailable) == ("coord-a", "r1", "1")
            assert 0 < held.expires_in_seconds <= 30 and not held.operation
            b = mig_pb2.ClaimMigRequest(holder="coord-b", rollout="r2", max_unavailable="1")
            exc = await refused(mig.ClaimMig(b), grpc.StatusCode.ABORTED)
            assert "claimed by coord-a (rollout r1)" in (exc.details() or "")
            # The node refuses a change another holder's claim covers: by hand or by coord-b.
            for holder in ("", "coord-b"):
                request = mig_pb2.ApplyMigRequest(config_yaml=HALVES, claim_holder=holder)
                exc = await refused(mig.ApplyMig(request), grpc.StatusCode.ABORTED)
                assert "claimed by coord-a" in (exc.details() or "")
            assert await listed() == 0

            request = mig_pb2.ApplyMigRequest(config_yaml=HALVES, claim_holder="coord-a")
            op = (await mig.ApplyMig(request)).operation
            await asyncio.to_thread(entered.wait, 10)
            release = mig_pb2.ReleaseMigClaimRequest(holder="coord-a")
            assert not (await mig.ReleaseMigClaim(release)).released  # bound: ends with the op
            bound = (await claim()).claim
            assert (bound.holder, bound.operation, bound.expires_in_seconds) == (
                "coord-a", op.name, 0.0
            )  # fmt: skip
            await refused(mig.ClaimMig(b), grpc.StatusCode.ABORTED)
            go.set()
            done = await ops.WaitOperation(
                operations_pb2.WaitOperationRequest(name=op.name), timeout=20
            )
            assert done.operation.state == operations_pb2.OPERATION_STATE_SUCCEEDED
            assert not (await claim()).HasField("claim")  # it ended with the operation

            assert (await mig.ClaimMig(b)).claim.holder == "coord-b"
            other = mig_pb2.ReleaseMigClaimRequest(holder="coord-a")
            assert not (await mig.ReleaseMigClaim(other)).released  # not coord-a's
            gone = mig_pb2.ReleaseMigClaimRequest(holder="coord-b")
            assert (await mig.ReleaseMigClaim(gone)).released
            assert not (await claim()).HasField("claim")

            # A claim whose holder went away ends after its time to live (the agent's clock).
            short = mig_pb2.ClaimMigRequest(holder="coord-gone", ttl_seconds=1)
            await mig.ClaimMig(short)
            deadline = time.monotonic() + 10
            while (await claim()).HasField("claim"):
                assert time.monotonic() < deadline, "the claim never expired"
                await asyncio.sleep(0.1)
            assert (await mig.ClaimMig(b)).claim.holder == "coord-b"
    finally:
        go.set()
        await server.stop(None)
        await runner.shutdown(5)
        store.close()
        driver.close()


def test_the_node_admits_one_claim_holders_changes_until_its_operation_ends(
    tmp_path: Path,
) -> None:
    asyncio.run(scenario(tmp_path))
