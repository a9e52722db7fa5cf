"""The click options of a prewarm kind's request fields, for ``prewarm <kind>`` and
``fleet prewarm``, made from the kinds' target schemas (agent/prewarm/target.py): a field's
type says how it is taken (a flag, repeated, a range, a choice), its `Arg` what the help says.
No kind or field is named here, so a new kind's fields reach both CLIs as they are declared.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import click

from agent.prewarm.model import PullPolicy
from agent.prewarm.target import Field, FieldType, TargetSchema

F = TypeVar("F", bound=Callable[..., Any])


def option_name(field: Field, fleet: bool) -> str:
    """``--runtime-handler``; a header mapping is ``--header`` (``--header-file`` in the fleet:
    each node reads the file)."""
    if field.type is FieldType.HEADERS:
        return "--header-file" if fleet else "--header"
    return "--" + field.name.replace("_", "-")


def option(field: Field, fleet: bool) -> Callable[[F], F]:
    """The click option of one request field. Locally it shows the request's default; in the
    fleet every option defaults to unset, so the options given say which kind is asked for."""
    attrs: dict[str, Any] = {"help": (fleet and field.arg.fleet) or field.arg.help}
    if field.arg.metavar:
        attrs["metavar"] = field.arg.metavar
    kind = field.type
    if kind is FieldType.FLAG:
        attrs["is_flag"] = True
    elif kind is FieldType.GLOBS:
        attrs["multiple"] = True
    elif kind is FieldType.HEADERS:
        attrs.update(multiple=True, metavar="HEADER=PATH" if fleet else "NAME=FILE")
    elif kind is FieldType.HOURS:
        attrs["type"] = click.FloatRange(min=0, min_open=True)
    elif kind is FieldType.PULL_POLICY:
        attrs["type"] = click.Choice([p.value for p in PullPolicy])
    shown = field.default not in (None, False, (), {}, dataclasses.MISSING)
    if not fleet and shown:
        default = field.default
        attrs.update(default=default.value if isinstance(default, enum.Enum) else default)
        attrs["show_default"] = True
    return click.option(option_name(field, fleet), field.name, **attrs)


def options(fields: Iterable[Field], fleet: bool) -> Callable[[F], F]:
    """A decorator adding the options of ``fields``, in their order."""
    made = [option(f, fleet) for f in fields]

    def add(f: F) -> F:
        for decorate in reversed(made):  # click lists a command's options top-down
            f = decorate(f)
        return f

    return add


def values(
    schema: TargetSchema, given: Mapping[str, Any], refuse: Callable[[str], Exception]
) -> dict[str, Any]:
    """The options given for ``schema``'s fields as its values by API name (absent: unset);
    ``refuse(spec)`` is raised for a header that is not ``NAME=FILE``."""
    out = {name: given.get(name) for name in schema.fields}
    for name, kind in schema.fields.items():
        if kind is FieldType.HEADERS:
            pairs = [spec.partition("=") for spec in out[name] or ()]
            bad = [k + s + v for k, s, v in pairs if not (k and s and v)]
            if bad:
                raise refuse(bad[0])
            out[name] = {k: v for k, _, v in pairs}
        elif kind is FieldType.GLOBS:
            out[name] = list(out[name] or ())
    return out
