"""Which selected fields each GPU cannot provide, and why: ``gpu_agent_field_supported``.

Readers report a field unsupported on a GPU with the reason; it stays so until the GPU's MIG
layout changes (then the readers ask again). Each field and reason is logged once per GPU for
the agent's life, one line per field and reason naming every GPU it was found on in a tick.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence

from agent.gpu.readings import GpuIdentity
from agent.telemetry.snapshot import FieldSupport
from dcgm.fields import BY_ID, BY_NAME, Field, Unavailable

log = logging.getLogger(__name__)

__all__ = ["SupportBook"]


class SupportBook:
    def __init__(self, selected: Sequence[Field]) -> None:
        self._selected = [f.id for f in selected]
        #: GPU index -> field id -> why it cannot be read there
        self._unsupported: dict[int, dict[int, str]] = {}
        self._new: defaultdict[tuple[str, str], list[int]] = defaultdict(list)
        #: (field, reason, GPU) already logged: a layout change re-probes, it does not re-log
        self._logged: set[tuple[str, str, int]] = set()
        #: the last rows and the GPUs they were made for: rebuilt only after a change
        self._rows: tuple[FieldSupport, ...] | None = None
        self._rows_of: tuple[GpuIdentity, ...] = ()

    def reset(self, gpus: Iterable[int]) -> None:
        """These GPUs' layouts changed: what they refused may work now."""
        for gpu in gpus:
            if self._unsupported.pop(gpu, None) is not None:
                self._rows = None

    def note(self, notes: Iterable[tuple[int, int, str]]) -> None:
        for gpu, field_id, reason in notes:
            known = self._unsupported.setdefault(gpu, {})
            if field_id in known:
                continue
            known[field_id] = reason
            self._rows = None
            name = BY_ID[field_id].name
            if (name, reason, gpu) not in self._logged:
                self._logged.add((name, reason, gpu))
                self._new[(name, reason)].append(gpu)

    def report(self) -> None:
        """One log line per field and reason, naming every GPU it was found on this tick: a
        warning, but for a field the agent has no source for by design (dcgm-exporter's default
        counters select the vGPU license state, which no GPU of a host has), said at info level
        so that a warning at start means something to look at."""
        for (name, reason), gpus in sorted(self._new.items()):
            plural = "s" if len(gpus) > 1 else ""
            which = ", ".join(map(str, gpus))
            by_design = isinstance(BY_NAME[name].source, Unavailable)
            level = logging.INFO if by_design else logging.WARNING
            log.log(level, "%s is not supported on GPU%s %s: %s", name, plural, which, reason)
        self._new.clear()

    def rows(self, gpus: tuple[GpuIdentity, ...]) -> tuple[FieldSupport, ...]:
        """Per GPU and selected field: whether it can be read there."""
        if self._rows is None or gpus != self._rows_of:
            self._rows_of = gpus
            self._rows = tuple(
                FieldSupport(f, gpu, f not in self._unsupported.get(gpu.index, {}))
                for gpu in gpus
                for f in self._selected
            )
        return self._rows
