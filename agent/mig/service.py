"""MigService: show, plan, apply, assert, export, restore and recover MIG layouts on this node.

The flow lives here, not in the CLI (STYLE.md practice 1), so the gRPC API and a label watcher
call the same code. An apply takes the partition lock, finishes any interrupted apply first
(and refuses if it cannot), plans every selected GPU, refuses before touching anything if a
layout cannot fit or running processes are in the way, then changes one GPU after the other.
On any error it restores every GPU it touched to its snapshot. ``recover`` on the next start
rolls a killed apply back and finishes one suspended by SIGTERM (docs/mig.md).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from agent.dra.gate import mig_change_refusal
from agent.dra.mode import Allocation, AllocationMode
from agent.dra.republish import Expected
from agent.errors import AgentError, Busy, Conflict, ModeRefused
from agent.gpu.nvml import GpuDriver
from agent.gpu.types import GpuInfo, GpuLayout
from agent.mig.apply import Executor, Progress, ProgressEvent, Suspended, restore
from agent.mig.journal import (
    SCOPE,
    ApplyRecord,
    Journal,
    begin_entry,
    gpu_entry,
    records,
    remember_reboot,
)
from agent.mig.lock import PartitionLock
from agent.mig.node_plan import (
    AssertResult,
    NodePlan,
    check_layouts,
    checkpoint_targets,
    export_layouts,
    plan_layouts,
    refuse_unless_feasible,
)
from agent.mig.outcomes import ApplyResult, GpuOutcome, RecoveryOutcome, unrecovered
from agent.mig.plan import (
    CreateGi,
    DestroyGi,
    GpuPlan,
    ResetGpu,
    converge_steps,
    plan_gpu,
)
from agent.mig.reset import ResetFn
from agent.mig.spec import MigSpec
from agent.mig.state import GpuMigState, fetch
from agent.mig.unanswered import Unanswered, answering, read_node, selected_outcomes

log = logging.getLogger(__name__)


class RollbackFailed(Conflict):
    """An apply failed and restoring its snapshots failed too; the journal is kept. Its message
    is the apply's error, then `ROLLBACK_FAILED` and what failed."""


ROLLBACK_FAILED = "; rolling back also failed"


class Republish(Protocol):
    """How a new layout reaches a DRA driver's ResourceSlices (agent.dra.republish)."""

    def republish(self, expected: Expected, progress: Callable[[str], None]) -> None: ...

    def restart(self) -> tuple[str, ...]: ...

    def check(self) -> None: ...


#: Without a Kubernetes API (a laptop, the simulated quick start): MIG works as it always did.
_NO_MODE = Allocation(AllocationMode.NONE, "no allocation mode source")


