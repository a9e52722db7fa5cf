"""dcgm-exporter counters CSV: which fields to export (``--collectors FILE``).

Same format as dcgm-exporter (reference/telemetry.md §1.1): one
``DCGM field, Prometheus type, help`` row per line, ``#`` starts a comment, blank lines ignored.
Quoting is dcgm-exporter's (Go's encoding/csv): a quoted column opens right after its comma, so
``,"a, b"`` is one column and a ``"`` anywhere else, a blank beside it included, is refused, as
dcgm-exporter refuses it. A quoted column must close on its line (dcgm-exporter reads on).
Whitespace around columns and comments, lines of blanks and the case of the type are forgiven
(docs/metrics.md).
Everything wrong in a file is reported at once, each problem with its line and the allowed values.

Every name DCGM knows is accepted (``dcgm.catalog``: DCGM's current names, its deprecated ones
and dcgm-exporter's 1.x names). A field the agent serves (``dcgm.fields``) is exported; any other
is listed in ``CounterSet.unserved`` with the reason, logged once and exposed as
``gpu_agent_dcgm_field_unserved``, as dcgm-exporter goes on without the fields a GPU does not
report. A name DCGM does not know stops the start, as it stops dcgm-exporter's.

Types of served fields are checked against the catalog: ``label`` only for string fields and
only ``label`` for them; ``histogram`` / ``summary`` never apply to a single-valued field (the
family dcgm-exporter writes for them is not a valid histogram or summary). Under DCGM names a
field is exported with the type its row declares, counter or gauge, as dcgm-exporter does, even
where that is not what the field is (``Counter.mistyped``: NVLink bandwidth declared counter is
a rate).

Every row of dcgm-exporter's shipped CSVs is accepted, their commented rows too: the
``DCGM_EXP_*`` rows, label fields and the 1.x names (``dcgm_sm_clock``...), which are exported
under the name the row uses. A field listed twice (the 1.x CSV lists its PCIe bytes twice) is
taken once, with a note (``CounterSet.notes``). dcgm-exporter never checks the type of its
own ``DCGM_EXP_*`` rows, so a type there that is neither gauge nor counter is noted and the
field's own type exported. A bad file's error lists each problem once, in
its violations (tests/unit/telemetry/test_dcgm_counters.py).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from agent.errors import FieldViolation, InvalidSpec
from dcgm.catalog import DcgmField, catalogue, unserved_reason
from dcgm.fields import Field, Kind, close_matches, lookup

__all__ = [
    "DEFAULT_COUNTERS",
    "Counter",
    "CounterSet",
    "Unserved",
    "load_counters",
    "parse_counters",
]

#: The counters CSV used when none is given (dcgm-exporter's defaults plus all DCP pipes).
DEFAULT_COUNTERS = "default-counters.csv"

#: Bounds on a counters CSV: the catalog has a few hundred fields, so a real file is far smaller.
MAX_BYTES = 1024 * 1024
MAX_ROWS = 2000
MAX_LINE = 4096

_TYPES = ("gauge", "counter", "label")
_DISTRIBUTIONS = ("histogram", "summary")
#: the Prometheus types dcgm-exporter's parser accepts (its promMetricType)
_EXPORTER_TYPES = (*_TYPES, *_DISTRIBUTIONS)
#: dcgm-exporter's own fields: it takes their rows without looking at the type column
_EXPORTER_FIELDS = "DCGM_EXP_"
#: a line as Go's encoding/csv reads it: a column is quoted from its first character ("" inside)
#: or holds no quote at all
_GO_COLUMN = r'(?:"(?:[^"]|"")*"|[^",]*)'
_GO_LINE = re.compile(rf"{_GO_COLUMN}(?:,{_GO_COLUMN})*")
#: a line whose last column opens a quote it does not close: Go reads on into the next line
_GO_OPEN_QUOTE = re.compile(rf'(?:{_GO_COLUMN},)*"(?:[^"]|"")*')
_BAD_QUOTE = (
    "a quote must open its column right after the comma or at the line's start and close it right "
    'before the next comma or at the line\'s end, with no space between; write "" for a quote '
    "inside (dcgm-exporter refuses this line too)"
)
_UNCLOSED_QUOTE = (
    "a quoted column must close on its own line: one row per line (dcgm-exporter reads on to the "
    "closing quote and writes the line break into its # HELP, leaving a line that is neither a "
    "comment nor a sample)"
)


@dataclass(frozen=True, slots=True)
class Counter:
    """One selected field and how the CSV declared it."""

    field: Field
    #: the type column as written (lower-cased)
    declared: str
    help: str
    line: int
    #: the field name as the row writes it: the DCGM name, or a 1.x name (the series' name)
    written: str = ""

    @property
    def name(self) -> str:
        """The series name under dcgm naming."""
        return self.written or self.field.name

    @property
    def exported_kind(self) -> Kind:
        """The type under DCGM names: the one the row declares."""
        return Kind(self.declared)

    @property
    def mistyped(self) -> bool:
        """Declared counter or gauge, but the field is the other (exported as declared)."""
        return self.field.kind is not Kind.LABEL and self.field.kind is not self.exported_kind


@dataclass(frozen=True, slots=True)
class Unserved:
    """A selected field DCGM knows that the agent does not serve: no series, a reason."""

    #: the name as the row writes it
    name: str
    field: DcgmField
    line: int
    reason: str


@dataclass(frozen=True, slots=True)
class CounterSet:
    counters: tuple[Counter, ...]
    #: where it was read from, for logs and errors
    source: str
    #: rows accepted with a remark (a repeated field), for the log
    notes: tuple[str, ...] = ()
    #: selected fields the agent does not serve, each with its reason
    unserved: tuple[Unserved, ...] = ()

    @property
    def values(self) -> tuple[Counter, ...]:
        """Fields exported as samples."""
        return tuple(c for c in self.counters if c.field.kind is not Kind.LABEL)

    @property
    def labels(self) -> tuple[Counter, ...]:
        """Fields exported as labels (dcgm names) or info-metric labels (native names)."""
        return tuple(c for c in self.counters if c.field.kind is Kind.LABEL)


def _capped(text: str, limit: int | None = None) -> str:
    """agent.safeyaml's ``capped``, imported on a problem only: reading counters needs no YAML."""
    from agent.safeyaml import MAX_MESSAGE
    from agent.safeyaml import capped as cut

    return cut(text, MAX_MESSAGE if limit is None else limit)


