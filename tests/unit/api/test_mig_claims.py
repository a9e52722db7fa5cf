"""The node as arbiter of fleet MIG changes, over a real server on the simulator: a claim
changes nothing and keeps every other holder's change (and any apply outside a rollout) out;
an apply bound to it keeps it alive until the operation ends, whoever asked for a release;
an unbound claim ends on its own after its time to live; bad fields are refused by name."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2

from agent._proto.gpuagent.v1 import mig_pb2, operations_pb2
from agent.mig.service import MigService
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


async def planned_slowly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planning, planned = threading.Event(), threading.Event()
    plan = MigService.plan

    def slow_plan(self: MigService, *args: Any, **kwargs: Any) -> Any:
        planning.set()
        planned.wait(10)
        return plan(self, *args, **kwargs)

    monkeypatch.setattr(MigService, "plan", slow_plan)
    async with held_node(tmp_path) as node:
        mig, ops = node.mig, node.ops

        async def apply_while(holder: str, meanwhile: Any) -> None:
            planning.clear()
            planned.clear()
            request = mig_pb2.ApplyMigRequest(config_yaml=HALVES, claim_holder=holder)
            call = asyncio.ensure_future(mig.ApplyMig(request))
            assert await asyncio.to_thread(planning.wait, 10)
            await meanwhile()
            planned.set()
            exc = await refused(call, grpc.StatusCode.ABORTED)
            assert "claim" in (exc.details() or "")
            listed = operations_pb2.ListOperationsRequest(kind="mig.apply")
            assert not (await ops.ListOperations(listed)).operations  # nothing started

        # The claim lapses while its apply plans and is taken again under the same holder.
        async def lapse_and_retake() -> None:
            await asyncio.sleep(1.2)
            await mig.ClaimMig(mig_pb2.ClaimMigRequest(holder="coord-a", rollout="r2"))

        await mig.ClaimMig(mig_pb2.ClaimMigRequest(holder="coord-a", ttl_seconds=1))
        await apply_while("coord-a", lapse_and_retake)
        held = (await mig.GetMigClaim(mig_pb2.GetMigClaimRequest())).claim
        assert (held.rollout, held.operation) == ("r2", "")  # unbound: the apply never bound it
        await mig.ReleaseMigClaim(mig_pb2.ReleaseMigClaimRequest(holder="coord-a"))

        # An apply outside any rollout does not start beside a claim taken while it planned.
        async def claimed() -> None:
            await mig.ClaimMig(mig_pb2.ClaimMigRequest(holder="coord-b"))

        await apply_while("", claimed)


def test_an_apply_starts_only_under_the_very_claim_it_was_admitted_under(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(planned_slowly(tmp_path, monkeypatch))
