"""MigService over a real server, interceptor and MIG service on the simulator: ApplyMig
answers with an operation at once and reports typed progress; a second apply is refused with
ABORTED naming the running one; a retry gets the same operation; a cancellation rolls the GPUs
back; infeasible configs and busy GPUs are refused by the call itself. RestoreMig is the same
kind of operation: refused while an apply runs, bad checkpoints refused by the call naming the
field, and a checkpoint brought back exactly."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
from google.rpc import error_details_pb2

from agent._proto.gpuagent.v1 import mig_pb2, operations_pb2
from agent.mig.checkpoint import checkpoint_document
from tests.unit.api.mig_node import config, details, held_node


async def scenario(tmp_path: Path) -> None:
    async with held_node(tmp_path) as node:
        driver, mig, ops = node.driver, node.mig, node.ops
        entered, release = node.entered, node.release
        held = config("[0]", "{3g.40gb: 2}")
        before = json.dumps(
            checkpoint_document([driver.layout(g.uuid) for g in driver.gpus()])
        ).encode()
        for bad, field in ((b"", "checkpoint"), (b"{not json", "checkpoint")):
            try:
                await mig.RestoreMig(mig_pb2.RestoreMigRequest(checkpoint=bad))
                raise AssertionError("a bad checkpoint must be refused by the call")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
                (request_error,) = details(exc, error_details_pb2.BadRequest)
                assert [v.field for v in request_error.field_violations] == [field]
        stranger = before.replace(driver.gpus()[0].uuid.encode(), b"GPU-elsewhere")
        try:
            await mig.RestoreMig(mig_pb2.RestoreMigRequest(checkpoint=stranger))
            raise AssertionError("a checkpoint of another node's GPU must be refused")
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "no GPU GPU-elsewhere on this node" in (exc.details() or "")

        plan = await mig.PlanMig(mig_pb2.PlanMigRequest(config_yaml=held))
        assert plan.config_name == "it" and [g.gpu_index for g in plan.gpus] == [0]
        assert plan.gpus[0].status == mig_pb2.MIG_PLAN_STATUS_CHANGE
        assert list(plan.unselected_gpus) == [1, 2, 3, 4, 5, 6, 7]

        infeasible = config("[1]", "{7g.80gb: 2}")
        try:
            await mig.ApplyMig(mig_pb2.ApplyMigRequest(config_yaml=infeasible))
            raise AssertionError("an infeasible layout must be refused by the call")
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION

        request = mig_pb2.ApplyMigRequest(config_yaml=held, request_id="roll-1")
        op = (await mig.ApplyMig(request)).operation
        assert not op.done and op.kind == "mig.apply"
        assert op.metadata.mig_apply.phase == "pending"
        await asyncio.to_thread(entered.wait, 10)
        assert (await mig.ApplyMig(request)).operation.name == op.name  # the retry

        try:
            await mig.RestoreMig(mig_pb2.RestoreMigRequest(checkpoint=before))
            raise AssertionError("a restore must be refused while an apply runs")
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.ABORTED  # one reconfiguration at a time
        other = mig_pb2.ApplyMigRequest(config_yaml=config("[1]", "{1g.10gb: 7}"))
        try:
            await mig.ApplyMig(other)
            raise AssertionError("a second apply must be refused while one runs")
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.ABORTED
            (failure,) = details(exc, error_details_pb2.PreconditionFailure)
            assert [v.subject for v in failure.violations] == [op.name]

        now = (await ops.GetOperation(operations_pb2.GetOperationRequest(name=op.name))).operation
        assert now.state == operations_pb2.OPERATION_STATE_RUNNING
        progress = now.metadata.mig_apply
        assert progress.phase == "apply" and progress.steps_done >= 1
        assert progress.gpus_total == 1 and "GPU 0" in progress.current_step

        await ops.CancelOperation(operations_pb2.CancelOperationRequest(name=op.name))
        release.set()
        ended = (
            await ops.WaitOperation(operations_pb2.WaitOperationRequest(name=op.name), timeout=20)
        ).operation
        assert ended.state == operations_pb2.OPERATION_STATE_CANCELLED, ended
        assert "rolled back GPU 0" in ended.error.message
        gpu0 = driver.gpus()[0]
        assert gpu0.mig_mode is not None and not gpu0.mig_mode.current  # as before

        done = (
            await mig.ApplyMig(mig_pb2.ApplyMigRequest(config_yaml=config("[1]", "{3g.40gb: 2}")))
        ).operation
        final = (
            await ops.WaitOperation(operations_pb2.WaitOperationRequest(name=done.name), timeout=20)
        ).operation
        assert final.state == operations_pb2.OPERATION_STATE_SUCCEEDED, final
        # A finished apply's progress counts the steps it made ("step 0/N" at each GPU's end),
        # and ends N/N: the plan's estimate counted a reset the driver did not need ("20/24").
        last = final.metadata.mig_apply
        assert (last.phase, last.gpus_done) == ("done", 1)
        assert 0 < last.steps_done == last.steps_total, last
        result = final.response.mig_apply
        assert result.changed and list(result.changed_gpu_uuids) == [driver.gpus()[1].uuid]
        assert [(g.gpu_index, g.status, g.created) for g in result.gpus] == [(1, "applied", 2)]
        check = await mig.AssertMig(
            mig_pb2.AssertMigRequest(config_yaml=config("[1]", "{3g.40gb: 2}"))
        )
        assert not check.matches  # the other GPUs are not selected by this config
        exported = await mig.ExportMig(mig_pb2.ExportMigRequest(config_name="now"))
        assert "3g.40gb: 2" in exported.config_yaml

        back = (await mig.RestoreMig(mig_pb2.RestoreMigRequest(checkpoint=before))).operation
        assert back.kind == "mig.apply" and back.metadata.mig_apply.gpus_total == 1
        restored = (
            await ops.WaitOperation(operations_pb2.WaitOperationRequest(name=back.name), timeout=20)
        ).operation
        assert restored.state == operations_pb2.OPERATION_STATE_SUCCEEDED, restored
        assert restored.metadata.mig_apply.config_name == "checkpoint"
        statuses = {g.gpu_index: g.status for g in restored.response.mig_apply.gpus}
        assert statuses[1] == "applied" and set(statuses.values()) == {"applied", "unchanged"}
        gpu1 = driver.gpus()[1]
        assert gpu1.mig_mode is not None and not gpu1.mig_mode.current  # as checkpointed


def test_apply_is_an_operation_one_at_a_time_with_progress_and_rollback_on_cancel(
    tmp_path: Path,
) -> None:
    asyncio.run(scenario(tmp_path))
