"""How the CLI reports domain errors: one clear line (plus one per bad field) and an exit code."""

from __future__ import annotations

from typing import Any

import click

from agent.errors import AgentError
from agent.logs import escape_lines


def report(exc: AgentError) -> None:
    """Each problem once: a field the headline already names with its problem is not listed
    again. What the
    user typed or a file held reaches the terminal escaped (``\x1b``, never the byte), as in
    the logs; the line breaks the message is laid out in stay."""
    message = escape_lines(str(exc))
    click.echo(f"error: {message}", err=True)
    for violation in getattr(exc, "violations", ()):
        line = escape_lines(str(violation))
        said = escape_lines(violation.description) in message
        if line not in message and not (said and escape_lines(violation.field) in message):
            click.echo(f"  {line}", err=True)


class AgentGroup(click.Group):
    """A command group that turns AgentError into :func:`report` and the error's exit code.

    Every group uses it, so a group invoked on its own (tests, plugins) behaves like the full CLI.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AgentError as exc:
            report(exc)
            ctx.exit(exc.exit_code)
