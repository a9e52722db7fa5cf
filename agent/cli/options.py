"""Option factories for the shapes the CLI's commands take again and again: a file to read or
write, a number within a range. Each command still writes its own flag and help."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

FILE = click.Path(path_type=Path, dir_okay=False)
"""A file's path (never a directory), given to the command as a ``Path``."""


def file_option(*decls: str, help: str, **attrs: Any) -> Callable[[F], F]:
    """A file option, unset (None) unless given or ``attrs`` say otherwise."""
    if not attrs.get("required"):
        attrs.setdefault("default", None)
    return click.option(*decls, type=FILE, help=help, **attrs)


def float_option(
    *decls: str, low: float, high: float | None = None, default: float | None, help: str
) -> Callable[[F], F]:
    """A number in [low, high]; --help shows the default where there is one."""
    return click.option(
        *decls,
        type=click.FloatRange(min=low, max=high),
        default=default,
        show_default=default is not None,
        help=help,
    )