class MigService:
    def __init__(
        self,
        driver: GpuDriver,
        journal: Journal,
        lock: PartitionLock,
        reset: ResetFn,
        *,
        allocation: Callable[[], Allocation] = lambda: _NO_MODE,
        republish: Republish | None = None,
        tell_plugin: Callable[[], str] | None = None,
        recovered: Callable[[tuple[RecoveryOutcome, ...]], object] = lambda _outcomes: None,
    ) -> None:
        """``allocation``: the node's allocation mode, asked before every change (docs/dra.md);
        ``republish``: on a ``dra`` node, makes the DRA driver publish a new layout;
        ``tell_plugin``: on a ``device-plugin`` node, makes the device plugin enumerate its
        devices again (agent.sharing: SIGHUP or a pod restart), saying what it did;
        ``recovered``: told what a recovery did once it left no GPU failed (the journal done
        with), so that what said the rollback failed can say it was finished."""
        self._driver = driver
        self._journal = journal
        self._lock = lock
        self._reset = reset
        self._allocation = allocation
        self._republish = republish
        self._tell_plugin = tell_plugin
        self._recovered = recovered
        self._stuck = ""  # per GPU, why the last rollback or recovery failed (`unrolled`)

    def refuse_by_mode(self, what: str) -> Allocation:
        """ModeRefused when this node's allocation mode forbids a MIG change; else the mode."""
        allocation = self._allocation()
        why = self._refusal(allocation)
        if why is not None:
            raise ModeRefused(f"{what} refused: {why}")
        return allocation

    def mig_refusal(self) -> str | None:
        """Why any MIG change is refused here now (GetNode's ``Allocation.mig_refusal``, so a
        client's no-op apply or restore is refused as the agent would refuse a real one)."""
        return self._refusal(self._allocation())

    def _refusal(self, allocation: Allocation) -> str | None:
        why = mig_change_refusal(allocation)
        if why is None and allocation.mode is AllocationMode.DRA and self._republish is None:
            why = (
                f"this node's allocation mode is {allocation.describe()}, and without a "
                "Kubernetes API the agent cannot make the DRA driver republish a new layout; "
                "nothing was changed"
            )
        return why

    # -- reads (never take the lock) -------------------------------------------------------------

    def layouts(self) -> tuple[GpuLayout, ...]:
        """The GPUs that can be read (`read_node`: one that cannot leaves out no other)."""
        return read_node(self._driver)[0]

    def plan(
        self,
        spec: MigSpec,
        config: str | None = None,
        *,
        force: bool = False,
        mode_only: bool = False,
    ) -> NodePlan:
        layouts, gone = read_node(self._driver)
        lost, unread = gone.gpus, gone.unread
        return plan_layouts(
            spec, config, layouts, force=force, mode_only=mode_only, lost=lost, unread=unread
        )

    def check(
        self, spec: MigSpec, config: str | None = None, *, mode_only: bool = False
    ) -> AssertResult:
        """mig-parted's ``assert``: every GPU selected and matching (counts; placement ignored);
        a lost or unread GPU the config selects is never "applied"."""
        layouts, gone = read_node(self._driver)
        return check_layouts(
            spec, config, layouts, mode_only=mode_only, lost=gone.gpus, unread=gone.unread
        )

    def export(self, label: str = "current") -> dict[str, Any]:
        """The current state as a mig-parted v1 config named ``label`` (mig-parted ``export``);
        DeviceLost while a GPU is lost (NvmlError naming the call while one is unread)."""
        layouts, gone = read_node(self._driver)
        return export_layouts(layouts, label, gone.gpus, gone.unread)

    # -- changes (under the partition lock) ------------------------------------------------------

    def reset_gpu(self, index: int, *, validate_only: bool = False) -> GpuInfo:
        """Reset one GPU through the node's reset (the one pending MIG modes take), under the
        partition lock; Busy naming the processes while any run on it (the reset would fail
        or kill them), NotFound/DeviceLost for a GPU that is not there to reset.
        ``validate_only`` checks and changes nothing."""
        gpu = self._driver.gpu(index)
        if validate_only:
            return gpu
        with self._lock.hold(f"gpu reset {index}", self._driver.changes):
            running = self._driver.layout(gpu.uuid).processes
            if running:
                pids = ", ".join(str(p.pid) for p in running)
                raise Busy(
                    f"GPU {index} runs processes {pids}: stop them (evict their pods) before a "
                    "reset",
                    [f"pid {p.pid}" for p in running],
                )
            with self._driver.changes.changing(gpu.uuid):
                self._reset(gpu)
        return gpu

    def apply(
        self,
        spec: MigSpec,
        config: str | None = None,
        *,
        force: bool = False,
        skip_reset: bool = False,
        progress: Progress | None = None,
        operation: str | None = None,
        mode_only: bool = False,
    ) -> ApplyResult:
        """Reach the selected config; Conflict/Busy/InvalidSpec before any change if it can't.

        ``mode_only`` (mig-parted's ``apply --mode-only``) changes only the MIG mode of the GPUs
        whose mode differs, and creates no instances. Raises :class:`Suspended` (journal kept,
        no rollback) when ``progress`` raises it.
        """
        name, _ = spec.select(config)
        description = operation or f"mig apply {name}"
        allocation = self.refuse_by_mode("mig apply")
        with self._lock.hold(description, self._driver.changes):
            recovered = self._refuse_over_unrecovered(f"MIG config {name}")
            layouts, gone = read_node(self._driver)
            plan = plan_layouts(spec, config, layouts, force=force, mode_only=mode_only)
            refuse_unless_feasible(plan)
            executor = Executor(self._driver, self._journal, self._reset, progress)
            outcomes = {p.layout.gpu.uuid: _unchanged(p) for p in plan.gpus}
            if plan.changes:
                self._can_republish(allocation)
                desired = {p.layout.gpu.uuid: p.desired for p in plan.changes}
                self._journal.journal_append(
                    SCOPE, begin_entry(description, desired, force=force, skip_reset=skip_reset)
                )
                touched: list[tuple[GpuInfo, GpuMigState]] = []
                outcomes.update(
                    self._execute(
                        executor, plan.changes, touched, {}, force=force, skip_reset=skip_reset
                    )
                )
                self._publish(allocation, executor, touched, skip_reset, progress)
                self._journal.journal_clear(SCOPE)
        said = self._plugin_told(allocation) if plan.changes else ""
        gpus = (*outcomes.values(), *selected_outcomes(spec.select(config)[1], gone))
        # Selected no GPU: done, as mig-parted's; its assert fails all the same, and says why.
        unheld = () if gpus else self.check(spec, config, mode_only=mode_only).mismatches
        remember_reboot(self._journal, gpus)
        return ApplyResult(name, gpus, executor.mutations, recovered, said, unheld)

    def restore_checkpoint(
        self,
        states: Sequence[GpuMigState],
        *,
        mode_only: bool = False,
        progress: Progress | None = None,
    ) -> ApplyResult:
        """mig-parted's ``restore``: each listed GPU (by UUID) back to its exact checkpointed
        state, placements included, journalled and rolled back on failure like an apply.
        GPUs the checkpoint does not list are left alone."""
        allocation = self.refuse_by_mode("mig restore")
        with self._lock.hold("mig restore", self._driver.changes):
            self._refuse_over_unrecovered("the checkpoint")
            targets = self.checkpoint_targets(states, mode_only)
            executor = Executor(self._driver, self._journal, self._reset, progress)
            outcomes = []
            changing = [(gpu, t) for gpu, t, same in targets if not same]
            if changing:
                self._can_republish(allocation)
                self._journal.journal_append(
                    SCOPE,
                    {
                        "event": "begin",
                        "operation": "mig restore",
                        "gpus": [g.uuid for g, _ in changing],
                    },
                )
            touched: list[tuple[GpuInfo, GpuMigState]] = []
            for gpu, target, same in targets:
                if same:
                    outcomes.append(
                        GpuOutcome(gpu.index, gpu.uuid, "unchanged", kept=len(target.instances))
                    )
                    continue
                before = fetch(self._driver.layout(gpu.uuid))
                self._journal.journal_append(SCOPE, gpu_entry(gpu, before))
                touched.append((gpu, before))
                try:
                    outcomes.append(self._restore_gpu(executor, gpu, target))
                except Exception as exc:
                    self._roll_back(executor, touched, exc, False)
                    raise
                executor.done(gpu)
                self._journal.journal_append(SCOPE, {"event": "done", "uuid": gpu.uuid})
            if changing:
                self._publish(allocation, executor, touched, False, progress)
                self._journal.journal_clear(SCOPE)
        said = self._plugin_told(allocation) if changing else ""
        remember_reboot(self._journal, outcomes)
        return ApplyResult("checkpoint", tuple(outcomes), executor.mutations, (), said)

    def _refuse_over_unrecovered(self, what: str) -> tuple[RecoveryOutcome, ...]:
        """Recover first; refuse to start over an apply that could not be undone: its
        snapshots are the layouts to return to, a new apply's would be of half-done GPUs."""
        recovered = self._recover_locked()
        if self._stuck:
            raise unrecovered(what, self._stuck)
        return recovered

    def unrolled(self) -> str:
        """Per GPU, why an earlier apply's journal could not be rolled back ("" when no journal
        is kept for that): every apply is refused until a rollback succeeds (the next apply or
        agent start retries it), and so is its plan (`refuse_over_unrolled`)."""
        return self._stuck if self._stuck and self.interrupted() else ""

    def refuse_over_unrolled(self, what: str) -> None:
        """The refusal an apply of ``what`` would meet now (`unrecovered`), for its dry run."""
        if self.unrolled():
            raise unrecovered(what, self._stuck)

    def checkpoint_targets(
        self, states: Sequence[GpuMigState], mode_only: bool
    ) -> list[tuple[GpuInfo, GpuMigState, bool]]:
        layouts, gone = read_node(self._driver)
        return checkpoint_targets(states, layouts, mode_only, gone.gpus, gone.unread)

    def lost(self) -> list[GpuInfo]:
        """What is known of each GPU that does not answer, lost or unread (only its index when
        it never answered since we started)."""
        return list(self.unanswered().gpus)

    def unanswered(self) -> Unanswered:
        """The lost and unread GPUs, with the failing call of each unread one."""
        return read_node(self._driver)[1]

    def _restore_gpu(self, executor: Executor, gpu: GpuInfo, target: GpuMigState) -> GpuOutcome:
        steps = converge_steps(self._driver.layout(gpu.uuid), target)
        pending = executor.run(gpu, steps, phase="apply", skip_reset=False)
        if pending:
            return GpuOutcome(
                gpu.index,
                gpu.uuid,
                "pending",
                message=pending,
                reboot=gpu.uuid in executor.reboot_required,
            )
        if not target.satisfied_by(fetch(self._driver.layout(gpu.uuid))):
            raise Conflict(f"GPU {gpu.index}: the layout after the restore is not the checkpoint's")
        created = sum(isinstance(s, CreateGi) for s in steps)
        destroyed = sum(isinstance(s, DestroyGi) for s in steps)
        return GpuOutcome(
            gpu.index,
            gpu.uuid,
            "applied",
            kept=len(target.instances) - created,
            destroyed=destroyed,
            created=created,
        )

    def _execute(
        self,
        executor: Executor,
        plans: Sequence[GpuPlan],
        touched: list[tuple[GpuInfo, GpuMigState]],
        befores: Mapping[str, GpuMigState],
        *,
        force: bool,
        skip_reset: bool,
    ) -> dict[str, GpuOutcome]:
        """Change one GPU after the other; on an error restore ``touched`` and each GPU begun.

        ``befores`` are snapshots already journalled (a resumed apply's): those GPUs return to
        them, not to what they hold now.
        """
        outcomes: dict[str, GpuOutcome] = {}
        for gpu_plan in plans:
            gpu = gpu_plan.layout.gpu
            before = befores.get(gpu.uuid)
            if before is None:
                before = fetch(gpu_plan.layout)
                self._journal.journal_append(SCOPE, gpu_entry(gpu, before))
            touched.append((gpu, before))
            try:
                outcomes[gpu.uuid] = self._apply_gpu(executor, gpu_plan, force, skip_reset)
            except Suspended as exc:  # the caller reports it; the next start finishes it
                self._journal.journal_append(SCOPE, {"event": "suspend", "reason": str(exc)})
                raise
            except Exception as exc:
                self._roll_back(executor, touched, exc, skip_reset)
                raise
            executor.done(gpu)
            self._journal.journal_append(SCOPE, {"event": "done", "uuid": gpu.uuid})
        return outcomes

    def _apply_gpu(
        self, executor: Executor, gpu_plan: GpuPlan, force: bool, skip_reset: bool
    ) -> GpuOutcome:
        gpu = gpu_plan.layout.gpu
        steps, target = gpu_plan.steps, gpu_plan.target
        if gpu_plan.mode_change is not None and gpu_plan.mode_change.activation:
            # mig-parted's order: mode first; the layout is planned again on the switched GPU,
            # whose driver may only now report profiles.
            cut = next(i for i, s in enumerate(steps) if isinstance(s, ResetGpu)) + 1
            pending = executor.run(gpu, steps[:cut], phase="apply", skip_reset=skip_reset)
            if pending:
                return GpuOutcome(
                    gpu.index,
                    gpu.uuid,
                    "pending",
                    destroyed=len(gpu_plan.destroy),
                    message=pending,
                    reboot=gpu.uuid in executor.reboot_required,
                )
            again = plan_gpu(self._driver.layout(gpu.uuid), gpu_plan.desired, force=force)
            if again.target is None or again.status in ("infeasible", "blocked"):
                raise Conflict(f"GPU {gpu.index}: after the MIG mode change: {again.problem}")
            steps, target = again.steps, again.target
        executor.run(gpu, steps, phase="apply", skip_reset=skip_reset)
        assert target is not None  # a plan with steps and no target is deferred or refused
        if not target.satisfied_by(fetch(self._driver.layout(gpu.uuid))):
            raise Conflict(f"GPU {gpu.index}: the layout after the apply is not the planned one")
        return GpuOutcome(
            gpu.index,
            gpu.uuid,
            "applied",
            kept=len(gpu_plan.keep),
            destroyed=len(gpu_plan.destroy),
            created=len(target.instances) - len(gpu_plan.keep),
        )

    def _publish(
        self,
        allocation: Allocation,
        executor: Executor,
        touched: list[tuple[GpuInfo, GpuMigState]],
        skip_reset: bool,
        progress: Progress | None,
    ) -> None:
        """On a ``dra`` node: the DRA driver republishes the new layout (its ResourceSlices list
        exactly the devices NVML now has), or the layout is rolled back as a failed apply is,
        and the driver is restarted once more so it publishes the layout it is back to. The
        wait's progress events (phase ``republish``) may raise like any other: a cancellation
        rolls back, the agent stopping leaves the applied layout to the next start."""
        if allocation.mode is not AllocationMode.DRA or self._republish is None:
            return

        def say(message: str) -> None:
            if progress is not None:
                progress(ProgressEvent("republish", 0, executor.mutations, "republish", message))

        try:
            layouts, gone = read_node(self._driver)  # only the GPUs read are compared
            self._republish.republish(Expected.of(layouts, gone.gpus), say)
        except Suspended:
            # The agent is stopping: every GPU is done (the journal says so, and the next start
            # reports the apply completed); the restarted plugin publishes the new layout.
            raise
        except AgentError as exc:
            self._roll_back(executor, touched, exc, skip_reset)
            try:
                self._republish.restart()
            except AgentError as again:
                log.error("after the rollback, the DRA driver was not restarted: %s", again)
            else:
                exc.args = (f"{exc}; the DRA kubelet plugin was restarted to publish it",)
            raise

    def _can_republish(self, allocation: Allocation) -> None:
        """On a ``dra`` node, before any change: the driver can be made to republish (or the
        change would be applied and rolled back); Conflict, nothing changed, when not."""
        if allocation.mode is AllocationMode.DRA and self._republish is not None:
            self._republish.check()

    def _plugin_told(self, allocation: Allocation) -> str:
        """On a ``device-plugin`` node, after the lock is released: the plugin enumerates MIG
        devices only when its plugins (re)start (k8s-device-plugin #992), and would go on
        advertising the destroyed ones; a SIGHUP restarts them (cmd/nvidia-device-plugin
        main.go). The layout stays applied whatever the plugin does: a failure is said, not
        raised."""
        if allocation.mode is not AllocationMode.DEVICE_PLUGIN or self._tell_plugin is None:
            return ""
        try:
            said = self._tell_plugin()
        except AgentError as exc:
            said = f"not reloaded: {exc}"
        log.info("device plugin after the MIG change: %s", said)
        return said

    def _roll_back(
        self,
        executor: Executor,
        touched: list[tuple[GpuInfo, GpuMigState]],
        error: Exception,
        skip_reset: bool,
    ) -> None:
        """Restore every touched GPU, newest first; amend ``error`` or raise why we could not."""
        # Marked first: a crash during the rollback must go on rolling back, never count the
        # GPUs already done as finished. A full state dir does not stop it (Executor.note)
        # unless every GPU is journalled done: a crash midway would then be called complete.
        history = records(e for _, e in self._journal.journal_entries(SCOPE))
        executor.unjournalled_ok = not (history and history[-1].finished)
        executor.note({"event": "rollback", "reason": str(error)})
        failures = []
        for gpu, before in reversed(touched):
            try:
                restore(executor, self._driver, gpu, before, skip_reset=skip_reset)
            except Exception as exc:  # keep going: the other GPUs still deserve their rollback
                failures.append(f"GPU {gpu.index}: {exc}")
        if failures:
            self._stuck = "; ".join(failures)
            log.error("MIG rollback failed: %s", self._stuck)
            raise RollbackFailed(
                f"{error}{ROLLBACK_FAILED} ({'; '.join(failures)}). The journal is kept: "
                "the next apply or agent start retries the rollback"
            ) from error
        executor.forget()
        gpus = ", ".join(str(gpu.index) for gpu, _ in touched)
        # Logged before the error is amended, so the line does not say "rolled back" twice.
        log.warning("MIG apply failed (%s); rolled back GPU %s", str(error), gpus)
        if isinstance(error, AgentError) and error.args:
            error.args = (
                f"{error.args[0]}; rolled back GPU {gpus} to the layout before the apply",
            )

    def interrupted(self) -> bool:
        """Whether the journal holds an apply that `recover` has yet to finish or undo."""
        return bool(self._journal.journal_entries(SCOPE))

    def recover(self, progress: Progress | None = None) -> tuple[RecoveryOutcome, ...]:
        """On agent start: finish or undo what an interrupted apply left; logs each outcome;
        ``progress`` hears each step before it is made (the start says it on /readyz).

        A journal whose owner still runs (it holds the lock) is not ours to touch: nothing is done.
        """
        if not self._journal.journal_entries(SCOPE):
            return ()
        try:
            self.refuse_by_mode("MIG recovery")
        except ModeRefused as exc:
            return self._left_alone(str(exc))
        try:
            with self._lock.hold("mig recover", self._driver.changes):
                return self._recover_locked(progress)
        except Busy:
            log.info(
                "MIG journal belongs to a running apply (%s); not recovering", self._lock.holder()
            )
            return ()

    def _left_alone(self, why: str) -> tuple[RecoveryOutcome, ...]:
        """A journal this node's mode forbids acting on: kept, every GPU in it untouched."""
        history = records(entry for _, entry in self._journal.journal_entries(SCOPE))
        indices = {u: i for record in history for u, i in record.indices.items()}
        log.warning("MIG journal left as it is (%d GPU(s)): %s", len(indices), why)
        return tuple(
            RecoveryOutcome(self._index(u, indices), u, "untouched", f"not recovered: {why}")
            for u in indices
        )

    def _recover_locked(self, progress: Progress | None = None) -> tuple[RecoveryOutcome, ...]:
        history = records(entry for _, entry in self._journal.journal_entries(SCOPE))
        self._stuck = ""
        if not history:
            return ()
        outcomes: list[RecoveryOutcome] = []
        settled: set[str] = set()  # GPUs a newer apply left at its target
        # The undo goes on when a full state dir refuses its records: the snapshots it returns
        # to are journalled already (Executor.note), as an apply's own rollback does.
        undo = Executor(self._driver, self._journal, self._reset, progress)
        undo.unjournalled_ok = True
        for age, record in enumerate(reversed(history)):
            planned = record.planned if age == 0 and record.resumable else ()
            if any(self._answering(u) is None for u in planned):
                undo.note({"event": "rollback", "reason": "GPU not answering"})  # undone, not done
            elif age == 0 and record.resumable:
                # Stopped by SIGTERM on purpose: finish it (docs/mig.md explains the choice).
                done = self._resume(record, progress)
                outcomes += done
                if any(o.action == "failed" for o in done):
                    break
                settled |= {o.uuid for o in done if o.action == "completed"}
                continue
            if record.finished:
                # Killed after its last change, before clearing the journal: it completed.
                for uuid in record.befores:
                    if uuid not in settled:
                        outcomes.append(self._outcome(uuid, record))
                settled |= set(record.befores)
                continue
            # Undo newest first; an older apply then undoes its own changes to the same GPU
            # (its snapshot is older), so each GPU ends at the layout before the first of them.
            for uuid, before in reversed(record.befores.items()):
                if uuid not in settled:
                    outcomes.append(self._restore_one(undo, uuid, before, record))
        failed = [f"GPU {o.gpu}: {o.detail}" for o in outcomes if o.action == "failed"]
        self._stuck = "; ".join(failed)
        for outcome in outcomes:
            level = logging.ERROR if outcome.action == "failed" else logging.WARNING
            o = outcome
            log.log(level, "MIG recovery of GPU %s: %s (%s)", o.gpu, o.action, o.detail)
        if all(o.action != "failed" for o in outcomes):
            undo.forget()  # a clear the full dir refuses: the next start finds them untouched
            try:
                self._recovered(tuple(outcomes))
            except Exception:  # told after the fact: never a failed recovery, nor apply
                log.exception("MIG recovered, but saying so on its operations failed")
        return tuple(outcomes)

    def _resume(self, record: ApplyRecord, progress: Progress | None) -> list[RecoveryOutcome]:
        """Finish a suspended apply: plan each unfinished GPU again from what it holds now.

        If it cannot be finished it is rolled back to its snapshots, as a failed apply is.
        """
        executor = Executor(self._driver, self._journal, self._reset, progress)
        at = functools.partial(self._index, journalled=record.indices)  # one unread meanwhile
        left = [u for u in record.planned if u not in record.done]
        begun = {u: b for u, b in record.befores.items() if u in left}
        touched = [
            (self._driver.gpu(u), record.befores[u]) for u in record.planned if u in record.done
        ]
        try:
            try:
                plans = [
                    plan_gpu(self._driver.layout(u), record.desired[u], force=record.force)
                    for u in left
                ]
            except AgentError as exc:
                problem: AgentError | None = exc
            else:
                bad = [p for p in plans if p.status in ("infeasible", "blocked")]
                problem = (
                    Conflict("; ".join(f"GPU {p.layout.gpu.index}: {p.problem}" for p in bad))
                    if bad
                    else None
                )
            if problem is not None:
                touched += [(self._driver.gpu(u), b) for u, b in begun.items()]
                self._roll_back(executor, touched, problem, record.skip_reset)
                raise problem
            results = self._execute(
                executor, plans, touched, begun, force=record.force, skip_reset=record.skip_reset
            )
        except RollbackFailed as exc:
            return [
                RecoveryOutcome(at(u), u, "failed", f"{record.operation}: {exc}")
                for u in record.befores
            ]
        except Exception as exc:  # rolled back: reported, the journal is clear
            return [
                RecoveryOutcome(
                    at(u),
                    u,
                    "rolled-back",
                    f"{record.operation} could not be finished after the restart: {exc}",
                )
                for u in record.befores
            ]
        outcomes = []
        for u in record.planned:
            detail = f"{record.operation} finished after the restart"
            result = results.get(u)
            if result is not None and result.status == "pending":
                detail += f"; {result.message}"
            outcomes.append(RecoveryOutcome(at(u), u, "completed", detail))
        return outcomes

    def _outcome(self, uuid: str, record: ApplyRecord) -> RecoveryOutcome:
        done = f"{record.operation} had finished"
        return RecoveryOutcome(self._index(uuid, record.indices), uuid, "completed", done)

    def _answering(self, uuid: str) -> GpuInfo | None:
        """The GPU now; None when it does not answer (lost or unread: `answering`)."""
        return answering(self._driver, uuid)[0]

    def _index(self, uuid: str, journalled: Mapping[str, int]) -> int:
        """The GPU's index now; for one that does not answer the journal's, or -1."""
        gpu = self._answering(uuid)
        return gpu.index if gpu is not None else journalled.get(uuid, -1)

    def _restore_one(
        self, executor: Executor, uuid: str, before: GpuMigState, record: ApplyRecord
    ) -> RecoveryOutcome:
        operation, count = record.operation, executor.mutations
        gpu, why = answering(self._driver, uuid, record.indices.get(uuid, -1))
        if gpu is None:  # lost or unread: the journal stays, for when it answers again
            why = f"the GPU does not answer{f' ({why})' if why else ''}"
            why += "; its layout is restored once it does"
            return RecoveryOutcome(record.indices.get(uuid, -1), uuid, "failed", why)
        try:
            restore(executor, self._driver, gpu, before, skip_reset=False)
        except Exception as exc:  # reported, and the journal stays for the next start
            return RecoveryOutcome(gpu.index, uuid, "failed", f"{operation} interrupted; {exc}")
        if executor.mutations == count:
            return RecoveryOutcome(gpu.index, uuid, "untouched", f"{operation} interrupted")
        return RecoveryOutcome(
            gpu.index,
            uuid,
            "rolled-back",
            f"{operation} interrupted; restored the layout before it "
            f"({executor.mutations - count} changes)",
        )


def _unchanged(plan: GpuPlan) -> GpuOutcome:
    gpu = plan.layout.gpu
    return GpuOutcome(gpu.index, gpu.uuid, "unchanged", kept=len(plan.keep))
