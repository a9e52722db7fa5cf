"""The one schema of a prewarm target: what a manifest entry, an API target (and so a
coordinator desired file's entry) or a CLI command says to warm, per kind, derived from the
kind's request dataclass.

Each kind's `Source` declares ``schema = TargetSchema("<kind>", <its request dataclass>)``.
The request's fields, declared with `arg` (agent/prewarm/fields.py), are the target's fields
by their API name (the field of its message in prewarm.proto): each field's annotation gives
its `FieldType`, whose rule and refusal are written once here, and its `Arg` the help, the
manifest spelling and which field names what to warm. Checked values become the request
(`build`) and back (`values`) generically. The manifest parser, the API's conversion
(agent/wire/prewarm.py), the desired file (agent/coordinator/control/desired.py), the CLI's
``prewarm <kind>`` commands and the fleet CLI's options all go through the registered schemas.
The schema knows no message: that is agent/wire/prewarm.py's.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import FieldViolation
from agent.prewarm.fields import Arg, arg, arg_of
from agent.prewarm.model import PullPolicy

__all__ = ["Arg", "Field", "FieldType", "TargetSchema", "arg", "field_type", "unknown_keys"]


class FieldType(enum.Enum):
    """A target field's type: its rule and what a refusal says the field takes. A request
    field's annotation says which (`field_type`): a number (``float``) is a count of hours,
    the only number a target takes today; a kind that needs another adds its type here."""

    TEXT = "a string"
    FLAG = "true or false"
    HOURS = "a number of hours > 0"
    GLOBS = "a list of globs"
    HEADERS = "a mapping header name -> absolute file path on the node"
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
                isinstance(k, str) and isinstance(v, str | Path) and Path(v).is_absolute()
                for k, v in value.items()
            )
        return value == "" or value in {p.value for p in PullPolicy}  # "": the default


def field_type(annotation: Any) -> FieldType:
    """A request field's `FieldType`, from its annotation (``str | None`` is TEXT...)."""
    if isinstance(annotation, types.UnionType):  # X | None: an optional X
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation) or annotation
    for python, kind in _TYPES:
        if isinstance(origin, type) and issubclass(origin, python):
            return kind
    raise TypeError(f"a prewarm request field cannot be a {annotation!r}")


#: Python type -> FieldType, the first that matches (bool before the numbers it is one of).
_TYPES: tuple[tuple[type, FieldType], ...] = (
    (bool, FieldType.FLAG),
    (PullPolicy, FieldType.PULL_POLICY),
    (str, FieldType.TEXT),
    (float, FieldType.HOURS),
    (Mapping, FieldType.HEADERS),
    (Sequence, FieldType.GLOBS),
)


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a target: its API name, type, `Arg` and the request's default (MISSING:
    required, the source)."""

    name: str
    type: FieldType
    arg: Arg
    default: Any

    def to_request(self, value: Any) -> Any:
        """A checked value as the request holds it; absent or empty: the default."""
        if self.type is FieldType.FLAG:
            return bool(value)
        if self.type is FieldType.HEADERS:
            return {k: Path(v) for k, v in (value or {}).items()}
        if self.type is FieldType.GLOBS:
            return tuple(value or ())
        if value is None or value == "":
            return "" if self.default is dataclasses.MISSING else self.default
        if self.type is FieldType.PULL_POLICY:
            return PullPolicy(value)
        return float(value) if self.type is FieldType.HOURS else value

    def from_request(self, value: Any) -> Any:
        """`to_request` inverted: what a manifest or an API message says."""
        if self.type is FieldType.HEADERS:
            return {k: str(v) for k, v in value.items()}
        if self.type is FieldType.GLOBS:
            return list(value)
        return value.value if isinstance(value, enum.Enum) else value


def _fields(request_type: type) -> tuple[Field, ...]:
    hints = typing.get_type_hints(request_type)
    return tuple(
        Field(f.name, field_type(hints[f.name]), arg_of(f), _default(f))
        for f in dataclasses.fields(request_type)
    )


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default if f.default_factory is dataclasses.MISSING else f.default_factory()


@dataclass(frozen=True)
class TargetSchema:
    """One kind's target. ``kind`` is the field of prewarm.proto's PrewarmTarget that holds
    it (file, image, model) and the CLI's ``prewarm <kind>`` command; ``request_type`` the
    kind's request dataclass, whose fields (in the order a refusal and the CLI list them) are
    the target's; ``summary`` the command's help; ``plural`` how lists of it are named (a
    desired file's ``files:``; default ``<kind>s``)."""

    kind: str
    request_type: type
    summary: str = ""
    plural: str = ""

    def __post_init__(self) -> None:
        if not self.plural:
            object.__setattr__(self, "plural", f"{self.kind}s")

    @functools.cached_property
    def by_name(self) -> dict[str, Field]:
        """The target's fields by API name."""
        return {f.name: f for f in _fields(self.request_type)}

    @property
    def fields(self) -> dict[str, FieldType]:
        return {name: f.type for name, f in self.by_name.items()}

    @property
    def source(self) -> str:
        """The field that names what to warm."""
        return next(name for name, f in self.by_name.items() if f.arg.source)

    @property
    def manifest_names(self) -> dict[str, str]:
        """How a manifest spells a field when not by its API name (the image's ``image``)."""
        return {n: f.arg.manifest for n, f in self.by_name.items() if f.arg.manifest}

    @property
    def manifest_source(self) -> str:
        """The manifest key that says an entry is of this kind (the fleet CLI's option)."""
        return self.manifest_names.get(self.source, self.source)

    def build(self, values: Mapping[str, Any]) -> Any:
        """The request of checked ``values`` (by API name; absent ones take the default)."""
        fields = self.by_name
        return self.request_type(**{n: f.to_request(values.get(n)) for n, f in fields.items()})

    def values(self, request: Any) -> dict[str, Any]:
        """`build` inverted."""
        return {n: f.from_request(getattr(request, n)) for n, f in self.by_name.items()}

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
            if kind in (FieldType.GLOBS, FieldType.HEADERS) and not value:
                continue  # an empty list or mapping may be left out: the default
            if value is None and (kind is not FieldType.FLAG or key not in entry):
                continue  # absent: the default (a flag given as null is refused)
            if not kind.accepts(value):
                errors.append(FieldViolation(f"{where}.{key}", kind.value))
                found = False
                continue
            values[name] = value
        if not found:
            return None
        return self.build(values)


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
