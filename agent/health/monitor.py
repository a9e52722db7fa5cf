"""The health marks of the node's GPUs and MIG instances, kept current from the driver.

Fed by the XID thread (`record_xid`, queued) and by every telemetry snapshot (`observe`, on the
sampler thread): the snapshot says which GPUs answer, their ECC / row-remap / clock readings,
their MIG instances and the pods on them. Each snapshot runs the queued XIDs and the readings
through the pure machine (`agent.health.machine`), then lets marks clear whose hold-down has
passed. Nothing clears while the driver is away: without snapshots, nothing is known; nor
on a GPU whose health readings failed this tick (its marks hold, their reasons say so).

A GPU-level failure marks the GPU and every instance on it; an XID the driver attributes to a
GPU instance marks that instance only. Every change goes to the listeners (the event bus, the
Node publisher) with the pods it affects, and the marks are saved in the state dir.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.gpu.xid_events import XidEvent
from agent.health.machine import (
    REBOOTED,
    RESET,
    Mark,
    Policy,
    Signal,
    State,
    action_done,
    observe,
    settle,
)
from agent.health.signals import lost_signal, reading_signals, xid_signal
from agent.health.store import SAVE_EVERY_S, MarkStore, Target
from agent.telemetry.snapshot import Snapshot

log = logging.getLogger(__name__)

__all__ = ["HealthChange", "HealthMonitor", "Target"]

_MAX_QUEUED_XIDS = 10_000


@dataclass(frozen=True, slots=True)
class HealthChange:
    target: Target
    #: the GPU's NVML index when the change was made
    gpu_index: int
    before: State
    mark: Mark
    #: the reason as shown (with the cap's note while it holds the mark)
    reason: str
    #: True when the state did not change but a due improvement is held back by the cap
    held: bool = False


class HealthMonitor:
    def __init__(
        self,
        policy: Policy,
        state_dir: Path | None,
        *,
        clock: Callable[[], float] = time.time,
        boot_id: Callable[[], str | None] = lambda: None,
        saved: Callable[[Path, OSError | None], None] = lambda path, error: None,
    ) -> None:
        """``saved``: told each save of the marks file, with its error (None: saved), so the
        state store says while the marks are not kept (`Database.file_written`)."""
        self.policy = policy
        self._saved = saved
        self._save_failed: OSError | None = None
        self._clock = clock
        self._store = MarkStore(state_dir) if state_dir is not None else None
        self._lock = threading.Lock()
        self._marks: dict[Target, Mark] = self._store.load() if self._store else {}
        self._index: dict[str, int] = {}
        #: MIG device UUIDs of each GPU instance (its compute instances), as last read
        self._mig_uuids: dict[Target, tuple[str, ...]] = {}
        self._xids: list[tuple[float, XidEvent]] = []
        #: GPU UUID -> when the agent reset it, until the next snapshot judges it
        self._resets: dict[str, float] = {}
        #: GPU UUID -> which health calls failed in the last snapshot, and why
        self._unread: dict[str, str] = {}
        self._listeners: list[Callable[[HealthChange], None]] = []
        self._saved_at = 0.0
        self._dirty = False
        self._boot_id = boot_id()
        #: GPUs whose marks were saved before a reboot (another boot id), each judged by the
        #: first snapshot that lists it: a reboot is their action, unless they still fail
        self._before_boot = self._rebooted_gpus()
        if self._marks:
            bad = sum(1 for m in self._marks.values() if m.state is not State.HEALTHY)
            log.info("health marks restored: %d, %d not healthy", len(self._marks), bad)

    def _rebooted_gpus(self) -> set[str]:
        saved = self._store.saved_boot_id if self._store else None
        if self._boot_id is not None and saved != self._boot_id:
            self._dirty = True  # saved at the first snapshot, for the next start to compare
        if saved is None or self._boot_id is None or saved == self._boot_id:
            return set()  # the same boot, or one of them unknown: no evidence of a reboot
        log.info("the node rebooted since the health marks were saved (boot id %s)", saved)
        return {t.gpu_uuid for t in self._marks}

    def subscribe(self, listener: Callable[[HealthChange], None]) -> None:
        """Call ``listener`` with every change (on the sampler thread; it must not block)."""
        self._listeners.append(listener)

    # -- reads (any thread) -----------------------------------------------------------------------

    def marks(self) -> dict[Target, Mark]:
        with self._lock:
            return dict(self._marks)

    def shown(self) -> dict[Target, tuple[int, Mark, str]]:
        """Each mark with its GPU's last known index and the reason as shown."""
        with self._lock:
            return {
                t: (self._index.get(t.gpu_uuid, -1), m, self._reason(t, m))
                for t, m in self._marks.items()
            }

    def unread(self) -> dict[int, str]:
        """GPU index -> the health calls that failed in the last snapshot, and why."""
        with self._lock:
            return {self._index.get(u, -1): why for u, why in self._unread.items()}

    def unjudged(self) -> dict[int, str]:
        """GPU index -> why, for the GPUs with no verdict yet: first seen while their health
        readings fail (no mark until they are read; a signal such as an XID judges them)."""
        with self._lock:
            return {
                self._index.get(u, -1): why
                for u, why in self._unread.items()
                if Target(u) not in self._marks
            }

    def _reason(self, target: Target, mark: Mark) -> str:
        reason = mark.describe(self.policy)
        unread = self._unread.get(target.gpu_uuid)
        if unread is None:
            return reason
        said = f"health readings fail ({unread}): the mark holds until they are read"
        return f"{reason}; {said}" if reason else said

    def device_uuids(self) -> dict[Target, tuple[str, ...]]:
        """The driver UUIDs each target answers to: a GPU's own, an instance's MIG devices."""
        with self._lock:
            out: dict[Target, tuple[str, ...]] = {
                t: (t.gpu_uuid,) for t in self._marks if t.gpu_instance is None
            }
            out.update(self._mig_uuids)
            return out

    # -- inputs -----------------------------------------------------------------------------------

    def record_xid(self, event: XidEvent) -> None:
        """From the XID thread: judged with the next snapshot (which maps the index to a UUID
        and names the pods)."""
        with self._lock:
            if len(self._xids) < _MAX_QUEUED_XIDS:
                self._xids.append((self._clock(), event))

    def gpu_reset(self, uuid: str) -> None:
        """The agent reset this GPU (ResetGpu, a MIG mode change's reset): the marks whose
        action that was are done with it at the next snapshot (`machine.action_done`). That
        snapshot's readings of the GPU, and its XIDs from before the reset, may predate it:
        they are not counted against it (a lasting fault signals again a tick later)."""
        with self._lock:
            self._resets[uuid] = self._clock()

    def observe(self, snapshot: Snapshot) -> None:
        now = self._clock()
        changes: list[HealthChange] = []
        with self._lock:
            xids, self._xids = self._xids, []
            uuids = {
                s.gpu.index: Target.gpu(s.gpu.uuid, s.gpu.index).gpu_uuid for s in snapshot.gpus
            }
            # Keyed as the marks are: a GPU lost before it was ever read by its index alone.
            self._index.update({uuid: index for index, uuid in uuids.items()})
            instances = _instances(snapshot)
            self._mig_uuids = {
                Target(layout.gpu.uuid, gi.id): tuple(
                    ci.uuid for ci in gi.compute_instances if ci.uuid
                )
                for layout in snapshot.layouts
                for gi in layout.instances
            }
            pods = _pods(snapshot)
            unread = {
                uuids.get(r.gpu.index, r.gpu.uuid): r.unread for r in snapshot.health if r.unread
            }
            self._track(uuids, instances, unread.keys(), now)
            resets, self._resets = self._resets, {}
            self._after_actions(self._taken(snapshot, uuids, resets), now, pods, uuids, changes)

            def apply(target: Target, signal: Signal) -> None:
                if target.gpu_uuid in resets and signal.at <= resets[target.gpu_uuid]:
                    return  # an XID from before the reset: the fault the reset remedied
                self._apply(target, signal, pods, uuids, changes)

            def apply_read(target: Target, signal: Signal) -> None:
                if target.gpu_uuid not in resets:  # this tick's reads may predate the reset
                    self._apply(target, signal, pods, uuids, changes)

            for at, event in xids:
                uuid = uuids.get(event.gpu_index)
                signal = xid_signal(event.xid, at)
                if uuid is None or signal is None:
                    continue
                if event.gpu_instance_id is not None:
                    apply(Target(uuid, event.gpu_instance_id), signal)
                else:
                    self._gpu_wide(uuid, signal, instances, apply)
            for status in snapshot.gpus:
                if status.up is False:
                    uuid = uuids[status.gpu.index]
                    self._gpu_wide(uuid, lost_signal(status.detail, now), instances, apply_read)
            for readings in snapshot.health:
                uuid = uuids.get(readings.gpu.index, readings.gpu.uuid)
                for signal in reading_signals(readings.values, now):
                    self._gpu_wide(uuid, signal, instances, apply_read)
            self._unread = unread
            up = {uuids[s.gpu.index] for s in snapshot.gpus if s.up}  # None: never answered
            for target, mark in list(self._marks.items()):
                if target.gpu_uuid not in up or target.gpu_uuid in self._unread:
                    continue  # nothing is known of a GPU that does not answer or is not read
                after, settled = settle(mark, now, self.policy, pods.get(target, ()))
                self._marks[target] = after
                if settled is not None:
                    changes.append(self._change(target, settled.before, after, settled.held, uuids))
            self._save(now, force=bool(changes))
        for change in changes:
            self._log(change)
            for listener in self._listeners:
                listener(change)

    # -- internals (under the lock) ----------------------------------------------------------------

    def _track(
        self,
        uuids: Mapping[int, str],
        instances: Mapping[str, set[int]],
        unread: Collection[str],
        now: float,
    ) -> None:
        """Every GPU seen and every instance it has now gets a mark (healthy at first), once
        its health readings were read: a GPU first seen while they fail is not judged yet
        (`unjudged`), since unread is not healthy. The marks of instances that are gone
        (destroyed, or lost with a reboot) go with them, and those of GPUs the driver no
        longer lists (a GPU replaced: a new UUID)."""
        listed = set(uuids.values())
        for target in [t for t in self._marks if listed and t.gpu_uuid not in listed]:
            del self._marks[target]
            self._dirty = True
        judged = [u for u in uuids.values() if u not in unread or Target(u) in self._marks]
        wanted = [Target(u) for u in judged]
        wanted += [Target(u, gi) for u, ids in instances.items() if u in judged for gi in ids]
        for target in wanted:
            if target not in self._marks:
                self._marks[target] = Mark(since=now)
                self._dirty = True
        for uuid, ids in instances.items():
            for target in [t for t in self._marks if t.gpu_uuid == uuid]:
                if target.gpu_instance is not None and target.gpu_instance not in ids:
                    del self._marks[target]
                    self._dirty = True

    def _taken(
        self, snapshot: Snapshot, uuids: Mapping[int, str], resets: Mapping[str, float]
    ) -> dict[str, str]:
        """GPU UUID -> the evidence this snapshot brings that a mark's action was taken: the
        agent reset it, or it answers for the first time since a reboot."""
        taken = dict.fromkeys(resets, RESET)
        listed = {uuids[s.gpu.index]: s.up for s in snapshot.gpus}
        # Judged once it answers or is lost; one not read since the start waits for either.
        judged = {u for u in self._before_boot if listed.get(u) is not None}
        self._before_boot -= judged
        taken.update({uuid: REBOOTED for uuid in judged if listed[uuid]})
        return taken

    def _after_actions(
        self,
        taken: Mapping[str, str],
        now: float,
        pods: Mapping[Target, tuple[str, ...]],
        uuids: Mapping[int, str],
        changes: list[HealthChange],
    ) -> None:
        for target, mark in list(self._marks.items()):
            evidence = taken.get(target.gpu_uuid)
            if evidence is not None:
                got = pods.get(target, ())
                after, done = action_done(mark, now, self.policy, got, evidence=evidence)
                self._marks[target] = after
                if done is not None:
                    self._dirty = True
                    changes.append(self._change(target, done.before, after, done.held, uuids))

    def _gpu_wide(
        self,
        uuid: str,
        signal: Signal,
        instances: Mapping[str, set[int]],
        apply: Callable[[Target, Signal], None],
    ) -> None:
        apply(Target(uuid), signal)
        if signal.severity is State.FAILED:
            for gi in sorted(instances.get(uuid, ())):
                apply(Target(uuid, gi), signal)

    def _apply(
        self,
        target: Target,
        signal: Signal,
        pods: Mapping[Target, tuple[str, ...]],
        uuids: Mapping[int, str],
        changes: list[HealthChange],
    ) -> None:
        before = self._marks.get(target, Mark(since=signal.at))
        after, observed = observe(before, signal, self.policy, pods.get(target, ()))
        if after != before:
            self._dirty = True
        self._marks[target] = after
        if observed is not None:
            changes.append(self._change(target, observed.before, after, observed.held, uuids))

    def _change(
        self, target: Target, before: State, mark: Mark, held: bool, uuids: Mapping[int, str]
    ) -> HealthChange:
        index = next((i for i, u in uuids.items() if u == target.gpu_uuid), -1)
        return HealthChange(target, index, before, mark, mark.describe(self.policy), held)

    def _save(self, now: float, *, force: bool) -> None:
        if self._store is None or not (force or self._dirty):
            return
        if not force and now - self._saved_at < SAVE_EVERY_S:
            return
        try:
            self._store.save(self._marks, now, self._boot_id)
        except OSError as exc:
            # Said once, and by the state component while it lasts; tried again after
            # SAVE_EVERY_S (or at the next change), not every tick.
            if self._save_failed is None or self._save_failed.errno != exc.errno:
                log.error("saving health marks to %s failed: %s", self._store.path, exc)
            self._save_failed, self._saved_at = exc, now
            self._saved(self._store.path, exc)
            return
        if self._save_failed is not None:
            log.info("health marks saved to %s again", self._store.path)
            self._save_failed = None
            self._saved(self._store.path, None)
        self._saved_at, self._dirty = now, False

    @staticmethod
    def _log(change: HealthChange) -> None:
        gi = change.target.gpu_instance
        where = f"GPU {change.gpu_index}" + ("" if gi is None else f" GPU instance {gi}")
        if change.held:
            log.warning("%s stays %s: %s", where, change.mark.state.value, change.reason)
            return
        level = logging.INFO if change.mark.state is State.HEALTHY else logging.WARNING
        log.log(
            level,
            "%s %s -> %s: %s%s",
            where,
            change.before.value,
            change.mark.state.value,
            change.reason,
            f" (pods: {', '.join(change.mark.pods)})" if change.mark.pods else "",
        )


