"""Which selected fields each GPU cannot provide, and why: ``gpu_agent_field_supported``.

Readers report a field unsupported on a GPU with the reason; it stays so until the GPU's MIG
layout changes (then the readers ask again). What is learned is logged once for the agent's
life per GPU model: one line per reason and set of fields, naming every GPU (and its MIG mode)
it was found on in that tick. GPUs that find the same later (eight entering MIG one
tick after the other) say nothing new: ``gpu_agent_field_supported`` has every GPU, always.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from agent.gpu.readings import GpuIdentity
from agent.telemetry.snapshot import FieldSupport
from dcgm.fields import BY_ID, BY_NAME, Field, Unavailable

log = logging.getLogger(__name__)

__all__ = ["SupportBook"]

#: One log line: (level, GPU model, MIG mode, reason, the fields)
_Line = tuple[int, str, str, str, tuple[str, ...]]


class SupportBook:
    def __init__(self, selected: Sequence[Field]) -> None:
        self._selected = [f.id for f in selected]
        #: GPU index -> field id -> why it cannot be read there
        self._unsupported: dict[int, dict[int, str]] = {}
        #: GPU index -> (field, reason) found this tick
        self._new: defaultdict[int, list[tuple[str, str]]] = defaultdict(list)
        #: (field, reason, GPU model) already logged: a layout change re-probes, it does not
        #: re-log, and another GPU of the same model finding the same has nothing new to say
        self._logged: set[tuple[str, str, str]] = set()
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
            self._new[gpu].append((BY_ID[field_id].name, reason))

    def report(self, kinds: Mapping[int, tuple[str, str]] | None = None) -> None:
        """What this tick found that was not said yet for a GPU of its model (``kinds``: GPU
        index -> its model and MIG mode), one line per reason and set of fields, naming the
        GPUs (and the MIG mode) it was found on: a warning, but for a field the agent has no
        source for by design (dcgm-exporter's default counters select the vGPU license state,
        which no GPU of a host has), said at info level so that a warning at start means
        something."""
        lines: defaultdict[_Line, list[int]] = defaultdict(list)
        for gpu, found in sorted(self._new.items()):
            model, mode = (kinds or {}).get(gpu, ("", ""))
            fields: defaultdict[tuple[int, str], set[str]] = defaultdict(set)
            for name, reason in found:
                if (name, reason, model) not in self._logged:
                    fields[(_level(name), reason)].add(name)
            for (level, reason), found_here in fields.items():
                lines[(level, model, mode, reason, tuple(sorted(found_here)))].append(gpu)
        for (level, model, mode, reason, names), gpus in sorted(lines.items(), key=_said_first):
            self._logged.update((name, reason, model) for name in names)
            verb = "are" if len(names) > 1 else "is"
            plural = "s" if len(gpus) > 1 else ""
            which = ", ".join(map(str, gpus)) + (f" ({model}, {mode})" if model else "")
            said = ", ".join(names)
            log.log(level, "%s %s not supported on GPU%s %s: %s", said, verb, plural, which, reason)
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


def _level(name: str) -> int:
    """INFO for a field with no source by design, WARNING for one a GPU refused."""
    return logging.INFO if isinstance(BY_NAME[name].source, Unavailable) else logging.WARNING


def _said_first(line: tuple[_Line, list[int]]) -> tuple[int, ...]:
    """Warnings first, then by GPU."""
    (level, *_), gpus = line
    return (-level, *gpus)
