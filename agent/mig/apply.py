"""Executing MIG steps through the GpuDriver facade, with a journal entry before every mutation.

The journal (scope ``mig:apply`` in the SQLite store) makes an apply crash-safe: it records each
touched GPU's snapshot before the first change and each mutation before it is made, so a process
killed at any point leaves enough behind for ``MigService.recover`` to restore the snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.errors import AgentError, Conflict, NotSupported, StateUnavailable
from agent.gpu.nvml import GpuDriver
from agent.gpu.types import ActivationStatus, GpuInfo, Placement
from agent.mig.journal import SCOPE, Journal
from agent.mig.plan import (
    CreateCi,
    CreateGi,
    DestroyCi,
    DestroyGi,
    ResetGpu,
    SetMigMode,
    Step,
    converge_steps,
)
from agent.mig.reset import ResetFn
from agent.mig.state import GpuMigState, fetch

log = logging.getLogger(__name__)

__all__ = ["SCOPE", "Executor", "Journal", "Progress", "ProgressEvent", "Suspended", "restore"]


class Suspended(AgentError):
    """The process is stopping (SIGTERM): raised by a progress callback before a mutation, it
    stops the apply there without a rollback; the journal keeps it, and the next start finishes
    it (docs/mig.md, "SIGTERM during an apply")."""

    exit_code = 143  # 128 + SIGTERM, what a shell reports for a process it ended


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """Sent before each mutation (phase ``apply`` or ``rollback``) and when a GPU is done."""

    phase: str  # "apply" | "rollback" | "done"
    gpu: int
    #: number of this mutation within the whole operation, from 1; 0 for "done".
    mutation: int
    action: str  # the step's kind: "destroy-ci", "create-gi", "set-mode", "reset", ...; "" for done
    message: str


Progress = Callable[[ProgressEvent], None]


def _ignore(_: ProgressEvent) -> None:
    """No one watches this apply's progress."""


