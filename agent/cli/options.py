"""Option factories for the shapes the CLI's commands take again and again: a file, a number
within a range, one of a few words. Each command still writes its own flag and help."""

from __future__ import annotations

import errno
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from agent import safeyaml
from agent.durable import replace_file
from agent.errors import FieldViolation, InvalidSpec
from agent.mig import MAX_GPU_INDEX

F = TypeVar("F", bound=Callable[..., Any])

FILE = click.Path(path_type=Path, dir_okay=False)
"""A file's path (never a directory), given to the command as a ``Path``."""

GPU_INDEX = click.IntRange(min=0, max=MAX_GPU_INDEX)
"""A GPU's index, 0-255 as everywhere in the API (docs/api.md): a larger one is refused naming
the option (exit 2), never passed on to overflow the request's uint32."""


def read_input(value: str, field: str) -> str:
    """The UTF-8 text of the file ``value`` names, or of stdin for '-'. Missing, unreadable, too
    big or not UTF-8: an InvalidSpec naming ``field`` (exit 2), never a traceback."""
    if value != "-":
        return safeyaml.read_text(Path(value), field)
    data = sys.stdin.buffer.read(safeyaml.DEFAULT.max_bytes + 1)  # bytes: decoded strictly
    return safeyaml.decoded(data, field, safeyaml.DEFAULT.max_bytes, "stdin")


def _as_is(path: Path) -> bool:
    """Whether `write_output` writes to ``path`` as it is (/dev/stdout, a pipe), not through a
    temp file beside it."""
    special = path.is_absolute() and path.parts[1:2] in (("dev",), ("proc",))
    return special or (path.exists() and not path.is_file())


def _unwritable(path: Path, cause: str, field: str) -> InvalidSpec:
    return InvalidSpec(f"cannot write {path}: {cause}", [FieldViolation(field, "a writable path")])


def write_output(path: Path, text: str, field: str) -> None:
    """Write ``text`` to ``path`` (``field``: the option that named it, as the user wrote it).
    A regular file, or a new one, is replaced whole: a temp file beside it, renamed over it, so
    a write that fails (a full disk) leaves the file it replaces as it was, never cut short.
    Anything else (/dev/stdout, /proc/self/fd/N, a pipe) is written to as it is. Any failure:
    an InvalidSpec naming ``field`` (exit 2)."""
    try:
        if _as_is(path):
            path.write_text(text)  # /dev/stdout (whatever it is), a pipe: written as it is
        else:  # a link to a file stays a link: its target is replaced
            replace_file(Path(os.path.realpath(path)), text.encode(), new_mode=0o644)
    except OSError as exc:
        raise _unwritable(path, str(exc.strerror or exc), field) from exc


def refuse_unwritable(outputs: Mapping[str, Path | None]) -> None:
    """Refuse, before any work, an output file (flag -> path; None: not given) that
    `write_output` could not write: its directory missing, not a directory or not writable.
    The InvalidSpec `write_output` would raise at the end, naming the flag."""
    for flag, path in outputs.items():
        if path is None or _as_is(path):
            continue
        where = Path(os.path.realpath(path)).parent
        if not where.is_dir():
            code = errno.ENOENT if not where.exists() else errno.ENOTDIR
        elif not os.access(where, os.W_OK | os.X_OK):
            code = errno.EACCES
        else:
            continue
        raise _unwritable(path, os.strerror(code), flag)


def file_option(*decls: str, help: str, **attrs: Any) -> Callable[[F], F]:
    """A file option, unset (None) unless given or ``attrs`` say otherwise."""
    if not attrs.get("required"):
        attrs.setdefault("default", None)
    return click.option(*decls, type=FILE, help=help, **attrs)


class _Number(click.FloatRange):
    """click's FloatRange, finite: it lets ``nan`` through (no comparison with it is true), and
    ``inf`` through a range bounded on one side."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number: {self._describe_range()}", param, ctx)
        return number


def finite_number(low: float, high: float | None = None, *, low_open: bool = False) -> _Number:
    """The type of a finite number in [low, high] (``low_open``: above low), for an argument;
    an option takes `float_option`."""
    return _Number(min=low, max=high, min_open=low_open)


def float_option(
    *decls: str,
    low: float,
    high: float | None = None,
    low_open: bool = False,
    default: float | None,
    help: str,
) -> Callable[[F], F]:
    """A finite number in [low, high] (``low_open``: above low); --help shows the default where
    there is one."""
    kind = finite_number(low, high, low_open=low_open)
    return click.option(*decls, type=kind, help=help, **_default(default))


def choice_option(
    *decls: str, choices: Sequence[str], default: str | None = None, **attrs: Any
) -> Callable[[F], F]:
    """One of ``choices``; --help shows the default where there is one."""
    return click.option(*decls, type=click.Choice(choices), **_default(default), **attrs)


def _default(default: object) -> dict[str, Any]:
    # An unset default is left to click, which then shows none.
    return {"default": None} if default is None else {"default": default, "show_default": True}


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: spelt alike, a link, a hard link or a bind mount."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False  # one of them does not exist yet


def refuse_overwriting(
    inputs: Mapping[str, Path | None], outputs: Mapping[str, Path | None]
) -> None:
    """Refuse, before anything is read or written, an output file (flag -> path) that is one of
    the command's input files (flag -> path) or another output: writing it would destroy the
    input, or one output the other. None: the flag was not given. InvalidSpec naming the
    output's flag."""
    given = {flag: path for flag, path in inputs.items() if path is not None}
    named = [(flag, path) for flag, path in outputs.items() if path is not None]
    for i, (flag, path) in enumerate(named):
        for in_flag, in_path in given.items():
            if same_file(path, in_path):
                raise InvalidSpec(
                    f"--{flag} {path} is the input --{in_flag} file {in_path}: writing it would "
                    "destroy it; name another file",
                    [FieldViolation(flag, f"a file other than --{in_flag} {in_path}")],
                )
        for other_flag, other in named[i + 1 :]:
            if same_file(path, other):
                raise InvalidSpec(
                    f"--{flag} and --{other_flag} are both {path}: name two files",
                    [FieldViolation(other_flag, f"a file other than --{flag} {path}")],
                )


def refuse_bad_outputs(
    inputs: Mapping[str, Path | None], outputs: Mapping[str, Path | None]
) -> None:
    """`refuse_overwriting`, then `refuse_unwritable`: every output checked before any work."""
    refuse_overwriting(inputs, outputs)
    refuse_unwritable(outputs)
