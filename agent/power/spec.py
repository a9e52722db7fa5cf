"""The power spec: which GPUs get which power management limit. Pure parsing, no NVML.

    version: v1
    power:
      - gpus: all                     # every GPU of the node
        limit: 0.8                    # a fraction of the GPU's default limit, 0 < f <= 1
      - gpus: [0, 1]                  # GPU indices, or UUIDs ("GPU-...")
        limit: 500W                   # watts ("500W", "412.5 W")
      - model: "NVIDIA H100 80GB HBM3"  # the name NVML reports; "NVIDIA " may be left out
        limit: 80%                    # a percentage of the default limit

An entry selects GPUs with exactly one of ``gpus`` and ``model``. Later entries override earlier
ones for the GPUs they both select, so a node-wide entry can come first and exceptions after it.
Every mistake is a refusal naming the field (``power[1].limit``); nothing is changed then.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from agent import safeyaml
from agent.errors import FieldViolation, InvalidSpec

__all__ = ["VERSION", "Entry", "Limit", "PowerSpec", "parse"]

VERSION = "v1"
MAX_ENTRIES = 64
_LIMITS = safeyaml.Limits(max_bytes=64 * 1024, max_depth=8, max_nodes=2_000, max_aliases=0)
_WATTS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*[wW]\s*$", re.ASCII)
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$", re.ASCII)
_MAX_WATTS = 100_000.0  # far above any board; keeps milliwatts inside NVML's unsigned int


@dataclass(frozen=True, slots=True)
class Limit:
    """Watts, or a fraction of the default limit (exactly one is set)."""

    watts: float | None = None
    fraction: float | None = None

    def milliwatts(self, default_mw: int) -> int:
        if self.watts is not None:
            return round(self.watts * 1000)
        assert self.fraction is not None
        return round(default_mw * self.fraction)

    def __str__(self) -> str:
        if self.watts is not None:
            return f"{self.watts:g}W"
        assert self.fraction is not None
        return f"{self.fraction:g} of the default"


@dataclass(frozen=True, slots=True)
class Entry:
    limit: Limit
    #: True: every GPU
    all_gpus: bool = False
    indices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()
    model: str | None = None


@dataclass(frozen=True, slots=True)
class PowerSpec:
    entries: tuple[Entry, ...]
    #: the document as given, kept so `power show` returns what was applied
    text: str


def parse(text: str) -> PowerSpec:
    """The spec in ``text``; InvalidSpec listing every bad field otherwise."""
    doc = safeyaml.load(text, "spec", _LIMITS)
    if not isinstance(doc, dict):
        raise _refused([FieldViolation("spec", "a mapping with version and power")])
    problems: list[FieldViolation] = []
    unknown = sorted(str(k) for k in doc if k not in ("version", "power"))
    if unknown:
        problems.append(FieldViolation(unknown[0], "unknown field; allowed: version, power"))
    if doc.get("version") != VERSION:
        problems.append(
            FieldViolation(
                "version", f"must be {VERSION!r}, got {safeyaml.brief(doc.get('version'))}"
            )
        )
    items = doc.get("power")
    if not isinstance(items, list) or not items:
        problems.append(FieldViolation("power", "a non-empty list of {gpus|model, limit}"))
        raise _refused(problems)
    if len(items) > MAX_ENTRIES:
        problems.append(FieldViolation("power", f"at most {MAX_ENTRIES} entries, got {len(items)}"))
        raise _refused(problems)
    entries = []
    for i, item in enumerate(items):
        entry = _entry(f"power[{i}]", item, problems)
        if entry is not None:
            entries.append(entry)
    if problems:
        raise _refused(problems)
    return PowerSpec(tuple(entries), text)


def _refused(problems: list[FieldViolation]) -> InvalidSpec:
    return InvalidSpec(
        "invalid power spec: " + "; ".join(map(str, problems)),
        problems,
    )


def _entry(where: str, item: object, problems: list[FieldViolation]) -> Entry | None:
    if not isinstance(item, dict):
        problems.append(FieldViolation(where, "a mapping with gpus or model, and limit"))
        return None
    before = len(problems)
    unknown = sorted(str(k) for k in item if k not in ("gpus", "model", "limit"))
    if unknown:
        problems.append(
            FieldViolation(f"{where}.{unknown[0]}", "unknown field; allowed: gpus, model, limit")
        )
    limit = _limit(f"{where}.limit", item.get("limit"), problems)
    has_gpus, has_model = "gpus" in item, "model" in item
    if has_gpus == has_model:
        problems.append(FieldViolation(where, "exactly one of gpus and model"))
        return None
    if has_model:
        model = item["model"]
        if not isinstance(model, str) or not model.strip() or len(model) > 96:
            problems.append(
                FieldViolation(f"{where}.model", "a GPU model name, e.g. 'H100 80GB HBM3'")
            )
            return None
        return Entry(limit, model=model.strip()) if limit and len(problems) == before else None
    gpus = item["gpus"]
    if gpus == "all":
        return Entry(limit, all_gpus=True) if limit and len(problems) == before else None
    if not isinstance(gpus, list) or not gpus:
        problems.append(
            FieldViolation(f"{where}.gpus", "'all', or a non-empty list of GPU indices or UUIDs")
        )
        return None
    indices: list[int] = []
    uuids: list[str] = []
    for j, g in enumerate(gpus):
        if isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 1024:
            indices.append(g)
        elif isinstance(g, str) and g.startswith("GPU-") and len(g) <= 64:
            uuids.append(g)
        else:
            problems.append(
                FieldViolation(
                    f"{where}.gpus[{j}]",
                    f"a GPU index (0, 1, ...) or UUID (GPU-...), got {safeyaml.brief(g)}",
                )
            )
    if limit is None or len(problems) != before:
        return None
    return Entry(limit, indices=tuple(indices), uuids=tuple(uuids))


def _limit(where: str, value: object, problems: list[FieldViolation]) -> Limit | None:
    hint = "watts ('500W') or a fraction of the default limit (0.8, or '80%')"
    if isinstance(value, bool) or value is None:
        problems.append(FieldViolation(where, f"required: {hint}"))
        return None
    if isinstance(value, int | float):
        if not math.isfinite(value) or not 0 < value <= 1:
            # Watts are hinted only where those watts would be taken ('infW', '0W' are not).
            as_watts = math.isfinite(value) and 0 < value <= _MAX_WATTS
            suggest = f" (write '{value}W' for watts)" if as_watts else ""
            problems.append(
                FieldViolation(
                    where,
                    f"a bare number is a fraction of the default limit, 0 < f <= 1; got "
                    f"{safeyaml.brief(value)}{suggest}",
                )
            )
            return None
        return Limit(fraction=float(value))
    if isinstance(value, str):
        watts = _WATTS.match(value)
        if watts:
            w = float(watts.group(1))
            if not 0 < w <= _MAX_WATTS:
                problems.append(FieldViolation(where, f"watts above 0, got {value!r}"))
                return None
            return Limit(watts=w)
        percent = _PERCENT.match(value)
        if percent:
            p = float(percent.group(1))
            if not 0 < p <= 100:
                problems.append(
                    FieldViolation(where, f"a percentage above 0 and at most 100, got {value!r}")
                )
                return None
            return Limit(fraction=p / 100)
    problems.append(FieldViolation(where, f"{hint}; got {safeyaml.brief(value)}"))
    return None