def load_counters(path: Path | None = None) -> CounterSet:
    """Read a counters CSV; ``None`` means the shipped default."""
    if path is None:
        text = resources.files("dcgm").joinpath(DEFAULT_COUNTERS).read_text(encoding="utf-8")
        return parse_counters(text, source=f"dcgm/{DEFAULT_COUNTERS}")
    from agent.safeyaml import read_text  # YAML's stack only for a counters file

    text = read_text(path, "telemetry.collectors", MAX_BYTES, what="counters CSV")
    return parse_counters(text, source=str(path))


def parse_counters(text: str, source: str = "<counters>") -> CounterSet:
    """Parse counters-CSV text; raises InvalidSpec naming every bad line."""
    counters: list[Counter] = []
    unserved: list[Unserved] = []
    problems: list[FieldViolation] = []
    notes: list[str] = []
    seen: dict[int, int] = {}
    if len(text) > MAX_BYTES:
        raise InvalidSpec(
            f"invalid counters CSV {source}: larger than {MAX_BYTES} bytes",
            [FieldViolation(source, f"at most {MAX_BYTES} bytes")],
        )
    for line, columns in _rows(text, source):
        where = f"{source}:{line}"
        if isinstance(columns, str):
            problems.append(FieldViolation(where, columns))
            continue
        if len(columns) != 3:
            problems.append(
                FieldViolation(
                    where,
                    f"expected 3 comma-separated columns (DCGM field, type, help), "
                    f"got {len(columns)}: {_capped(','.join(columns), 80)!r}",
                )
            )
            continue
        name, declared, help_text = columns[0], columns[1].lower(), columns[2]
        field = lookup(name)
        known = catalogue().lookup(name) if field is None else None
        if field is None and known is None:
            problems.append(FieldViolation(where, _unknown(name)))
            continue
        if field is not None and name.startswith(_EXPORTER_FIELDS) and declared not in _TYPES[:2]:
            notes.append(
                f"{where}: dcgm-exporter ignores the type of its own field {name}; "
                f"{_capped(declared, 40)!r} exported as {field.kind.value}"
            )
            declared = field.kind.value
        problem = (
            _type_problem(field, declared) if field is not None else _exporter_type(name, declared)
        )
        if problem:
            problems.append(FieldViolation(where, problem))
            continue
        fid = field.id if field is not None else known.id if known is not None else -1
        if fid in seen:
            notes.append(f"{where}: {name} is already listed on line {seen[fid]}; ignored")
            continue
        seen[fid] = line
        if known is not None:
            unserved.append(Unserved(name, known, line, unserved_reason(known)))
        elif field is not None:
            written = name if name != field.name else ""
            counters.append(Counter(field, declared, help_text or field.help, line, written))
    if not problems and not counters and not unserved:
        problems.append(FieldViolation(source, "selects no fields: every line is a comment"))
    if problems:
        # The violations carry the details; the CLI and the log print each of them once.
        plural = "s" if len(problems) > 1 else ""
        raise InvalidSpec(
            f"invalid counters CSV {source} ({len(problems)} problem{plural})", problems
        )
    return CounterSet(tuple(counters), source, tuple(notes), tuple(unserved))