class Executor:
    """Runs steps for one operation; counts and journals every mutation before making it."""

    def __init__(
        self,
        driver: GpuDriver,
        journal: Journal,
        reset: ResetFn,
        progress: Progress | None = None,
    ) -> None:
        self._driver = driver
        self._journal = journal
        self._reset = reset
        self._progress = progress or _ignore
        self.mutations = 0
        #: GPUs whose pending mode waits for a reboot of this (passthrough) VM, by UUID.
        self.reboot_required: set[str] = set()
        #: A rollback goes on when the state dir cannot take its records (`note`).
        self.unjournalled_ok = False
        self._unjournalled = False

    def run(
        self, gpu: GpuInfo, steps: Sequence[Step], *, phase: str, skip_reset: bool
    ) -> str | None:
        """Execute ``steps`` in order; returns why the GPU's MIG mode is left pending, or None.

        A pending mode stops the steps: instances cannot be created before the mode is active.
        The GPU is marked changed by this agent throughout (``GpuDriver.changes``): between
        two steps it is half-way, and telemetry does not take it for a GPU at fault.
        """
        with self._driver.changes.changing(gpu.uuid):
            return self._run(gpu, steps, phase=phase, skip_reset=skip_reset)

    def _run(
        self, gpu: GpuInfo, steps: Sequence[Step], *, phase: str, skip_reset: bool
    ) -> str | None:
        uuid = gpu.uuid
        created: dict[Placement, int] = {}
        activation: ActivationStatus | None = None
        for step in steps:
            if isinstance(step, ResetGpu):
                if not self._mode_pending(uuid):
                    continue  # the driver reset the GPU itself
                why = _why_left_pending(gpu, activation, skip_reset)
                if why is not None:
                    if activation is ActivationStatus.RESET_REQUIRED:
                        self.reboot_required.add(uuid)
                    return why
            self._before(gpu, step, phase)
            match step:
                case DestroyCi(gi_id=gi_id, ci_id=ci_id):
                    self._driver.destroy_compute_instance(uuid, gi_id, ci_id)
                case DestroyGi(gi_id=gi_id):
                    self._driver.destroy_gpu_instance(uuid, gi_id)
                case SetMigMode(enable=enable):
                    activation = self._driver.set_mig_mode(uuid, enable)
                    if activation is ActivationStatus.NOT_SUPPORTED:
                        raise NotSupported(
                            f"GPU {gpu.index}: the driver cannot change the MIG mode here"
                        )
                case ResetGpu():
                    self._reset(gpu)
                    if self._mode_pending(uuid):
                        raise Conflict(
                            f"GPU {gpu.index}: the MIG mode is still pending after the reset"
                        )
                case CreateGi(profile_id=profile_id, placement=placement):
                    created[placement] = self._driver.create_gpu_instance(
                        uuid, profile_id, placement
                    ).id
                case CreateCi(gi_placement=at, ci=ci):
                    gi_id = created[at]
                    ci_profile = ci.profile_id
                    if ci_profile is None:
                        ci_profile = self._ci_profile(uuid, gi_id, ci.slices)
                    where = None if ci.start is None else Placement(ci.start, ci.slices)
                    self._driver.create_compute_instance(uuid, gi_id, ci_profile, where)
        return None

    def done(self, gpu: GpuInfo) -> None:
        self._progress(ProgressEvent("done", gpu.index, 0, "", f"GPU {gpu.index} done"))

    def _before(self, gpu: GpuInfo, step: Step, phase: str) -> None:
        # Journal first: a process killed during the NVML call leaves the entry behind.
        self.mutations += 1
        text = str(step)
        entry = {"uuid": gpu.uuid, "phase": phase, "n": self.mutations, "action": step.action}
        self.note({"event": "step", **entry, "step": text})
        log.debug("MIG %s step %d: GPU %d: %s", phase, self.mutations, gpu.index, text)
        self._progress(
            ProgressEvent(phase, gpu.index, self.mutations, step.action, f"GPU {gpu.index}: {text}")
        )

    def note(self, entry: dict[str, object]) -> None:
        """Journal ``entry``. While ``unjournalled_ok`` (a rollback), a state dir that cannot
        take it (full, read-only) is logged, not raised: the snapshots the rollback returns
        to are journalled already, so a crash midway is still recovered from them, whereas
        stopping would leave a GPU half-done."""
        try:
            self._journal.journal_append(SCOPE, entry)
        except StateUnavailable as exc:
            if not self.unjournalled_ok:
                raise
            if not self._unjournalled:  # one line, not one per step
                log.error("MIG rollback goes on without journal records: %s", exc)
            self._unjournalled = True

    def forget(self) -> None:
        """Clear the journal once every GPU is back; one the state dir keeps (full) reads as
        GPUs already at their snapshots, which the next recovery finds untouched."""
        try:
            self._journal.journal_clear(SCOPE)
        except StateUnavailable as exc:
            if not self.unjournalled_ok:
                raise
            log.error("the MIG journal of a rolled-back apply stays until the next start: %s", exc)

    def _mode_pending(self, uuid: str) -> bool:
        mode = self._driver.gpu(uuid).mig_mode
        return mode is not None and mode.is_pending

    def _ci_profile(self, uuid: str, gi_id: int, slices: int) -> int:
        # The driver names CI profile ids (§7.1); the plain profile has the lowest constant.
        profiles = sorted(self._driver.ci_profiles(uuid, gi_id), key=lambda p: p.constant)
        match = next((p for p in profiles if p.slice_count == slices), None)
        if match is None:
            raise NotSupported(
                f"GPU instance {gi_id} on {uuid} has no {slices}-slice compute instance profile"
            )
        return match.id


def _why_left_pending(
    gpu: GpuInfo, activation: ActivationStatus | None, skip_reset: bool
) -> str | None:
    """Why a pending mode is left pending; None when a reset should apply it now."""
    if activation is ActivationStatus.RESET_REQUIRED:
        return (
            f"GPU {gpu.index}: MIG mode change pending; the driver needs a reboot of this "
            "(passthrough) VM to apply it"
        )
    if skip_reset:
        return (
            f"GPU {gpu.index}: MIG mode change pending; reset skipped (--skip-reset). Reset "
            f"the GPU (nvidia-smi -r -i {gpu.pci_bus_id}) or apply again without --skip-reset"
        )
    return None


def restore(
    executor: Executor, driver: GpuDriver, gpu: GpuInfo, snapshot: GpuMigState, *, skip_reset: bool
) -> None:
    """Bring a GPU back to ``snapshot`` (mig-parted's Restore): converge, then verify."""
    steps = converge_steps(driver.layout(gpu.uuid), snapshot)
    pending = executor.run(gpu, steps, phase="rollback", skip_reset=skip_reset)
    if pending:
        raise Conflict(f"rollback of GPU {gpu.index} incomplete: {pending}")
    now = fetch(driver.layout(gpu.uuid))
    if not snapshot.satisfied_by(now):
        raise Conflict(f"rollback of GPU {gpu.index} did not restore its layout")
