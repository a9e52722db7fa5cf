"""The one schema of a prewarm target: what a manifest entry, an API target (and so a
coordinator desired file's entry) says to warm, per kind.

Each kind's `Source` declares its `TargetSchema`: its fields by their API name (the field of
its message in prewarm.proto), each with a type whose rule and refusal are written once
here; the field that names what to warm (``source``) and how a manifest spells it; how
checked values become the kind's request (``build``) and back (``values``). The manifest
parser, the API's conversion (agent/wire/prewarm.py) and the desired file's prewarm part
(agent/coordinator/control/desired.py) all go through the registered schemas, so a new kind is
parsed everywhere by declaring its schema (and, for the API, its message in prewarm.proto).
The schema knows no message: reading one into its values (`message_values`) and the pull
policy's proto numbers are agent/wire/prewarm.py's.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import FieldViolation
from agent.prewarm.model import PullPolicy


class FieldType(enum.Enum):
    """A target field's type: its rule and what a refusal says the field takes."""

    TEXT = "a string"
    FLAG = "true or false"
    HOURS = "a number of hours > 0"
    GLOBS = "a list of globs"
    HEADERS = "a mapping header name -> file path"
    PULL_POLICY = "one of " + ", ".join(p.value for p in PullPolicy)

    def accepts(self, value: Any) -> bool:
        if self is FieldType.TEXT:
            return isinstance(value, str)
        if self is FieldType.FLAG:
            return isinstance(value, bool)
        if self is FieldType.HOURS:
            return not isinstance(value, bool) and isinstance(value, int | float) and value > 0
        if self is FieldType.GLOBS:
            return isinstance(value, list | tuple) and all(isinstance(g, str) for g in value)
        if self is FieldType.HEADERS:
            return isinstance(value, Mapping) and all(
                isinstance(k, str) and isinstance(v, str | Path) for k, v in value.items()
            )
        return value == "" or value in {p.value for p in PullPolicy}  # "": the default


#: What an absent (or null) field reads as, by type.
_EMPTY: dict[FieldType, Any] = {FieldType.FLAG: False, FieldType.GLOBS: [], FieldType.HEADERS: {}}


@dataclass(frozen=True, slots=True)
class TargetSchema:
    """One kind's target. ``kind`` is the field of prewarm.proto's PrewarmTarget that holds
    it (file, image, model), ``plural`` how lists of it are named (a desired file's ``files:``,
    a manifest's wording); ``fields`` are in the order a refusal lists them."""

    kind: str
    plural: str
    source: str
    fields: Mapping[str, FieldType]
    build: Callable[[Mapping[str, Any]], Any]
    values: Callable[[Any], dict[str, Any]]
    #: how a manifest spells a field when not by its API name (the image's ``image``)
    manifest_names: Mapping[str, str] = field(default_factory=dict)

    @property
    def manifest_source(self) -> str:
        """The manifest key that says an entry is of this kind."""
        return self.manifest_names.get(self.source, self.source)

    def parse(
        self,
        entry: Mapping[str, Any],
        where: str,
        errors: list[FieldViolation],
        names: Mapping[str, str] | None = None,
    ) -> Any | None:
        """``entry``'s request, or None with every violation added to ``errors`` at
        ``<where>.<key>``; ``names`` maps API names to the entry's spelling (a manifest's)."""
        spell = dict(names or {})
        keys = {spell.get(k, k): k for k in self.fields}
        found = unknown_keys(entry, tuple(keys), where, errors)
        values: dict[str, Any] = {}
        for key, name in keys.items():
            kind = self.fields[name]
            value = entry.get(key)
            if kind in _EMPTY and kind is not FieldType.FLAG:
                value = value or _EMPTY[kind]  # an empty list or mapping may be left out
            elif value is None and (kind is not FieldType.FLAG or key not in entry):
                values[name] = _EMPTY.get(kind)
                continue
            if not kind.accepts(value):
                errors.append(FieldViolation(f"{where}.{key}", kind.value))
                found = False
                continue
            values[name] = value
        if not found:
            return None
        return self.build(values)


def headers(value: Mapping[str, Any]) -> dict[str, Path]:
    """A HEADERS field's value as the request holds it."""
    return {k: Path(v) for k, v in value.items()}


def unknown_keys(
    entry: Mapping[str, Any], allowed: Sequence[str], where: str, errors: list[FieldViolation]
) -> bool:
    ok = True
    for key in entry:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            path = f"{where}.{key}" if where else str(key)
            errors.append(FieldViolation(path, f"unknown key{hint}; allowed: {', '.join(allowed)}"))
            ok = False
    return ok
