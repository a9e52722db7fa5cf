"""OperationRunner: long work as stored operations; request ids; wait, watch, cancel, stop."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from agent._proto.gpuagent.v1 import operations_pb2, prewarm_pb2, sharing_pb2
from agent.api.events import EventBus
from agent.api.operations import (
    Checkpointed,
    OperationContext,
    OperationRunner,
    OperationsServicer,
)
from agent.errors import Busy, Conflict, InvalidSpec
from agent.operation import INTERRUPTED
from agent.state import StateStore
from agent.wire.operations import operation_pb

REQUEST = prewarm_pb2.SubmitPrewarmRequest(
    targets=[prewarm_pb2.PrewarmTarget(image=prewarm_pb2.ImageTarget(ref="busybox:1"))]
)


def result(name: str) -> operations_pb2.OperationResponse:
    return operations_pb2.OperationResponse(
        mig_apply=operations_pb2.MigApplyResult(config_name=name, changed=True)
    )


Scenario = Callable[[OperationRunner], Awaitable[None]]


def with_runner(scenario: Scenario) -> Callable[[Path], None]:
    """Run an async scenario against a runner on a fresh store (no pytest asyncio plugin)."""

    def test(tmp_path: Path) -> None:
        async def main() -> None:
            store = StateStore(tmp_path / "agent.db")
            bus = EventBus()
            bus.bind(asyncio.get_running_loop())
            runner = OperationRunner(store, bus, workers=2)
            runner.bind(asyncio.get_running_loop())
            try:
                await scenario(runner)
            finally:
                await runner.shutdown(5)
                store.close()

        asyncio.run(main())

    test.__name__ = scenario.__name__
    test.__doc__ = scenario.__doc__
    return test


@with_runner
async def test_work_runs_in_the_background_and_its_result_is_kept(runner: OperationRunner) -> None:
    gate = threading.Event()

    def work(ctx: OperationContext) -> operations_pb2.OperationResponse:
        gate.wait(10)
        return result("all-1g")

    op = await runner.start("mig.apply", "", REQUEST, work)
    assert not op.done
    gate.set()
    done = await runner.wait(op.id, 10)
    message = operation_pb(done)
    assert message.state == operations_pb2.OPERATION_STATE_SUCCEEDED and message.done
    assert message.response.mig_apply.config_name == "all-1g"
    assert message.name == f"operations/{op.id}"


@with_runner
async def test_a_retried_request_id_gets_the_same_operation_and_no_second_run(
    runner: OperationRunner,
) -> None:
    runs = []

    def work(ctx: OperationContext) -> operations_pb2.OperationResponse:
        runs.append(ctx.id)
        return result("x")

    first = await runner.start("prewarm", "req-1", REQUEST, work)
    await runner.wait(first.id, 10)
    again = await runner.start("prewarm", "req-1", REQUEST, work)
    assert again.id == first.id and again.done
    assert runs == [first.id]
    other = prewarm_pb2.SubmitPrewarmRequest(
        targets=[prewarm_pb2.PrewarmTarget(image=prewarm_pb2.ImageTarget(ref="other:2"))]
    )
    with pytest.raises(Conflict):
        await runner.start("prewarm", "req-1", other, work)


@with_runner
async def test_errors_are_recorded_with_the_code_the_call_would_get(
    runner: OperationRunner,
) -> None:
    def refused(ctx: OperationContext) -> operations_pb2.OperationResponse:
        raise Busy("GPU 0 has processes", ["pid 7"])

    def buggy(ctx: OperationContext) -> operations_pb2.OperationResponse:
        raise KeyError("secret")

    busy = operation_pb(
        await runner.wait((await runner.start("mig.apply", "", REQUEST, refused)).id, 10)
    )
    assert busy.state == operations_pb2.OPERATION_STATE_FAILED
    assert (busy.error.code, busy.error.reason, list(busy.error.blockers)) == (
        grpc.StatusCode.FAILED_PRECONDITION.value[0],
        "Busy",
        ["pid 7"],
    )
    bug = operation_pb(
        await runner.wait((await runner.start("mig.apply", "", REQUEST, buggy)).id, 10)
    )
    assert bug.error.code == grpc.StatusCode.INTERNAL.value[0] and "secret" not in bug.error.message


@with_runner
async def test_cancel_stops_the_work_at_its_next_checkpoint(runner: OperationRunner) -> None:
    started = threading.Event()

    def work(ctx: OperationContext) -> operations_pb2.OperationResponse:
        started.set()
        while not ctx.cancelled():
            ctx.progress(
                operations_pb2.OperationMetadata(
                    mig_apply=operations_pb2.MigApplyProgress(phase="applying", steps_done=1)
                )
            )
            threading.Event().wait(0.01)
        raise Conflict("rolled back after the cancellation")

    op = await runner.start("mig.apply", "", REQUEST, work)
    await asyncio.to_thread(started.wait, 10)
    asked = await runner.cancel(op.id)
    assert asked.cancel_requested
    final = operation_pb(await runner.wait(op.id, 10))
    assert final.state == operations_pb2.OPERATION_STATE_CANCELLED
    assert final.metadata.mig_apply.phase == "applying"
    assert "rolled back" in final.error.message


@with_runner
async def test_wait_returns_the_unfinished_operation_when_the_timeout_passes(
    runner: OperationRunner,
) -> None:
    gate = threading.Event()
    op = await runner.start("prewarm", "", REQUEST, lambda ctx: (gate.wait(10), result("x"))[1])
    waited = await runner.wait(op.id, 0.2)
    assert not waited.done
    gate.set()
    assert (await runner.wait(op.id, 10)).done


@with_runner
async def test_watch_yields_every_change_until_done(runner: OperationRunner) -> None:
    steps = threading.Event()

    def work(ctx: OperationContext) -> operations_pb2.OperationResponse:
        steps.wait(10)
        for i in range(3):
            ctx.progress(
                operations_pb2.OperationMetadata(
                    mig_apply=operations_pb2.MigApplyProgress(steps_done=i + 1)
                ),
                force=True,
            )
        return result("x")

    op = await runner.start("mig.apply", "", REQUEST, work)
    seen = []
    async for state in runner.watch(op.id):
        seen.append(state)
        steps.set()
    assert seen[-1].state == "succeeded"
    assert len(seen) >= 2


@with_runner
async def test_quick_calls_with_a_request_id_answer_once(runner: OperationRunner) -> None:
    calls = []
    request = sharing_pb2.ClearSharingRequest(request_id="clear-1")

    async def call() -> sharing_pb2.ClearSharingResponse:
        calls.append(1)
        return sharing_pb2.ClearSharingResponse(
            change=sharing_pb2.SharingChange(action="clear", changed=True)
        )

    method = "/gpuagent.v1.SharingService/ClearSharing"
    first = await runner.once(method, request, "clear-1", sharing_pb2.ClearSharingResponse, call)
    again = await runner.once(method, request, "clear-1", sharing_pb2.ClearSharingResponse, call)
    assert first == again and len(calls) == 1
    # Internal records are not operations of the API.
    assert await runner.list("", None, 100) == []


@with_runner
async def test_a_failed_quick_call_runs_again_on_retry(runner: OperationRunner) -> None:
    attempts = []

    async def call() -> sharing_pb2.ClearSharingResponse:
        attempts.append(1)
        if len(attempts) == 1:
            raise InvalidSpec("not yet")
        return sharing_pb2.ClearSharingResponse()

    request = sharing_pb2.ClearSharingRequest(request_id="r")
    with pytest.raises(InvalidSpec):
        await runner.once("/m", request, "r", sharing_pb2.ClearSharingResponse, call)
    await runner.once("/m", request, "r", sharing_pb2.ClearSharingResponse, call)
    assert len(attempts) == 2


def test_at_shutdown_running_work_is_left_for_the_next_start(tmp_path: Path) -> None:
    asyncio.run(_shutdown_scenario(tmp_path))


async def _shutdown_scenario(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "agent.db")
    bus = EventBus()
    runner = OperationRunner(store, bus)
    runner.bind(asyncio.get_running_loop())
    started = threading.Event()

    def work(ctx: OperationContext) -> operations_pb2.OperationResponse:
        started.set()
        while not ctx.stopping():
            threading.Event().wait(0.01)
        raise Checkpointed("partial kept")

    op = await runner.start("prewarm", "", REQUEST, work)
    await asyncio.to_thread(started.wait, 10)
    await runner.shutdown(5)
    assert store.get_operation(op.id).state == "running"
    (failed,) = store.mark_interrupted_operations("restarted")
    assert failed.error == {"type": INTERRUPTED, "message": "restarted"}
    message = operation_pb(failed)
    assert message.error.code == grpc.StatusCode.ABORTED.value[0]
    store.close()


@with_runner
async def test_list_operations_pages_through_everything_once(runner: OperationRunner) -> None:
    """AIP-158: page_size bounds a page, next_page_token resumes, the last page has none; a
    token is refused (naming page_token) when garbled or used with another filter."""

    servicer = OperationsServicer(runner)
    made = [
        runner.store.create_operation("prewarm", request_id=None, request={"n": n})
        for n in range(5)
    ]
    runner.store.create_operation("call:SetSharing", request_id="k", request={})  # never listed
    seen, token, pages = [], "", 0
    context: grpc.aio.ServicerContext = None  # type: ignore[assignment]  # unused by the call
    while True:
        request = operations_pb2.ListOperationsRequest(page_size=2, page_token=token)
        page = await servicer.ListOperations(request, context)
        assert len(page.operations) <= 2
        seen += [op.name for op in page.operations]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == [f"operations/{op.id}" for op in reversed(made)] and pages == 3

    first = await servicer.ListOperations(
        operations_pb2.ListOperationsRequest(page_size=1), context
    )
    for bad in (
        operations_pb2.ListOperationsRequest(page_token=first.next_page_token, kind="mig.apply"),
        operations_pb2.ListOperationsRequest(page_token=first.next_page_token, done=True),
        operations_pb2.ListOperationsRequest(page_token="not-a-token"),
        operations_pb2.ListOperationsRequest(page_token="x" * 10_000),
        operations_pb2.ListOperationsRequest(page_size=1001),
        # well-formed, with a time that is no float: 330 digits, or NaN
        *(operations_pb2.ListOperationsRequest(page_token=_token(t)) for t in ("9" * 330, "NaN")),
    ):
        with pytest.raises(InvalidSpec) as caught:
            await servicer.ListOperations(bad, context)
        assert {v.field for v in caught.value.violations} <= {"page_token", "page_size"}
        assert caught.value.violations


def _token(created: str) -> str:
    """A page token as ListOperations makes one (all filters unset), its time ``created``."""
    data = json.dumps({"t": 0, "id": "op", "f": "|"}).replace("0", created, 1)
    return base64.urlsafe_b64encode(data.encode()).decode()