def _rows(text: str, source: str) -> Iterator[tuple[int, list[str] | str]]:
    """(1-based line number, trimmed columns or the line's quoting problem) of every non-blank,
    non-comment line; at most MAX_ROWS of them, each at most MAX_LINE characters."""
    rows = 0
    lines = text.splitlines()
    continued_to = 0  # the last line of a quoted column an earlier line opened (reported there)
    for number, raw in enumerate(lines, start=1):
        if number <= continued_to:
            continue
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{source}:{number}"
        rows += 1
        if rows > MAX_ROWS:
            raise InvalidSpec(
                f"invalid counters CSV {source}: more than {MAX_ROWS} rows",
                [FieldViolation(where, f"at most {MAX_ROWS} rows")],
            )
        if len(stripped) > MAX_LINE:
            raise InvalidSpec(
                f"invalid counters CSV {where}: a line longer than {MAX_LINE} characters",
                [FieldViolation(where, f"at most {MAX_LINE} characters")],
            )
        # the line as written: Go takes a blank beside a quote as part of the column
        if _GO_OPEN_QUOTE.fullmatch(raw):
            continued_to = _closing_line(lines, number)
            yield number, _UNCLOSED_QUOTE if continued_to else _BAD_QUOTE
            continue
        if not _GO_LINE.fullmatch(raw):
            yield number, _BAD_QUOTE
            continue
        try:
            columns = next(csv.reader(io.StringIO(stripped)))
        except csv.Error as exc:  # e.g. a NUL byte
            raise InvalidSpec(
                f"invalid counters CSV {where}: {_capped(str(exc))}",
                [FieldViolation(where, _capped(str(exc)))],
            ) from None
        yield number, [c.strip() for c in columns]


def _closing_line(lines: list[str], opened: int) -> int:
    """The line after ``opened`` (1-based) that closes the quote left open on it, 0 if none:
    inside a quoted column an odd count of quotes closes it (a doubled one is a quote)."""
    following = enumerate(lines[opened:], start=opened + 1)
    return next((number for number, line in following if line.count('"') % 2), 0)


def _unknown(name: str) -> str:
    """A name neither DCGM nor dcgm-exporter knows: dcgm-exporter stops on it, and so do we."""
    guesses = close_matches(name)
    hint = f"; did you mean {' or '.join(guesses)}?" if guesses else ""
    what = "dcgm-exporter field" if name.startswith("DCGM_EXP_") else "DCGM field"
    return (
        f"unknown {what} {name!r}{hint} (DCGM's fields: dcgm/dcgm-catalog.tsv; "
        "served: docs/metrics.md)"
    )


def _exporter_type(name: str, declared: str) -> str | None:
    if declared not in _EXPORTER_TYPES:
        return f"unknown type {declared!r} for {name}; allowed: {', '.join(_TYPES)}"
    return None


def _type_problem(field: Field, declared: str) -> str | None:
    if declared in _DISTRIBUTIONS:
        return f"{field.name} is one value per sample; type {declared} does not apply (use gauge)"
    if declared not in _TYPES:
        return f"unknown type {declared!r} for {field.name}; allowed: {', '.join(_TYPES)}"
    if field.kind is Kind.LABEL and declared != "label":
        return f"{field.name} is a string: its type must be label"
    if field.kind is not Kind.LABEL and declared == "label":
        return f"{field.name} is numeric: use {field.kind.value}, not label"
    return None