def _instances(snapshot: Snapshot) -> dict[str, set[int]]:
    """GPU UUID -> its GPU instance ids, for the GPUs whose layout the snapshot read."""
    return {
        layout.gpu.uuid: {gi.id for gi in layout.instances}
        for layout in snapshot.layouts
        if layout.gpu.uuid
    }


def _pods(snapshot: Snapshot) -> dict[Target, tuple[str, ...]]:
    """Pods (namespace/name) on each GPU (any of its instances counts) and each instance."""
    found: dict[Target, set[str]] = {}

    def add(uuid: str, gi: int | None, names: Iterable[str]) -> None:
        for target in {Target(uuid), Target(uuid, gi)}:
            found.setdefault(target, set()).update(names)

    for sample in snapshot.entities:
        if sample.pod is not None:
            instance = sample.entity.instance
            gi = None if instance is None else instance.gpu_instance_id
            add(sample.entity.gpu.uuid, gi, [f"{sample.pod.namespace}/{sample.pod.name}"])
    for usage in snapshot.pods:
        instance = usage.entity.instance
        gi = None if instance is None else instance.gpu_instance_id
        add(usage.entity.gpu.uuid, gi, [f"{usage.pod.namespace}/{usage.pod.name}"])
    return {t: tuple(sorted(names)) for t, names in found.items()}
