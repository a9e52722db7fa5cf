"""The process's log output, where no logged value can forge a line or drive a terminal.

Log messages carry text from outside: URLs a caller named, an origin's status line, certificate
SANs, file names. A newline in one of them would start a line that looks like a record of its
own (a forged ``CRITICAL``); an ESC or CR would rewrite what a terminal shows. `SafeFormatter`
escapes every control character (C0, DEL, C1, and the Unicode line and paragraph separators) of
the formatted message, ``\\n`` as ``\\\\n``, so one record is one line. A traceback keeps its own
line breaks, but the exception's message and notes within it are escaped like a message.

`configure` installs it on the root logger; every command calls it (the CLI's entry point at
warning level, ``serve`` and the coordinator at their configured level), so every logger of the
process, whoever wrote it, goes through this one place.
"""

from __future__ import annotations

import copy
import logging
import re
import traceback
from collections.abc import Iterator
from types import TracebackType
from typing import IO

__all__ = ["AGENT_FORMAT", "SafeFormatter", "configure", "escape", "escape_lines"]

AGENT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every control character written as a visible escape (``\\x1b``, ``\\n``)."""
    return _CONTROL.sub(_escaped, text)


def escape_lines(text: str) -> str:
    """Like `escape`, but line breaks stay: for text the program itself laid out in lines."""
    return "\n".join(escape(line) for line in text.split("\n"))


def _escape_chunk(chunk: str) -> str:
    """One chunk of an exception's message or note: escaped whole, its final newline kept."""
    body = chunk.removesuffix("\n")
    return escape(body) + ("\n" if body != chunk else "")


# The lines Python's own traceback puts between chained exceptions.
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def _one(te: traceback.TracebackException) -> Iterator[str]:
    full = list(te.format(chain=False))
    only = list(te.format_exception_only())
    if only and full[-len(only) :] == only:
        yield from (escape_lines(chunk) for chunk in full[: -len(only)])
        yield from (_escape_chunk(chunk) for chunk in only)
    else:  # an exception group lays its members out in its own lines
        yield from (escape_lines(chunk) for chunk in full)


def _traceback(ei: _ExcInfo) -> Iterator[str]:
    """The traceback as `traceback.format_exception` lays it out, chains included."""
    te: traceback.TracebackException | None = traceback.TracebackException(*ei, compact=True)
    chain: list[tuple[traceback.TracebackException, str | None]] = []
    link: str | None = None
    while te is not None:
        chain.append((te, link))
        if te.__cause__ is not None:
            te, link = te.__cause__, _CAUSE
        elif te.__context__ is not None and not te.__suppress_context__:
            te, link = te.__context__, _CONTEXT
        else:
            te = None
    for exc, to_next in reversed(chain):
        yield from _one(exc)
        if to_next is not None:
            yield to_next


class SafeFormatter(logging.Formatter):
    """A `logging.Formatter` whose output has no control character from a logged value."""

    def format(self, record: logging.LogRecord) -> str:
        safe = copy.copy(record)  # other handlers still see the record as it was
        safe.msg = escape(record.getMessage())
        safe.args = None
        safe.exc_text = None  # laid out again by formatException below
        return super().format(safe)

    def formatException(self, ei: object) -> str:
        if not isinstance(ei, tuple) or ei[1] is None:
            return escape_lines(super().formatException(ei))  # type: ignore[arg-type]
        return "".join(_traceback(ei)).removesuffix("\n")

    def formatStack(self, stack_info: str) -> str:
        return escape_lines(stack_info)


def configure(level: int | str, fmt: str = AGENT_FORMAT, stream: IO[str] | None = None) -> None:
    """Send every logger's records at ``level`` and above through `SafeFormatter` to ``stream``
    (stderr by default), replacing the root logger's handlers."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(SafeFormatter(fmt))
    logging.basicConfig(
        level=level.upper() if isinstance(level, str) else level, handlers=[handler], force=True
    )
