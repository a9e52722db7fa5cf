"""From a power spec and the node's GPUs to one wanted limit per GPU, and the records of what was
set (`Change`) and what is in force (`PowerView`). Pure: no NVML, no journal.

The whole spec is checked against every GPU before anything is set: a limit outside a GPU's range,
an index or UUID the node lacks, a model no GPU is, all come back together in one refusal naming
the entry, the GPU and its range.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agent.errors import DeviceLost, FieldViolation, InvalidSpec
from agent.gpu.nvml import NvmlError
from agent.gpu.types import LostGpu, PowerLimits, UnreadGpu
from agent.power.spec import Entry, PowerSpec

__all__ = [
    "Change",
    "GpuPower",
    "LostTarget",
    "PowerResult",
    "PowerView",
    "Target",
    "lost_selected",
    "model_key",
    "plan",
    "resolve",
]


@dataclass(frozen=True, slots=True)
class GpuPower:
    """One GPU as the plan sees it."""

    index: int
    uuid: str
    name: str
    limits: PowerLimits


@dataclass(frozen=True, slots=True)
class Change:
    """One GPU's limit set: from ``before_mw`` to ``after_mw``, the limit the driver holds
    after the set (read back), which is ``requested_mw`` unless something else set another
    (a host power manager, another tool) or the driver did not keep it."""

    index: int
    uuid: str
    before_mw: int
    after_mw: int
    requested_mw: int

    @property
    def held(self) -> bool:
        """The driver holds the limit asked for."""
        return self.after_mw == self.requested_mw


@dataclass(frozen=True, slots=True)
class LostTarget:
    """A lost GPU a change is for: not changed now, changed by the agent when it answers."""

    index: int
    #: "" when it was lost before the agent saw it answer
    uuid: str
    #: why the change may not be for it after all (its model or UUID is unknown); "" when it is
    unsure: str = ""
    #: for a GPU not lost whose reads fail: the failing call and its error ("" when lost)
    unread: str = ""


@dataclass(frozen=True, slots=True)
class PowerResult:
    """What an apply or a restore did (``changes``, by index) and the lost GPUs it is for,
    which it could not change now (``lost``, by index), and the unread ones (``unread``: not
    lost, but their reads fail)."""

    changes: list[Change]
    lost: list[LostTarget]
    unread: list[LostTarget] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PowerView:
    """The node's power caps as ``gpu-agent power show`` tells them."""

    gpus: tuple[GpuPower, ...]
    #: uuid -> the limit the spec wants
    desired_mw: dict[str, int]
    #: uuid -> the limit from before the agent's first change
    baseline_mw: dict[str, int]
    #: the spec in force, as applied ("" when none)
    spec_text: str


@dataclass(frozen=True, slots=True)
class Target:
    gpu: GpuPower
    want_mw: int
    #: the entry that set it ("power[2]")
    entry: str

    @property
    def changes(self) -> bool:
        return self.gpu.limits.current_mw != self.want_mw


def model_key(name: str) -> str:
    """ "NVIDIA H100 80GB HBM3" and "h100  80gb hbm3" name the same model."""
    words = name.lower().split()
    return " ".join(words[1:] if words[:1] == ["nvidia"] else words)


#: What a refusal says of a GPU the spec names that does not answer.
_LOST = "is lost (it does not answer): its range cannot be checked; apply again once it answers"
#: ... and of one that answers but fails a read (after the failing call and its error).
_UNREAD = "its range cannot be checked; apply again once it is read (a GPU reset may be needed)"


def plan(
    spec: PowerSpec,
    gpus: list[GpuPower],
    lost: Sequence[LostGpu] = (),
    unread: Sequence[UnreadGpu] = (),
) -> list[Target]:
    """The wanted limit of every GPU the spec selects (later entries win), by GPU index; one
    refusal listing every problem when there is any: DeviceLost when each is a lost GPU the
    spec names (by index or UUID), NvmlError when each is lost or unread (no spec error: the
    GPU's read failed), else InvalidSpec."""
    targets, problems = resolve(spec, gpus, lost, unread)
    if problems:
        text = "power spec refused, no GPU changed: " + "; ".join(map(str, problems))
        if all(_LOST in p.description for p in problems):
            raise DeviceLost(text)
        if all(_LOST in p.description or _UNREAD in p.description for p in problems):
            raise NvmlError(text)
        raise InvalidSpec(text, problems)
    return targets


