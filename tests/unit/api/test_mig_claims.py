"""The node as arbiter of fleet MIG changes, over a real server on the simulator: a claim
changes nothing and keeps every other holder's change (and any apply outside a rollout) out;
an apply bound to it keeps it alive until the operation ends, whoever asked for a release;
an unbound claim ends on its own after its time to live; bad fields are refused by name."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
from google.rpc import error_details_pb2

from agent._proto.gpuagent.v1 import mig_pb2, operations_pb2
from tests.unit.api.mig_node import config, details, held_node

HALVES = config("[0]", "{3g.40gb: 2}")


async def refused(call: object, code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == code, exc
        return exc
    raise AssertionError(f"expected {code.name}")


async def scenario(tmp_path: Path) -> None:
    async with held_node(tmp_path) as node:
        mig, ops, entered, go = node.mig, node.ops, node.entered, node.release

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


def test_the_node_admits_one_claim_holders_changes_until_its_operation_ends(
    tmp_path: Path,
) -> None:
    asyncio.run(scenario(tmp_path))
