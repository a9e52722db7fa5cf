"""MigService: plan, apply (as an operation), assert and export MIG layouts (agent.mig.service).

The servicer parses and converts; the flow (partition lock, journal, rollback, recovery) is the
MIG service's. Two things are the API's: a second apply is refused at once with ABORTED naming
the running operation, and a cancellation (or the agent stopping) interrupts the apply before
its next mutation: a cancel is answered by rolling back every GPU the apply touched, the agent
stopping by suspending the apply, to be finished by the next start.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc
import yaml
from google.protobuf.message import Message

from agent._proto.gpuagent.v1 import mig_pb2, mig_pb2_grpc, operations_pb2
from agent.api.auth import Role, actor_of, claimant_of, granted, sees_processes
from agent.api.operations import (
    MIG_APPLY,
    Checkpointed,
    EndedShort,
    OperationContext,
    OperationRunner,
)
from agent.errors import Busy, Conflict, DeviceLost, FieldViolation, InvalidSpec
from agent.gpu.nvml import NvmlError
from agent.gpu.types import GpuInfo, GpuLayout
from agent.mig.advice import advise_gpu
from agent.mig.apply import ProgressEvent, Suspended
from agent.mig.checkpoint import parse_checkpoint
from agent.mig.claim import Claim, ClaimBook
from agent.mig.journal import reboot_waits
from agent.mig.node_plan import gone_said, refuse_unless_feasible
from agent.mig.outcomes import ApplyResult, NotApplied, RecoveryOutcome
from agent.mig.service import ROLLBACK_FAILED, MigService, RollbackFailed
from agent.mig.spec import MigSpec, name_problem, parse_spec
from agent.operation import INTERRUPTED, AlreadyRunning
from agent.owner import Actor
from agent.prewarm.errors import Cancelled
from agent.state import StateStore
from agent.wire.mig import (
    apply_result_pb,
    assert_pb,
    gpu_advice_pb,
    node_plan_pb,
    recovered_apply_pb,
)
from agent.wire.operations import message_dict, operation_name, operation_pb

log = logging.getLogger(__name__)

__all__ = ["MigServicer", "advise_layouts", "interrupted_apply", "recovered_rollbacks"]

_MAX_CONFIG = 1024 * 1024
_CHECKPOINT = "checkpoint"  # the config name a restore reports


def advise_layouts(
    layouts: Sequence[GpuLayout],
    gpu_index: int | None,
    profile: str,
    lost: Sequence[GpuInfo] = (),
    unread: Mapping[int, str] | None = None,
) -> mig_pb2.AdviseMigResponse:
    """Advice for the GPUs (or the one ``gpu_index`` names), for every profile or ``profile``;
    InvalidSpec names the field when the index or the profile names nothing here. Each ``lost``
    GPU is an entry whose note says so, never left out as if the node had one GPU fewer (an
    unread one, in ``unread``: index -> its failing call, is said with the call)."""
    if bad := name_problem(profile, "profile"):
        raise InvalidSpec("profile is too long or not printable", [bad])
    chosen = [g for g in layouts if gpu_index is None or g.gpu.index == gpu_index]
    if not chosen:
        have = ", ".join(str(g.gpu.index) for g in layouts) or "none"
        raise InvalidSpec(
            f"no GPU with index {gpu_index} on this node (GPUs: {have})",
            [FieldViolation("gpu_index", f"one of: {have}")],
        )
    offered = sorted({p.name for g in chosen for p in g.profiles})
    if profile and profile not in offered:
        have = ", ".join(offered) or "none (MIG is off)"
        raise InvalidSpec(
            f"MIG profile {profile!r} is not a GPU-instance profile of the GPUs asked about; "
            f"they offer: {have}",
            [FieldViolation("profile", f"one of: {have}")],
        )
    advised: list[mig_pb2.GpuMigAdvice] = [
        gpu_advice_pb(advise_gpu(g, profile or None), g) for g in chosen
    ]
    if gpu_index is None:
        why = unread or {}
        advised += [
            mig_pb2.GpuMigAdvice(
                gpu_index=g.index,
                gpu_uuid=g.uuid,
                model=g.name,
                note=f"cannot be read ({why[g.index]}): what fits on it is unknown"
                if g.index in why
                else "lost: what fits on it cannot be read",
            )
            for g in lost
        ]
    advised.sort(key=lambda g: g.gpu_index)
    return mig_pb2.AdviseMigResponse(gpus=advised)


def interrupted_apply(outcomes: Sequence[RecoveryOutcome]) -> dict[str, Any]:
    """How a ``mig.apply`` operation the agent was killed in ended, from what the MIG service's
    recover() did on this start: the `StateStore.update_operation` fields that say so."""
    said = "; ".join(f"GPU {o.gpu} {o.action}: {o.detail}" for o in outcomes)
    if outcomes and all(o.action == "completed" for o in outcomes):
        return {"state": "succeeded", "result": message_dict(recovered_apply_pb(outcomes))}
    if not outcomes:
        message = (
            "the agent stopped during this apply before it changed any GPU (its journal was "
            "empty on restart); nothing to roll back"
        )
    elif any(o.action == "failed" for o in outcomes):
        message = (
            f"the agent stopped during this apply and rolling it back on restart failed: {said}. "
            "The journal is kept; the next agent start or MIG apply retries the rollback"
        )
    else:
        message = f"the agent stopped during this apply; on restart: {said}"
    error = {"type": INTERRUPTED, "code": grpc.StatusCode.ABORTED.value[0], "message": message}
    if any(o.action == "failed" for o in outcomes):
        error[_ROLLBACK] = "failed"  # until a recovery finishes it: `recovered_rollbacks`
    return {"state": "failed", "error": error}


#: The key of a ``mig.apply`` error saying how its rollback stands ("failed", "recovered").
_ROLLBACK = "rollback"


def recovered_rollbacks(state: StateStore, outcomes: Sequence[RecoveryOutcome]) -> list[str]:
    """After a MIG recovery that left no GPU failed: each ended ``mig.apply`` operation whose
    error says its rollback failed (the apply's own rollback, or the one at a restart) is
    restated, saying the recovery finished it; `StateStore.restate_error` keeps what it said
    before in the error's history. Returns their ids."""
    said = "; ".join(f"GPU {o.gpu} {o.action}: {o.detail}" for o in outcomes) or "nothing left"
    restated = []
    after: tuple[float, str] | None = None
    while page := state.list_operations(kind=MIG_APPLY, done=True, after=after):
        after = (page[-1].created_at, page[-1].id)
        for op in page:
            error = op.error or {}
            if error.get("type") == RollbackFailed.__name__:
                cause = str(error.get("message", "")).partition(ROLLBACK_FAILED)[0]
                kind = Conflict.__name__  # what RollbackFailed is, less the claim
            elif error.get(_ROLLBACK) == "failed":  # `interrupted_apply`
                cause, kind = "the agent stopped during this apply", str(error["type"])
            else:
                continue
            message = (
                f"{cause}; rolling back failed at first, and the agent's MIG recovery has since "
                f"finished it: {said}"
            )
            now = {**error, "type": kind, "message": message, _ROLLBACK: "recovered"}
            state.restate_error(op.id, {k: v for k, v in now.items() if k != "history"})
            log.warning("operation %s (mig.apply): %s", op.id, message)
            restated.append(op.id)
    return restated


def _spec(text: str, name: str, field: str = "config_yaml") -> tuple[MigSpec, str | None]:
    bad = []
    if not text.strip():
        bad.append(FieldViolation(field, "required: a mig-parted v1 config file"))
    elif len(text) > _MAX_CONFIG:
        bad.append(FieldViolation(field, f"at most {_MAX_CONFIG} bytes"))
    if named := name_problem(name, "config_name"):
        bad.append(named)
    if bad:
        raise InvalidSpec("the MIG config is missing or malformed", bad)
    return parse_spec(text, field), name or None


class _Reconfigure:
    """The work of one ``mig.apply`` operation (an apply or a checkpoint restore), on an
    operation worker thread: progress, and the interruption rules checked before each mutation."""

    def __init__(
        self,
        work: Callable[[Callable[[ProgressEvent], None], str], ApplyResult],
        config: str,
        gpus_total: int,
        steps_total: int,
        *,
        suspend: bool,
        settle: Callable[[], None] = lambda: None,
    ) -> None:
        self._work = work
        self._config = config
        self._gpus_total = gpus_total
        self._steps_total = steps_total
        # An apply suspended by the agent stopping is finished by the next start; a restore
        # has no such record (its target is the file), so it is rolled back like a cancel.
        self._suspend = suspend
        self._settle = settle
        self._gpus_done = 0
        self._done_indices: list[int] = []
        # A GPU's "done" event carries no mutation number: the count stays at the last step.
        self._steps_done = 0
        self._lock = threading.Lock()

    def pending(self) -> operations_pb2.MigApplyProgress:
        """The progress it starts with, before the first step."""
        return operations_pb2.MigApplyProgress(
            config_name=self._config,
            phase="pending",
            gpus_total=self._gpus_total,
            steps_total=self._steps_total,
        )

    def __call__(self, ctx: OperationContext) -> operations_pb2.OperationResponse:
        def progress(event: ProgressEvent) -> None:
            with self._lock:
                if event.phase == "done":
                    self._gpus_done += 1
                    self._done_indices.append(event.gpu)
                self._steps_done = event.mutation or self._steps_done
                if event.phase == "done" and self._gpus_done >= self._gpus_total:
                    # Every GPU done: the steps taken are all there were (the plan's estimate
                    # counts a reset the driver may not need), not "20/24" at the end.
                    self._steps_total = self._steps_done
                total = max(self._steps_total, self._steps_done)
                meta = operations_pb2.MigApplyProgress(
                    config_name=self._config,
                    phase=event.phase,
                    gpus_total=self._gpus_total,
                    gpus_done=self._gpus_done,
                    steps_total=total,
                    steps_done=self._steps_done,
                    current_step=event.message,
                    current_gpu_index=event.gpu,
                    gpus_done_indices=self._done_indices,
                )
            ctx.progress(
                operations_pb2.OperationMetadata(mig_apply=meta), force=event.phase == "done"
            )
            # Checked before each mutation and while a DRA driver republishes (never during a
            # rollback). A cancel makes the MIG
            # service restore every GPU it touched; the agent stopping (SIGTERM) suspends an
            # apply, which the next start finishes (docs/mig.md).
            if event.phase not in ("apply", "republish"):  # republish: waiting for DRA
                return
            if ctx.cancelled():
                raise Cancelled(f"MIG change cancelled before {event.message}")
            if ctx.stopping():
                if not self._suspend:
                    raise Cancelled(
                        f"the agent is stopping: restore rolled back before {event.message}"
                    )
                raise Suspended(
                    f"the agent is stopping: MIG apply suspended before {event.message}"
                )

        try:
            # The lock's holder text: a refused caller is told which operation is in the way.
            result = self._work(progress, operation_name(ctx.id))
            if self._gpus_total == 0:  # no GPU to change, so no GPU's "done" ends "pending"
                done = operations_pb2.MigApplyProgress(config_name=self._config, phase="done")
                ctx.progress(operations_pb2.OperationMetadata(mig_apply=done), force=True)
        except Suspended as exc:
            raise Checkpointed(str(exc)) from exc  # stays running; the next start ends it
        finally:
            # Before the operation reads done: GetNode then shows the layout it left.
            self._settle()
        response = apply_result_pb(result)
        unapplied = result.not_done()
        if unapplied:  # a GPU pending or lost is no success: failed, saying what it did
            raise EndedShort(NotApplied(f"MIG configuration NOT applied: {unapplied}"), response)
        return response


def _busy(running: str, blockers: Sequence[str]) -> Busy:
    """ABORTED, naming the operation in the way (agent.wire.errors: a Busy naming operations/)."""
    return Busy(
        f"MIG apply {operation_name(running)} is running; one reconfiguration at a time: wait "
        f"for it (WaitOperation; gpu-agent operations wait {operation_name(running)}) and retry",
        [operation_name(op_id) for op_id in blockers],
    )


class MigServicer(mig_pb2_grpc.MigServiceServicer):
    def __init__(
        self,
        service: MigService,
        runner: OperationRunner,
        changed: Callable[[], None],
        settle: Callable[[], None],
        require_gpu: Callable[[str], None],
    ) -> None:
        """``require_gpu(feature)``: the node's driver guard (DriverNotReady while the GPUs
        are not attached), asked by every call before it reads or changes a GPU."""
        self._service = service
        self._require_gpu = require_gpu
        self._runner = runner
        self._changed = changed  # refreshes the inventory after a change
        self._settle = settle  # blocks until the inventory shows a finished change
        self._claims = ClaimBook()  # fleet rollouts' claims on this node (agent.mig.claim)

    async def PlanMig(
        self, request: mig_pb2.PlanMigRequest, context: grpc.aio.ServicerContext
    ) -> mig_pb2.PlanMigResponse:
        spec, name = _spec(request.config_yaml, request.config_name)
        self._require_gpu("mig plan")
        self._service.refuse_by_mode("mig apply")  # the apply it forecasts is refused
        # So is one over a journal whose rollback failed: refused as that apply would be.
        self._service.refuse_over_unrolled(f"MIG config {spec.select(name)[0]}")
        plan = await asyncio.to_thread(self._service.plan, spec, name, force=request.force)
        # A pending mode says what applies it; the journal is the state store (MigService's).
        reboot = await asyncio.to_thread(reboot_waits, self._runner.store)
        return node_plan_pb(plan, reboot)

    async def ApplyMig(
        self, request: mig_pb2.ApplyMigRequest, context: grpc.aio.ServicerContext
    ) -> mig_pb2.ApplyMigResponse:
        spec, name = _spec(request.config_yaml, request.config_name)
        self._require_gpu("mig apply")
        self._service.refuse_by_mode("mig apply")  # before any operation exists (docs/dra.md)
        await self._refuse_while_running(request.request_id)
        # A change another coordinator's live claim covers is refused (the node is the arbiter).
        caller = actor_of(context, Role.MIG)
        admitted = self._claims.admit(
            request.claim_holder, await self._running(), claimant_of(context)
        )
        # Plan first: an infeasible layout or busy GPUs are refused by the call, before any
        # operation exists (the apply checks again under the lock).
        plan = await asyncio.to_thread(
            self._service.plan, spec, name, force=request.force, mode_only=request.mode_only
        )
        refuse_unless_feasible(plan)
        work = _Reconfigure(
            lambda progress, operation: self._service.apply(
                spec,
                name,
                force=request.force,
                mode_only=request.mode_only,
                skip_reset=request.skip_reset,
                progress=progress,
                operation=operation,
            ),
            plan.config,
            len(plan.changes),
            sum(len(p.steps) for p in plan.changes),
            suspend=True,
            settle=self._settle,
        )
        # The plan took time: the claim may have lapsed or been taken again (by another caller,
        # under the same holder), so the operation starts only while the very claim admitted
        # holds, and binds that one.
        self._claims.hold(admitted, await self._running())
        try:
            op = await self._start(request.request_id, request, work, caller)
        except BaseException:
            self._claims.unhold()
            raise
        self._claims.bind(admitted, op.name)
        return mig_pb2.ApplyMigResponse(operation=op)

    async def ClaimMig(
        self, request: mig_pb2.ClaimMigRequest, context: grpc.aio.ServicerContext
    ) -> mig_pb2.ClaimMigResponse:
        claim = self._claims.take(
            request.holder,
            request.rollout,
            request.max_unavailable,
            request.ttl_seconds,
            await self._running(),
            claimant_of(context),
        )
        return mig_pb2.ClaimMigResponse(claim=self._claim_pb(claim))

    async def GetMigClaim(
        self, request: mig_pb2.GetMigClaimRequest, context: grpc.aio.ServicerContext
    ) -> mig_pb2.GetMigClaimResponse:
        claim = self._claims.current(await self._running())
        if claim is None:
            return mig_pb2.GetMigClaimResponse()
        return mig_pb2.GetMigClaimResponse(claim=self._claim_pb(claim))

    async def ReleaseMigClaim(
        self, request: mig_pb2.ReleaseMigClaimRequest, context: grpc.aio.ServicerContext
    ) -> mig_pb2.ReleaseMigClaimResponse:
        caller = claimant_of(context)
        return mig_pb2.ReleaseMigClaimResponse(
            released=self._claims.release(request.holder, caller)
        )

    async def _running(self) -> set[str]:
        return {operation_name(op.id) for op in await self._runner.list(MIG_APPLY, False, 10)}

    def _claim_pb(self, claim: Claim) -> mig_pb2.MigClaim:
        left = 0.0 if claim.operation else max(0.0, claim.expires_at - self._claims.now())
        return mig_pb2.MigClaim(
            holder=claim.holder,
            rollout=claim.rollout,
            max_unavailable=claim.max_unavailable,
            expires_in_seconds=left,
            operation=claim.operation,
        )

    async def AssertMig(
        self, request: mig_pb2.AssertMigRequest, context: grpc.aio.ServicerContext
    ) -> mig_pb2.AssertMigResponse:
        spec, name = _spec(request.config_yaml, request.config_name)
        self._require_gpu("mig assert")
        result = await asyncio.to_thread(
            self._service.check, spec, name, mode_only=request.mode_only
        )
        return assert_pb(result)

    async def ExportMig(
        self, request: mig_pb2.ExportMigRequest, context: grpc.aio.ServicerContext
    ) -> mig_pb2.ExportMigResponse:
        label = request.config_name or "current"
        if bad := name_problem(label, "config_name"):
            raise InvalidSpec("config_name is too long or not printable", [bad])
        self._require_gpu("mig export")
        document = await asyncio.to_thread(self._service.export, label)
        return mig_pb2.ExportMigResponse(config_yaml=yaml.safe_dump(document, sort_keys=False))

    async def AdviseMig(
        self, request: mig_pb2.AdviseMigRequest, context: grpc.aio.ServicerContext
    ) -> mig_pb2.AdviseMigResponse:
        index = request.gpu_index if request.HasField("gpu_index") else None
        self._require_gpu("mig advise")
        gone = await asyncio.to_thread(self._service.unanswered)  # NVML reads, off the loop
        if index is not None and index in gone.unread:
            raise NvmlError(f"{gone_said(index, gone.unread)}: what fits on it is unknown")
        if index is not None and index in {g.index for g in gone.gpus}:
            raise DeviceLost(f"GPU {index} is lost: what fits on it cannot be read")
        layouts = await asyncio.to_thread(self._service.layouts)
        hidden = not sees_processes(granted())
        if hidden:  # whether an instance is in use is process information too
            layouts = tuple(GpuLayout(g.gpu, g.profiles, g.instances, ()) for g in layouts)
        response = await asyncio.to_thread(
            advise_layouts, layouts, index, request.profile, gone.gpus, gone.unread
        )
        response.processes_hidden = hidden
        return response

    async def RestoreMig(
        self, request: mig_pb2.RestoreMigRequest, context: grpc.aio.ServicerContext
    ) -> mig_pb2.RestoreMigResponse:
        if not request.checkpoint:
            raise InvalidSpec(
                "checkpoint is required",
                [FieldViolation("checkpoint", "required: a mig-parted checkpoint file")],
            )
        states = parse_checkpoint(request.checkpoint, "checkpoint", field="checkpoint")
        self._require_gpu("mig restore")
        self._service.refuse_by_mode("mig restore")
        await self._refuse_while_running(request.request_id)
        # A checkpoint naming a GPU or profile this node lacks is refused here, before any
        # operation exists; the restore checks again under the lock.
        changing = [
            target
            for _, target, same in await asyncio.to_thread(
                self._service.checkpoint_targets, states, request.mode_only
            )
            if not same
        ]
        work = _Reconfigure(
            lambda progress, _operation: self._service.restore_checkpoint(
                states, mode_only=request.mode_only, progress=progress
            ),
            _CHECKPOINT,
            len(changing),
            0,  # counted as they come: a restore's steps are planned under the lock
            suspend=False,
            settle=self._settle,
        )
        return mig_pb2.RestoreMigResponse(
            operation=await self._start(
                request.request_id, request, work, actor_of(context, Role.MIG)
            )
        )

    async def ResetGpu(
        self, request: mig_pb2.ResetGpuRequest, context: grpc.aio.ServicerContext
    ) -> mig_pb2.ResetGpuResponse:
        self._require_gpu("gpu reset")
        if request.validate_only:
            gpu = await asyncio.to_thread(
                self._service.reset_gpu, request.gpu_index, validate_only=True
            )
            return mig_pb2.ResetGpuResponse(gpu_uuid=gpu.uuid, reset=False)
        # Not while a reconfiguration runs: it holds the GPUs (the lock would refuse too).
        await self._refuse_while_running("")

        async def call() -> mig_pb2.ResetGpuResponse:
            gpu = await asyncio.to_thread(self._service.reset_gpu, request.gpu_index)
            self._changed()  # the inventory shows the GPU after its reset
            return mig_pb2.ResetGpuResponse(gpu_uuid=gpu.uuid, reset=True)

        return await self._runner.once(
            "/gpuagent.v1.MigService/ResetGpu",
            request,
            request.request_id,
            mig_pb2.ResetGpuResponse,
            call,
        )

    async def _start(
        self, request_id: str, request: Message, work: _Reconfigure, owner: Actor
    ) -> operations_pb2.Operation:
        """The ``mig.apply`` operation doing ``work``; the store's exclusive insert lets one
        reconfiguration exist at a time (a retry of it, same request id, gets it back)."""
        try:
            op = await self._runner.start(
                MIG_APPLY,
                request_id,
                request,
                work,
                metadata=operations_pb2.OperationMetadata(mig_apply=work.pending()),
                exclusive=True,
                owner=owner,
            )
        except AlreadyRunning as exc:
            raise _busy(exc.running.id, [exc.running.id]) from None
        self._changed()
        return operation_pb(op)

    async def _refuse_while_running(self, request_id: str) -> None:
        """One reconfiguration at a time. This look answers at once, before planning; the
        exclusive insert of the operation is the guard: two calls at the same instant both pass
        this look, and the store lets exactly one of them create an operation. A retry of the
        running one (same request id) passes both."""
        running = [
            op
            for op in await self._runner.list(MIG_APPLY, False, 10)
            if not request_id or op.request_id != request_id
        ]
        if running:
            raise _busy(running[0].id, [op.id for op in running])
