"""Which GPUs answer this tick and how they are laid out: the frame every reader reads against.

Per GPU and tick: its MIG layout (cheap: instance changes are noticed at once), the planner's
layout with processes (``NodeReader.layout``: the API's inventory reads it from the snapshot
instead of calling NVML again) and, once NVML answers, whether it has GPM (a probe that fails
leaves it unknown, said in the frame, and is asked again next tick). A lost GPU is marked down and
keeps its last planner's layout; the others go on. A GPU is up once it has answered a whole
tick: one listed whose reads have failed since the agent started is neither up nor down
(``up`` None), since nothing it said shows it works. A GPU whose layout or process list
cannot be read this tick keeps its last layout too, but its status says so (``unread``): the
processes in it are not current, and a GPU never read has only its identity. ``settle`` turns
what the readers found (lost or failed GPUs) into the tick's statuses.

A GPU this agent changes during the tick (a MIG apply destroys and creates its instances:
``GpuDriver.changes``) is not read this tick: its status says so, it has no series, and a read
of it that failed met that change, so it is not counted as an error. Its layout changes are
said once the agent's reconfiguration is over, in one line naming every GPU it changed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from agent.errors import AgentError, DeviceLost
from agent.gpu.readings import GpuIdentity, MigLayout, NodeReader
from agent.gpu.types import GpuLayout
from agent.telemetry.failing import FailingGpus
from agent.telemetry.reader import Frame
from agent.telemetry.snapshot import GpuStatus
from agent.telemetry.stats import TelemetryStats

log = logging.getLogger(__name__)

__all__ = ["RECONFIGURING", "Topology"]

#: A GPU's status while this agent changes it: not read this tick, and no fault of the GPU.
RECONFIGURING = "being reconfigured by this agent (MIG change in progress)"


@dataclass
class _Gpu:
    layout: MigLayout | None = None
    #: the planner's view, last read (kept while the GPU is down)
    placed: GpuLayout | None = None
    #: answered its last whole tick (True), lost (False), or neither yet (None: never read)
    up: bool | None = None
    #: whether it has GPM; None until NVML's probe answers
    gpm: bool | None = None
    #: why the GPM probe failed this tick; "" when it answered
    gpm_unread: str = ""
    #: whether ``placed`` (and its processes) was read this tick
    fresh: bool = False
    #: why ``placed`` was not read this tick (the failing call); "" when it was
    unread: str = ""
    #: the layout read's failure last logged (once per change, not every tick)
    said: str = ""
    #: the identity its statuses carry while it is down: the one it went down with, kept
    #: until it answers again, so its series keeps its labels (see ``settle``)
    down_as: GpuIdentity | None = None


class Topology:
    """The sampler's view of the GPUs between ticks; call from the sampler thread only."""

    def __init__(self, reader: NodeReader, stats: TelemetryStats) -> None:
        self._reader = reader
        self._stats = stats
        self._gpus: dict[int, _Gpu] = {}
        self._versions: tuple[str, str] | None = None
        #: this tick's GPUs that did not answer: index -> why (lost), or None (failed)
        self._missing: dict[int, str | None] = {}
        self._failing = FailingGpus(log, "collection")
        self._changes = reader.driver.changes
        #: GPU index -> (UUID, its change stamp) at the start of this tick
        self._stamps: dict[int, tuple[str, int]] = {}
        #: GPUs whose layout changed since the last line said so
        self._reprobed: set[int] = set()
        #: the GPUs this agent changed during the last tick (not read): asked anew next tick
        self.reconfigured: frozenset[int] = frozenset()

    def ours(self, gpu: int) -> bool:
        """Whether this agent changed GPU ``gpu`` since this tick began, or changes it now."""
        uuid, stamp = self._stamps.get(gpu, ("", 0))
        return bool(uuid) and self._changes.since(uuid, stamp)

    def versions(self) -> tuple[str, str]:
        """(driver version, NVML version), read once."""
        if self._versions is None:
            self._versions = self._reader.versions()
        return self._versions

    def frame(self, now: float) -> Frame:
        """Read every GPU's layout; one that fails is left out of the frame."""
        gpus = self._reader.gpus()
        self._stamps = {g.index: (g.uuid, self._changes.stamp(g.uuid)) for g in gpus if g.uuid}
        self._missing = {}
        layouts: dict[int, MigLayout] = {}
        changed: set[int] = set()
        gpm: set[int] = set()
        gpm_unknown: dict[int, str] = {}
        for gpu in gpus:
            state = self._gpus.setdefault(gpu.index, _Gpu())
            state.fresh, state.unread = False, ""
            try:
                layout = self._read(gpu.index, state)
            except DeviceLost as exc:
                self._missing[gpu.index] = str(exc)
                self._failing.lost(gpu.index)
                continue
            except AgentError as exc:
                # One GPU's NVML failure must not silence the others; it has no series this tick.
                self._missing[gpu.index] = None
                if self.ours(gpu.index):
                    state.unread = RECONFIGURING
                    continue
                self._stats.error("nvml")
                self._failing.failed(gpu.index, str(exc))
                state.unread = str(exc)
                continue
            self._failing.read(gpu.index)
            if layout != state.layout or gpu.index in self.reconfigured:
                if state.layout is not None:
                    log.debug("GPU %d MIG layout changed: re-probing field support", gpu.index)
                    changed.add(gpu.index)
                state.layout = layout
            layouts[gpu.index] = layout
            if state.gpm:
                gpm.add(gpu.index)
            elif state.gpm is None:
                gpm_unknown[gpu.index] = state.gpm_unread
        placed = tuple(p for i in layouts if (p := self._gpus[i].placed) is not None)
        # The processes reader's lists: the ones read for the planner's layout this tick.
        processes = {
            i: p.processes for i in layouts if (s := self._gpus[i]).fresh and (p := s.placed)
        }
        unread = {i: s.unread for i in layouts if (s := self._gpus[i]).unread}
        self._say_reprobed(changed)
        return Frame(
            now,
            gpus,
            layouts,
            frozenset(changed),
            frozenset(gpm),
            placed,
            processes=processes,
            unread=unread,
            gpm_unknown=gpm_unknown,
            ours=self.ours,
        )

    def _say_reprobed(self, changed: set[int]) -> None:
        """One line per change: once no layout changed this tick and this agent reconfigures
        nothing, naming every GPU whose layout changed since the last line (an apply changes
        the GPUs one after the other, over many ticks)."""
        self._reprobed |= changed
        if self._reprobed and not changed and self._changes.quiet():
            which = ", ".join(map(str, sorted(self._reprobed)))
            plural = "s" if len(self._reprobed) > 1 else ""
            log.info("MIG layout changed on GPU%s %s: field support re-probed", plural, which)
            self._reprobed.clear()

    def _read(self, gpu: int, state: _Gpu) -> MigLayout:
        layout = self._reader.mig_layout(gpu)
        try:
            state.placed = self._reader.layout(gpu, layout)
            state.fresh = True
        except DeviceLost:
            raise
        except AgentError as exc:  # the inventory says it is not current; telemetry goes on
            if self.ours(gpu):  # met this agent's own change: the GPU is not read this tick
                state.unread = RECONFIGURING
                return layout
            self._stats.error("nvml")
            state.unread = f"processes and layout: {exc}"
            if state.unread != state.said:
                log.warning("GPU %d: not read, its processes unknown: %s", gpu, state.unread)
                state.said = state.unread
        else:
            if state.said:
                log.info("GPU %d: processes and layout read again", gpu)
                state.said = ""
        if state.gpm is None:
            self._probe_gpm(gpu, state)
        return layout

    def _probe_gpm(self, gpu: int, state: _Gpu) -> None:
        """Ask NVML whether the GPU has GPM; a failure (not a loss) leaves it unknown until a
        later tick's probe answers: its GPM series are absent meanwhile, never "no GPM"."""
        try:
            state.gpm = self._reader.gpm_supported(gpu)
        except DeviceLost:
            raise
        except AgentError as exc:
            if self.ours(gpu):  # met this agent's own change: asked again next tick
                return
            self._stats.error("nvml")
            why = f"whether it has GPM is unknown: {exc}"
            if why != state.gpm_unread:
                log.warning("GPU %d: %s (asked again next tick)", gpu, why)
            state.gpm_unread = why
            return
        if state.gpm_unread:
            log.info("GPU %d: GPM probe answered again (GPM: %s)", gpu, state.gpm)
            state.gpm_unread = ""

    def settle(
        self, frame: Frame, lost: Mapping[int, str], failed: set[int]
    ) -> tuple[tuple[GpuStatus, ...], dict[int, MigLayout]]:
        """The tick's statuses, and the layouts of the GPUs that answered every reader (not
        one this agent changed meanwhile: what was read of it is no steady state)."""
        ours = {g.index for g in frame.gpus if g.index not in lost and self.ours(g.index)}
        for index in ours:
            self._gpus[index].unread = RECONFIGURING
        self.reconfigured = frozenset(ours)
        missing = {**self._missing, **{i: None for i in failed | ours}, **lost}
        statuses: list[GpuStatus] = []
        for gpu in frame.gpus:
            state = self._gpus[gpu.index]
            if gpu.index not in missing:
                if state.up is False:  # the inventory says it at WARNING (one voice per event)
                    log.debug(
                        "GPU %d (%s) answers NVML again", gpu.index, gpu.uuid or "uuid unknown"
                    )
                state.up, state.down_as = True, None
                statuses.append(GpuStatus(gpu, up=True, unread=state.unread))
                continue
            # A GPU lost before it ever answered may have more of its identity read while it
            # stays lost (a handle that opens, a UUID that answers): its gpu_up 0 series must
            # keep the labels it went down with, or GpuAgentGpuLost resolves and fires anew.
            if state.up is False and state.down_as is not None:
                gpu = state.down_as
            why = missing[gpu.index]
            if why is None:
                # Its readings failed (no series this tick); what it was read with is said.
                statuses.append(GpuStatus(gpu, up=state.up, unread=state.unread))
                continue
            state.down_as = gpu
            if state.up is not False:
                self._stats.error("gpu_lost")
                uuid = gpu.uuid or "uuid unknown"  # lost before it ever answered
                log.debug("GPU %d (%s) is lost, marking it down: %s", gpu.index, uuid, why)
            state.up = False
            statuses.append(GpuStatus(gpu, up=False, detail=why))
        answered = {i: lay for i, lay in frame.layouts.items() if i not in missing}
        return tuple(statuses), answered

    def placed(self) -> tuple[GpuLayout, ...]:
        """Every GPU's last planner's layout (one never seen up has none)."""
        return tuple(p for _, s in sorted(self._gpus.items()) if (p := s.placed) is not None)
