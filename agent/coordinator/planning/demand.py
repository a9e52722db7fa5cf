"""MIG demand for the fleet planner: a demand file, and a demand trace for replays.

A demand file counts the MIG devices the fleet should offer, per GPU-instance profile (not
compute-instance profiles such as ``1c.3g.40gb``: those splits belong to a MIG config), and per
GPU model where it matters (the same name, e.g. ``3g.40gb``, exists on A100-80GB and H100)::

    version: v1
    demand:
      1g.10gb: 40                  # on any GPU that offers the profile
      3g.40gb:                     # per model, as `fleet status` names them
        NVIDIA H100 80GB HBM3: 6
        NVIDIA A100-SXM4-80GB: 2

or, with priorities and pools, a list of entries (``priority`` defaults to 0, higher is met
first; ``pool`` is a node selector, as ``--selector`` takes, the entry's devices must be on)::

    version: v1
    demand:
      - {profile: 7g.80gb, count: 8, priority: 100, pool: "pool=training"}
      - {profile: 1g.10gb, count: 56, model: NVIDIA H100 80GB HBM3}

A trace is a CSV with the header ``time,profile,count[,model][,priority][,pool]`` (or the same
rows as a YAML list): each row sets that entry's demand (profile, model, priority, pool) from that
time on. Times are seconds or ISO-8601.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from agent import safeyaml
from agent.errors import FieldViolation, InvalidSpec
from agent.gpu.models import model_key
from agent.gpu.profiles import parse_profile
from agent.safeyaml import brief, capped

__all__ = [
    "Demand",
    "DemandEntry",
    "TraceStep",
    "demand_yaml",
    "load_demand",
    "load_trace",
    "parse_demand",
    "parse_trace",
]

VERSION = "v1"


@dataclass(frozen=True, slots=True)
class DemandEntry:
    """``count`` devices of ``profile`` on GPUs of ``model`` (None: any model offering it).

    ``priority``: higher is met first when not everything fits. ``pool``: a node selector the
    devices must be on (None: any node).
    """

    profile: str
    count: int
    model: str | None = None
    priority: int = 0
    pool: str | None = None

    @property
    def label(self) -> str:
        out = self.profile if self.model is None else f"{self.profile} on {self.model}"
        return out if self.pool is None else f"{out} in {self.pool}"

    def accepts(self, profile: str, model: str) -> bool:
        """Whether a ``profile`` device on a GPU named ``model`` counts (pools aside)."""
        return self.profile == profile and (
            self.model is None or model_key(self.model) == model_key(model)
        )


@dataclass(frozen=True, slots=True)
class Demand:
    entries: tuple[DemandEntry, ...]

    def entry_for(self, profile: str, model: str) -> int | None:
        """Index of the first entry a ``profile`` device on a ``model`` GPU counts toward."""
        for i, e in enumerate(self.entries):
            if e.accepts(profile, model):
                return i
        return None

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(sorted({e.pool for e in self.entries if e.pool is not None}))

    @property
    def total(self) -> int:
        return sum(e.count for e in self.entries)


def _profile(raw: object, field: str, bad: list[FieldViolation]) -> str | None:
    try:
        parsed = parse_profile(str(raw))
    except InvalidSpec as exc:
        bad.append(FieldViolation(field, str(exc)))
        return None
    if parsed.ci_slices not in (None, parsed.gi_slices):
        # The planner places GPU instances; how each is split into compute instances is a
        # per-layout choice it does not make, so say where that choice is written instead.
        bad.append(
            FieldViolation(
                field,
                f"{raw} is a compute-instance profile, but demand counts GPU-instance profiles "
                f"(such as 3g.40gb): ask for {parsed.gi_name} GPU instances here, and set their "
                "split into compute instances per layout in a MIG config (e.g. mig-devices: "
                f"{{{raw}: N}} in a mig-parted file, rolled out with `gpu-agent fleet apply mig`)",
            )
        )
        return None
    return str(parsed)


def _count(raw: object, field: str, bad: list[FieldViolation]) -> int | None:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= MAX_COUNT:
        bad.append(
            FieldViolation(
                field, f"must be an integer >= 0 (at most {MAX_COUNT}), not {brief(raw)}"
            )
        )
        return None
    return raw


def _raise(source: str, bad: Sequence[FieldViolation]) -> None:
    if bad:
        raise InvalidSpec.of(source, bad)


#: A fleet's demand or a week's trace: far more than one node's files, still bounded.
LIMITS = safeyaml.Limits(max_bytes=16 * 1024 * 1024, max_nodes=500_000)
MAX_ROWS = 100_000
#: Devices of one profile a fleet can ask for; more is a typo, not a plan.
MAX_COUNT = 1_000_000


def _load(path: Path) -> str:
    return safeyaml.read_text(path, "file", LIMITS.max_bytes, what="demand file")


def _yaml(text: str, source: str) -> Any:
    return safeyaml.load(text, source, LIMITS)


def _csv_rows(text: str, source: str) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    """Header and rows of a CSV trace, each with the line it ends on (every refusal names a
    row so, blank lines and quoted line breaks counted), at most MAX_ROWS of at most
    MAX_COLUMNS fields of at most MAX_FIELD_CHARS each; csv's own errors (a NUL, a bad quote)
    are refusals too. A record is cut at MAX_RECORD_CHARS before csv splits it: a row of a
    million empty fields, made a dict per row, cost ~26 times the file."""
    lines = _Lines(text, source)
    reader = csv.reader(lines)
    rows: list[tuple[int, dict[str, Any]]] = []
    try:
        header = _bounded(next(reader, []), "header", source)
        # Only the columns a row is read for are kept: a dict of all 32 per row was ~19 times
        # the file; later columns of the same name win, as they did in csv.DictReader's dict.
        kept = {name: i for i, name in enumerate(header) if name in _COLUMNS}
        for row in reader:
            lines.record = 0
            if not row:
                continue  # a blank line, as csv.DictReader skips it
            if len(rows) == MAX_ROWS:
                raise InvalidSpec(
                    f"{source}: more than {MAX_ROWS} rows",
                    [FieldViolation("rows", f"at most {MAX_ROWS}")],
                )
            _bounded(row, f"line {reader.line_num}", source, header)
            rows.append((reader.line_num, {n: row[i] for n, i in kept.items() if i < len(row)}))
    except csv.Error as exc:
        raise InvalidSpec(
            f"{source}: not a valid CSV: {capped(str(exc))}",
            [FieldViolation(f"line {reader.line_num}", capped(str(exc)))],
        ) from None
    return header, rows


#: Columns of a trace's row: the six it reads, and room for a few of the writer's own.
MAX_COLUMNS = 32
_COLUMNS = frozenset({"time", "profile", "count", "model", "priority", "pool"})
#: Characters of one field: a model's name or a pool's selector is far shorter.
MAX_FIELD_CHARS = 4096
#: Characters of one CSV record (its lines, when a quoted field spans several), cut before
#: csv splits it into fields.
MAX_RECORD_CHARS = 64 * 1024


class _Lines:
    """The trace's lines for ``csv.reader``, each read at most to what is left of
    MAX_RECORD_CHARS for the record (the reader sets ``record`` to 0 after each one): a longer
    record is refused naming its line before it is copied or split."""

    def __init__(self, text: str, source: str) -> None:
        self._text = text  # sliced a line at a time: a copy of it all would be 4 bytes a char
        self._at = 0
        self._source = source
        self.record = 0  # characters of the current record read so far
        self._line = 0

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        if self._at >= len(self._text):
            raise StopIteration
        left = MAX_RECORD_CHARS - self.record
        end = self._text.find("\n", self._at, self._at + left)
        self._line += 1
        if end < 0 and len(self._text) - self._at > left:
            field = "header" if self._line == 1 else f"line {self._line}"
            raise InvalidSpec(
                f"{self._source}: {field}: a CSV record longer than {MAX_RECORD_CHARS} characters",
                [FieldViolation(field, f"at most {MAX_RECORD_CHARS} characters")],
            )
        end = len(self._text) if end < 0 else end + 1
        line, self._at = self._text[self._at : end], end
        self.record += len(line)
        return line


def _bounded(row: list[str], where: str, source: str, header: Sequence[str] = ()) -> list[str]:
    """``row``, refused naming ``where`` (and the column) past MAX_COLUMNS or MAX_FIELD_CHARS."""
    if len(row) > MAX_COLUMNS:
        raise InvalidSpec(
            f"{source}: {where}: {len(row)} columns, at most {MAX_COLUMNS}",
            [FieldViolation(where, f"at most {MAX_COLUMNS} columns, not {len(row)}")],
        )
    for i, value in enumerate(row):
        if len(value) > MAX_FIELD_CHARS:
            named = i < len(header) and header[i].isprintable()  # a header is the file's too
            column = capped(header[i], 60) if named else f"column {i + 1}"
            field = f"{where}.{column}"
            raise InvalidSpec(
                f"{source}: {field}: longer than {MAX_FIELD_CHARS} characters",
                [FieldViolation(field, f"at most {MAX_FIELD_CHARS} characters")],
            )
    return row


def load_demand(path: Path) -> Demand:
    return parse_demand(_load(path), str(path))


def parse_demand(text: str, source: str = "<demand>") -> Demand:
    """Parse a demand file; InvalidSpec lists every bad field."""
    doc = _yaml(text, source)
    bad: list[FieldViolation] = []
    if not isinstance(doc, dict):
        raise InvalidSpec(
            f"{source}: expected a mapping with 'version' and 'demand'",
            [FieldViolation("", "expected a mapping with 'version' and 'demand'")],
        )
    if doc.get("version") != VERSION:
        bad.append(FieldViolation("version", f"must be {VERSION}, not {brief(doc.get('version'))}"))
    bad += [
        FieldViolation(str(k), f"unexpected field (allowed: version, demand): {k}")
        for k in doc
        if k not in ("version", "demand")
    ]
    raw = doc.get("demand")
    if isinstance(raw, list):
        entries = _list_entries(raw, bad)
    elif isinstance(raw, dict):
        entries = _entries(raw, bad)
    else:
        bad.append(
            FieldViolation(
                "demand", "must map MIG profile names to counts, or list entries with a profile"
            )
        )
        entries = ()
    _raise(source, bad)
    return Demand(entries)


#: Bounds on what a file may ask: far above any fleet, low enough to keep the planner sane.
MAX_ENTRIES = 1000
MAX_TRACE_ROWS = MAX_ROWS
_ENTRY_KEYS = ("profile", "count", "model", "priority", "pool")


def _list_entries(raw: list[object], bad: list[FieldViolation]) -> tuple[DemandEntry, ...]:
    if len(raw) > MAX_ENTRIES:
        bad.append(FieldViolation("demand", f"at most {MAX_ENTRIES} entries, not {len(raw)}"))
        return ()
    out: list[DemandEntry] = []
    for i, item in enumerate(raw):
        field = f"demand[{i}]"
        if not isinstance(item, dict):
            bad.append(
                FieldViolation(field, "an entry: {profile, count, model?, priority?, pool?}")
            )
            continue
        bad += [
            FieldViolation(f"{field}.{k}", f"unexpected field (allowed: {', '.join(_ENTRY_KEYS)})")
            for k in item
            if k not in _ENTRY_KEYS
        ]
        profile = _profile(item.get("profile"), f"{field}.profile", bad)
        count = _count(item.get("count"), f"{field}.count", bad)
        model = _text(item.get("model"), f"{field}.model", bad)
        pool = _text(item.get("pool"), f"{field}.pool", bad)
        priority = item.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > 10**6:
            bad.append(FieldViolation(f"{field}.priority", f"an integer, not {brief(priority)}"))
            continue
        if profile is not None and count is not None:
            out.append(DemandEntry(profile, count, model, priority, pool))
    seen: set[tuple[str, str | None, int, str | None]] = set()
    for i, e in enumerate(out):
        key = (e.profile, None if e.model is None else model_key(e.model), e.priority, e.pool)
        if key in seen:
            bad.append(
                FieldViolation(
                    f"demand[{i}]", f"{e.label} at priority {e.priority} is listed twice"
                )
            )
        seen.add(key)
    return tuple(out)


def _text(raw: object, field: str, bad: list[FieldViolation]) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip() or len(raw) > 1024:
        bad.append(FieldViolation(field, f"a non-empty string, not {raw!r}"))
        return None
    return raw.strip()


def _entries(raw: Mapping[object, object], bad: list[FieldViolation]) -> tuple[DemandEntry, ...]:
    out: list[DemandEntry] = []
    for key, value in raw.items():
        field = f"demand.{key}"
        profile = _profile(key, field, bad)
        if isinstance(value, dict):
            if not value:
                bad.append(FieldViolation(field, "a per-model mapping needs at least one model"))
            seen: set[str] = set()
            for model, count in value.items():
                sub = f"{field}.{model}"
                if not isinstance(model, str) or not model.strip():
                    bad.append(FieldViolation(sub, "a GPU model name, e.g. NVIDIA H100 80GB HBM3"))
                    continue
                if model_key(model) in seen:
                    bad.append(FieldViolation(sub, "the same model is listed twice"))
                seen.add(model_key(model))
                n = _count(count, sub, bad)
                if profile is not None and n is not None:
                    out.append(DemandEntry(profile, n, model.strip()))
        else:
            n = _count(value, field, bad)
            if profile is not None and n is not None:
                out.append(DemandEntry(profile, n))
    # One profile is either counted for every model or per model: both would count twice.
    both = {e.profile for e in out if e.model is None} & {e.profile for e in out if e.model}
    bad += [
        FieldViolation(f"demand.{p}", "give one count for any model or counts per model, not both")
        for p in sorted(both)
    ]
    names = [e.profile for e in out if e.model is None]
    bad += [
        FieldViolation(f"demand.{p}", "listed twice (e.g. 1g.10gb and 1g.10gb with a CI prefix)")
        for p in sorted({p for p in names if names.count(p) > 1})
    ]
    return tuple(out)


def demand_yaml(demand: Demand, comment: str = "") -> str:
    """``demand`` as a demand file (the list form), which `parse_demand` reads back."""
    entries = []
    for e in demand.entries:
        item: dict[str, object] = {"profile": e.profile, "count": e.count}
        if e.model is not None:
            item["model"] = e.model
        if e.priority:
            item["priority"] = e.priority
        if e.pool is not None:
            item["pool"] = e.pool
        entries.append(item)
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return head + yaml.safe_dump({"version": VERSION, "demand": entries}, sort_keys=False)


# -- traces ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceStep:
    """The demand in force from ``time`` (seconds after the trace's first row) on."""

    time: float
    label: str  # the time as written in the trace
    demand: Demand


def load_trace(path: Path) -> tuple[TraceStep, ...]:
    return parse_trace(_load(path), str(path))


def parse_trace(text: str, source: str = "<trace>") -> tuple[TraceStep, ...]:
    """Parse a CSV (or YAML list) trace into cumulative demand steps, in time order."""
    stripped = text.lstrip()
    rows: list[tuple[str, Mapping[str, object]]]
    if stripped.startswith(("-", "[")):
        doc = _yaml(text, source)
        if not isinstance(doc, list) or not all(isinstance(r, dict) for r in doc):
            raise InvalidSpec(
                f"{source}: expected a list of rows with time, profile, count",
                [FieldViolation("", "expected a list of mappings")],
            )
        rows = [(f"[{i}]", r) for i, r in enumerate(doc)]
    else:
        header, csv_rows = _csv_rows(text, source)
        missing = [c for c in ("time", "profile", "count") if c not in header]
        if missing:
            raise InvalidSpec(
                f"{source}: the CSV header must name time, profile, count (and optionally "
                f"model); missing columns: {', '.join(missing)}",
                [FieldViolation("header", f"missing columns: {', '.join(missing)}")],
            )
        rows = [(f"line {n}", r) for n, r in csv_rows]
    if len(rows) > MAX_TRACE_ROWS:
        raise InvalidSpec(
            f"{source}: at most {MAX_TRACE_ROWS} rows, not {len(rows)}",
            [FieldViolation("rows", f"at most {MAX_TRACE_ROWS}")],
        )
    bad: list[FieldViolation] = []
    parsed: list[tuple[float, str, DemandEntry]] = []
    for where, row in rows:
        time = _time(row.get("time"), f"{where}.time", bad)
        profile = _profile(row.get("profile"), f"{where}.profile", bad)
        count = _count(_int(row.get("count")), f"{where}.count", bad)
        model = _opt_str(row.get("model") or None)
        pool = _opt_str(row.get("pool") or None)
        priority = _int(row.get("priority") or 0)
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > 10**6:
            bad.append(FieldViolation(f"{where}.priority", f"an integer, not {brief(priority)}"))
            continue
        if time is not None and profile is not None and count is not None:
            parsed.append((time[0], time[1], DemandEntry(profile, count, model, priority, pool)))
    if not parsed and not bad:
        bad.append(FieldViolation("", "the trace has no rows"))
    _raise(source, bad)
    return _steps(parsed)


def _steps(rows: Sequence[tuple[float, str, DemandEntry]]) -> tuple[TraceStep, ...]:
    first = min(t for t, _, _ in rows)
    level: dict[tuple[str, str | None, int, str | None], DemandEntry] = {}
    steps: list[TraceStep] = []
    for t, label, entry in sorted(rows, key=lambda r: r[0]):
        model = None if entry.model is None else model_key(entry.model)
        level[(entry.profile, model, entry.priority, entry.pool)] = entry
        demand = Demand(tuple(level.values()))
        if steps and steps[-1].time == t - first:
            steps[-1] = TraceStep(t - first, steps[-1].label, demand)
        else:
            steps.append(TraceStep(t - first, label, demand))
    return tuple(steps)


def _int(raw: object) -> object:
    if isinstance(raw, str):
        text = raw.strip()
        if len(text) > 20:  # int() of thousands of digits is slow, then refused anyway
            return raw
        try:
            return int(text)
        except ValueError:
            return raw
    return raw


def _opt_str(raw: object) -> str | None:
    return str(raw).strip() or None if raw is not None else None


def _time(raw: object, field: str, bad: list[FieldViolation]) -> tuple[float, str] | None:
    """Seconds (finite: nan and inf order no step) or an ISO-8601 time."""
    if isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw):
        return float(raw), str(raw)
    if isinstance(raw, datetime):
        return raw.timestamp(), raw.isoformat()
    if isinstance(raw, str) and raw.strip():
        text = raw.strip()
        try:
            if math.isfinite(seconds := float(text)):
                return seconds, text
        except ValueError:
            pass
        try:
            return datetime.fromisoformat(text).timestamp(), text
        except ValueError:
            pass
    bad.append(FieldViolation(field, f"seconds or an ISO-8601 time, not {brief(raw)}"))
    return None
