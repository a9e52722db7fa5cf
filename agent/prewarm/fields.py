"""What a prewarm request's field says to its readers, kept on the field itself.

A kind's request is a frozen dataclass whose fields are declared with `arg`: the field's
type (its annotation) and this metadata are all the target schema (agent/prewarm/target.py),
the CLI's ``prewarm <kind>`` command and the fleet CLI's options need, so none of them names
a kind or a field by hand.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

_KEY = "prewarm"

#: The ``fleet prewarm`` help of the fields kinds share. One option serves every kind that has
#: the field, so its help is said once here and a kind gives none: a kind's own text would win
#: or lose by the order the kinds register in.
SHARED_FLEET_HELP: dict[str, str] = {
    "name": "Item name (the node label's name).",
    "pin": "Never evict it.",
    "header_files": "A header whose value each node reads from a file (a mounted secret).",
}


@dataclass(frozen=True, slots=True)
class Arg:
    """``help``: the ``prewarm <kind>`` option's help; ``fleet``: the ``fleet prewarm``
    option's (default: ``help``); ``metavar``: how the CLIs show its value; ``source``: the
    field that names what to warm (the command's argument; one per request); ``manifest``: how
    a manifest (and the fleet CLI, for the source) spells it when not by its name."""

    help: str = ""
    fleet: str = ""
    metavar: str | None = None
    source: bool = False
    manifest: str | None = None


def arg(help: str = "", *, default: Any = dataclasses.MISSING, **described: Any) -> Any:
    """A request field with its `Arg` (``help`` and the keywords ``fleet``, ``metavar``,
    ``source``, ``manifest``); a mapping default is copied per request."""
    meta = {_KEY: Arg(help, **described)}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=dict, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def arg_of(f: dataclasses.Field[Any]) -> Arg:
    """A field's `Arg` (an empty one for a field declared without `arg`)."""
    return f.metadata.get(_KEY, Arg())