def resolve(
    spec: PowerSpec,
    gpus: list[GpuPower],
    lost: Sequence[LostGpu] = (),
    unread: Sequence[UnreadGpu] = (),
) -> tuple[list[Target], list[FieldViolation]]:
    """The targets that fit, and what does not (a GPU gone, lost, unread or out of range):
    re-applying a stored spec sets what still fits instead of giving up on every GPU.
    ``gpus: all`` and a model select the GPUs that answer; a lost or unread one is capped when
    it answers again."""
    problems: list[FieldViolation] = []
    chosen: dict[int, tuple[str, Entry]] = {}
    for i, entry in enumerate(spec.entries):
        where = f"power[{i}]"
        for gpu in _selected(where, entry, gpus, (lost, unread), problems):
            chosen[gpu.index] = (where, entry)
    by_index = {g.index: g for g in gpus}
    targets = []
    for index in sorted(chosen):
        where, entry = chosen[index]
        gpu = by_index[index]
        lim = gpu.limits
        want = entry.limit.milliwatts(lim.default_mw)
        if not lim.min_mw <= want <= lim.max_mw:
            problems.append(
                FieldViolation(
                    f"{where}.limit",
                    f"{entry.limit} is {want / 1000:g} W on GPU {index} ({gpu.name}), outside its "
                    f"range {lim.min_mw / 1000:g}-{lim.max_mw / 1000:g} W "
                    f"(default {lim.default_mw / 1000:g} W)",
                )
            )
            continue
        targets.append(Target(gpu, want, where))
    return targets, problems


def lost_selected(spec: PowerSpec, lost: Sequence[LostGpu | UnreadGpu]) -> list[LostTarget]:
    """The lost GPUs ``spec`` caps once they answer (`resolve` selects them then): every one
    for ``gpus: all``, those last seen as an entry's model, and, unsure, those whose model is
    unknown. One it names by index or UUID is no target: `plan` refuses it."""
    found = []
    for g in sorted(lost, key=lambda g: g.index):
        sure, unsure = False, ""
        for entry in spec.entries:
            if entry.all_gpus:
                sure = True
            elif entry.model is not None and g.last_known is not None:
                sure = sure or model_key(g.last_known.name) == model_key(entry.model)
            elif entry.model is not None and not unsure:
                never = "not read" if isinstance(g, UnreadGpu) else "lost before the agent saw it"
                unsure = (
                    f"its model is unknown ({never}): capped when it answers again if it is "
                    f"{entry.model!r}"
                )
        if sure or unsure:
            why = g.detail if isinstance(g, UnreadGpu) else ""
            found.append(LostTarget(g.index, g.uuid, "" if sure else unsure, why))
    return found


def _selected(
    where: str,
    entry: Entry,
    gpus: list[GpuPower],
    missing: tuple[Sequence[LostGpu], Sequence[UnreadGpu]],
    problems: list[FieldViolation],
) -> list[GpuPower]:
    if entry.all_gpus:
        return list(gpus)
    if entry.model is not None:
        key = model_key(entry.model)
        found = [g for g in gpus if model_key(g.name) == key]
        if not found:
            names = sorted({g.name for g in gpus})
            problems.append(
                FieldViolation(
                    f"{where}.model",
                    f"no GPU of this node is {entry.model!r}; it has {', '.join(names) or 'none'}",
                )
            )
        return found
    # By index or UUID alike: one that answers is selected, a lost one is said lost, an unread
    # one is said with its failing call.
    lost, unread = missing
    have: dict[int | str, GpuPower] = {g.index: g for g in gpus} | {g.uuid: g for g in gpus}
    gone: set[int | str] = {g.index for g in lost} | {g.uuid for g in lost if g.uuid}
    bad: dict[int | str, UnreadGpu] = {g.index: g for g in unread}
    bad |= {g.uuid: g for g in unread if g.uuid}
    found = []
    for asked in (*entry.indices, *entry.uuids):
        named = f"GPU {asked}" if isinstance(asked, int) else asked
        if asked in have:
            found.append(have[asked])
        elif asked in gone:
            problems.append(FieldViolation(f"{where}.gpus", f"{named} {_LOST}"))
        elif asked in bad:
            why = f"GPU {bad[asked].index} cannot be read ({bad[asked].detail}): {_UNREAD}"
            problems.append(FieldViolation(f"{where}.gpus", why))
        elif isinstance(asked, int):
            answering = ", ".join(str(i) for i in sorted(g.index for g in gpus))
            problems.append(
                FieldViolation(
                    f"{where}.gpus",
                    f"GPU {asked} does not exist; the node has GPUs {answering or 'none'}",
                )
            )
        else:
            problems.append(FieldViolation(f"{where}.gpus", f"no GPU of this node is {asked}"))
    return found
