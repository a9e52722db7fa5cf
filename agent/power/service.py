"""PowerService: show, apply, restore and keep the node's declarative power caps.

The driver forgets a power limit at every reboot and driver reload (``nvidia-smi -pl`` has to be
run again); the agent keeps the spec instead. Two journal scopes in the state store hold what
the node needs across restarts:

* ``power:baseline``: each GPU's limit from before the agent first changed it, written before
  the change, so ``restore`` returns it (one entry per GPU, the first one wins);
* ``power:desired``: the spec last applied, written once every GPU took it.

``apply`` reads every GPU's range, plans the whole spec (agent.power.plan refuses before any
GPU is touched), records the baselines, sets the limits, and on an NVML failure puts the GPUs it
changed back. ``reconcile`` sets the desired limits again where a GPU lost them (a reboot, a
driver reload, someone's ``nvidia-smi -pl``): the node runs it when the driver attaches and then
on every driver check. ``restore`` forgets the spec and puts the baselines back; a GPU lost
then keeps its baseline, which ``reconcile`` puts back once the GPU answers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from agent.errors import AgentError
from agent.gpu.attach import DriverLink
from agent.gpu.nvml import GpuDriver
from agent.gpu.types import LostGpu, UnreadGpu
from agent.power.plan import (
    Change,
    GpuPower,
    LostTarget,
    PowerResult,
    PowerView,
    lost_selected,
    plan,
    resolve,
)
from agent.power.spec import PowerSpec, parse
from agent.tasks import Need, Task

__all__ = ["BASELINE", "DESIRED", "PowerService"]

log = logging.getLogger(__name__)

BASELINE = "power:baseline"
DESIRED = "power:desired"


class Journal(Protocol):
    """The part of agent.state.StateStore the power service uses."""

    def journal_append(self, scope: str, entry: dict[str, Any]) -> int: ...
    def journal_replace(self, scope: str, entry: dict[str, Any]) -> int: ...
    def journal_entries(self, scope: str) -> list[tuple[int, dict[str, Any]]]: ...
    def journal_keep(self, scope: str, entries: Sequence[dict[str, Any]]) -> None: ...
    def journal_clear(self, scope: str) -> None: ...


class PowerService:
    def __init__(self, gpu: GpuDriver, journal: Journal) -> None:
        self._gpu = gpu
        self._journal = journal
        self._lock = threading.Lock()
        #: (uuid, error) already logged by reconcile, so a lasting refusal is one line
        self._logged: set[tuple[str, str]] = set()
        #: uuid -> why the spec's cap was refused there at the last try (gone once it holds)
        self._refused: dict[str, str] = {}

    # -- reads -----------------------------------------------------------------------------------

    def show(self) -> PowerView:
        # A read: a GPU whose limits cannot be read (no power management) hides no other.
        gpus, lost, unread = self._read(strict=False)
        spec = self._desired()
        desired: dict[str, int] = {}
        if spec is not None:
            # What still fits is shown: a GPU the spec names that is lost, unread or gone hides
            # no other.
            targets, problems = resolve(spec, gpus, lost, unread)
            desired = {t.gpu.uuid: t.want_mw for t in targets}
            for p in problems:  # the node changed under the spec: shown, not fatal
                log.warning("the stored power spec does not fit: %s: %s", p.field, p.description)
        return PowerView(tuple(gpus), desired, self._baseline(), spec.text if spec else "")

    def out_of_force(self) -> list[str]:
        """Each GPU whose limit is not the stored spec's: what it asks, what the GPU holds and,
        where the agent's last try was refused, why. Empty when the spec holds or there is
        none (`doctor` says it: the refusal is otherwise one log line)."""
        with self._lock:
            spec = self._desired()
            if spec is None:
                return []
            targets, _ = resolve(spec, *self._read(strict=False))
            refused = dict(self._refused)
        return [
            f"GPU {t.gpu.index}: {t.want_mw / 1000:g} W asked, "
            f"{t.gpu.limits.current_mw / 1000:g} W held"
            + (f" ({refused[t.gpu.uuid]})" if t.gpu.uuid in refused else "")
            for t in targets
            if t.changes
        ]

    # -- changes ---------------------------------------------------------------------------------

    def apply(self, text: str) -> PowerResult:
        """Make ``text`` the power spec; refused with nothing changed when it does not fit.
        Its answer names the lost GPUs the spec selects (capped once they answer)."""
        spec = parse(text)
        with self._lock:
            gpus, lost, unread = self._read()
            targets = plan(spec, gpus, lost, unread)
            known = self._baseline()
            self._record_baselines([t.gpu for t in targets], known)
            wanted = [(t.gpu, t.want_mw) for t in targets if t.changes]
            # A GPU an earlier spec capped and this one leaves out goes back to its baseline.
            selected = {t.gpu.uuid for t in targets}
            wanted += [
                (g, known[g.uuid])
                for g in gpus
                if g.uuid in known
                and g.uuid not in selected
                and g.limits.current_mw != known[g.uuid]
            ]
            try:
                changes = sorted(self._set_all(wanted), key=lambda c: c.index)
            except AgentError:
                self._forget_undone_baselines(known)
                raise
            self._journal.journal_replace(DESIRED, {"spec": spec.text})
            self._logged.clear()
            self._refused.clear()
        for c in changes:
            log.info(
                "power cap on GPU %d: %g W -> %g W", c.index, c.before_mw / 1000, c.after_mw / 1000
            )
        return PowerResult(changes, lost_selected(spec, lost), lost_selected(spec, unread))

    def restore(self) -> PowerResult:
        """Forget the spec and put each GPU's limit from before the agent's first change back.
        A GPU that does not answer keeps its baseline, put back by `reconcile` once it does:
        the answer names it."""
        with self._lock:
            baseline = self._baseline()
            # Read first: a GPU whose limits cannot be read refuses it with nothing changed.
            answering, lost, unread = self._read()  # a GPU not read keeps its baseline too
            gpus = [g for g in answering if g.uuid in baseline]
            self._journal.journal_clear(DESIRED)  # reconcile no longer re-caps
            wanted = [
                (g, baseline[g.uuid]) for g in gpus if g.limits.current_mw != baseline[g.uuid]
            ]
            changes = self._set_all(wanted)
            self._keep_baselines(baseline, done={g.uuid for g in gpus})
        return PowerResult(
            changes,
            _restore_pending(baseline, answering, lost),
            _restore_pending(baseline, answering, unread),
        )

    def follow(self, link: DriverLink) -> None:
        """A reloaded driver forgot the power caps (docs/power.md): put them back at attach."""
        link.register(attach=lambda _: self.reconcile())

    def tasks(self, check_s: float) -> list[Task]:
        """Caps put back while attached (the start's attach already did)."""
        return [Task("power", self.reconcile, check_s, needs=Need.DRIVER, wait_first=True)]

    def reconcile(self) -> list[Change]:
        """Set the desired limits again where a GPU lost them; a GPU that refuses is logged
        once and tried again next time, the others are set."""
        with self._lock:
            try:
                spec = self._desired()
                if spec is None:
                    return self._restore_pending()
                targets, problems = resolve(spec, *self._read(strict=False))
            except AgentError as exc:
                self._log_once("", f"the stored power spec cannot be re-applied: {exc}")
                return []
            for p in problems:
                self._log_once("", f"power spec not re-applied there: {p}")
            targets = [t for t in targets if t.changes]
            known = self._baseline() if targets else {}  # the GPUs capped before: re-applied
            if targets:  # a GPU lost or unread at the apply is capped first here: its baseline
                self._record_baselines([t.gpu for t in targets], known)
            changes = []
            for t in targets:
                try:
                    changes.append(self._set(t.gpu, t.want_mw))
                    self._refused.pop(t.gpu.uuid, None)
                except AgentError as exc:
                    self._refused[t.gpu.uuid] = str(exc)
                    self._log_once(
                        t.gpu.uuid, f"power cap on GPU {t.gpu.index} not re-applied: {exc}"
                    )
            if len(changes) < len(targets):  # a first cap that failed leaves no baseline: not
                self._forget_undone_baselines(known)  # "capped before" when it succeeds
        for c in changes:
            watts = (c.index, c.before_mw / 1000, c.after_mw / 1000)
            if c.uuid not in known:  # not answering (lost, unread) at the apply: never capped
                log.warning("power cap applied on GPU %d, read again: %g W -> %g W", *watts)
                continue
            log.warning(
                "power cap re-applied on GPU %d: %g W -> %g W (the driver had lost it: a reboot, a "
                "driver reload, or another tool changed it)",
                *watts,
            )
        return changes

    # -- helpers ---------------------------------------------------------------------------------

    def _read(
        self, *, strict: bool = True
    ) -> tuple[list[GpuPower], tuple[LostGpu, ...], tuple[UnreadGpu, ...]]:
        """Every GPU that answers with its limits, the lost ones and the unread ones (a read of
        their identity failed). ``strict``: a GPU whose limits cannot be read fails the read (an
        apply refuses); otherwise it is left out and logged once. An unread GPU is always left
        out (logged once): it keeps no other GPU from its cap, and a spec naming it is refused
        naming it (agent.power.plan)."""
        scan = self._gpu.scan()
        for bad in scan.unread:
            self._log_once(
                bad.uuid,
                f"GPU {bad.index} cannot be read, left out of the power caps until it is: "
                f"{bad.detail}",
            )
        found = []
        for g in scan.gpus:
            try:
                found.append(GpuPower(g.index, g.uuid, g.name, self._gpu.power_limits(g.uuid)))
            except AgentError as exc:
                if strict:
                    raise
                self._log_once(g.uuid, f"power limits of GPU {g.index} cannot be read: {exc}")
        return found, scan.lost, scan.unread

    def _record_baselines(self, gpus: Sequence[GpuPower], known: dict[str, int]) -> None:
        """Journal the limit of each GPU about to be capped for the first time, before it is:
        what ``restore`` puts back (the first one recorded wins)."""
        for g in gpus:
            if g.uuid not in known:
                self._journal.journal_append(
                    BASELINE, {"uuid": g.uuid, "limit_mw": g.limits.current_mw}
                )

    def _set(self, gpu: GpuPower, milliwatts: int) -> Change:
        self._gpu.set_power_limit(gpu.uuid, milliwatts)
        return self._read_back(_asked(gpu, milliwatts))

    def _read_back(self, change: Change) -> Change:
        """The change as the driver holds it: a set NVML took may still leave another limit
        (another writer on the host sets its own), and what is reported is what is in force."""
        held = self._gpu.power_limits(change.uuid).current_mw
        if held != change.requested_mw:  # once per value: reconcile meets a lasting writer
            self._log_once(
                change.uuid,
                f"power limit of GPU {change.index} ({change.uuid}): set to "
                f"{change.requested_mw / 1000:g} W, but the driver holds {held / 1000:g} W "
                "(another writer of the limit on the host, or the driver did not keep it)",
            )
        return replace(change, after_mw=held)

    def _set_all(self, wanted: list[tuple[GpuPower, int]]) -> list[Change]:
        """Set each limit; on a failure put the ones already set back and raise it (one whose
        read-back failed was set: it is put back too)."""
        done: list[Change] = []
        try:
            for gpu, milliwatts in wanted:
                self._gpu.set_power_limit(gpu.uuid, milliwatts)
                done.append(_asked(gpu, milliwatts))  # set: put back on a failure from here
                done[-1] = self._read_back(done[-1])
        except AgentError:
            for c in reversed(done):
                try:
                    self._gpu.set_power_limit(c.uuid, c.before_mw)
                except AgentError as exc:
                    log.error("could not put GPU %d's power limit back: %s", c.index, exc)
            raise
        return done

    def _restore_pending(self) -> list[Change]:
        """Without a spec, a baseline left is a restore not done yet (its GPU did not answer,
        or an apply stopped midway): put it back where the GPU answers now."""
        baseline = self._baseline()
        if not baseline:
            return []
        changes, done = [], set()
        for g in self._read(strict=False)[0]:
            want = baseline.get(g.uuid)
            if want is None:
                continue
            try:
                if g.limits.current_mw != want:
                    changes.append(self._set(g, want))
                done.add(g.uuid)
            except AgentError as exc:
                self._log_once(g.uuid, f"power limit of GPU {g.index} not restored: {exc}")
        self._keep_baselines(baseline, done)
        for c in changes:
            log.info("power limit of GPU %d restored: %g W", c.index, c.after_mw / 1000)
        return changes

    def _forget_undone_baselines(self, known: dict[str, int]) -> None:
        """After a refused apply put its GPUs back: the baselines it recorded go, so no check
        takes them for a restore to finish (and undoes a limit set by hand meanwhile); one of
        a GPU not back at it (its put-back failed) stays, for `restore`."""
        baseline = self._baseline()
        now = {g.uuid: g.limits.current_mw for g in self._read(strict=False)[0]}
        # Not read now (lost: often why the apply failed) is not "back at it": kept.
        keep = {u: mw for u, mw in baseline.items() if u in known or now.get(u) != mw}
        self._journal.journal_keep(
            BASELINE, [{"uuid": u, "limit_mw": mw} for u, mw in keep.items()]
        )

    def _keep_baselines(self, baseline: dict[str, int], done: set[str]) -> None:
        """Keep the baselines of the GPUs not restored yet, in one write; forget the others'."""
        if done:
            left = [{"uuid": u, "limit_mw": mw} for u, mw in baseline.items() if u not in done]
            self._journal.journal_keep(BASELINE, left)

    def _desired(self) -> PowerSpec | None:
        entries = self._journal.journal_entries(DESIRED)
        return parse(entries[-1][1]["spec"]) if entries else None

    def _baseline(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for _, entry in self._journal.journal_entries(BASELINE):
            found.setdefault(str(entry["uuid"]), int(entry["limit_mw"]))
        return found

    def _log_once(self, uuid: str, message: str) -> None:
        if (uuid, message) not in self._logged:
            self._logged.add((uuid, message))
            log.warning("%s", message)


def _restore_pending(
    baseline: dict[str, int],
    answering: Sequence[GpuPower],
    lost: Sequence[LostGpu | UnreadGpu],
) -> list[LostTarget]:
    """The lost (or unread) GPUs a restore still owes a limit: those with a baseline, and,
    unsure, those of unknown UUID while a baseline belongs to no GPU that answers."""
    unmatched = set(baseline) - {g.uuid for g in answering}
    found = []
    for g in sorted(lost, key=lambda g: g.index):
        unread = g.detail if isinstance(g, UnreadGpu) else ""
        never = "not read" if unread else "lost before the agent saw it"
        maybe = (
            f"its UUID is unknown ({never}): its limit is put back when it answers again if "
            "the agent had capped it"
        )
        if g.uuid in baseline or (not g.uuid and unmatched):
            found.append(LostTarget(g.index, g.uuid, "" if g.uuid else maybe, unread))
    return found


def _asked(gpu: GpuPower, milliwatts: int) -> Change:
    """The change asked for, before it is read back."""
    return Change(gpu.index, gpu.uuid, gpu.limits.current_mw, milliwatts, milliwatts)
