"""CLI rendering: one data value, as a table for people or as JSON/YAML for scripts."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml

F = TypeVar("F", bound=Callable[..., Any])

OUTPUT_FORMATS = ("table", "json", "yaml")


def output_option(fn: F) -> F:
    """The ``--output/-o table|json|yaml`` option every command that prints data takes."""
    return click.option(
        "--output",
        "-o",
        type=click.Choice(OUTPUT_FORMATS),
        default="table",
        show_default=True,
        help="table for people; json or yaml for scripts.",
    )(fn)


def plain(value: Any) -> Any:
    """Turn records (dataclasses, enums, paths, tuples) into JSON-able data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def emit(data: Any, output: str, table: Callable[[Any], str] | None = None) -> None:
    """Print ``data`` in the chosen format; ``table`` renders the human view."""
    if output == "json":
        click.echo(json.dumps(plain(data), indent=2, sort_keys=False))
    elif output == "yaml":
        click.echo(yaml.safe_dump(plain(data), sort_keys=False).rstrip())
    elif table is not None:
        click.echo(table(data))
    else:
        click.echo(yaml.safe_dump(plain(data), sort_keys=False).rstrip())


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table (no borders, so it pastes into tickets)."""
    cells = [[str(h) for h in headers]] + [
        ["-" if c is None else str(c) for c in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit in ("B", "KiB") else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
