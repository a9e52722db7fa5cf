"""How the CLI reports domain errors: one clear line (plus one per bad field) and an exit code."""

from __future__ import annotations

from typing import Any

import click

from agent.errors import AgentError


def report(exc: AgentError) -> None:
    """Each problem once: a field the headline already names is not listed again."""
    message = str(exc)
    click.echo(f"error: {message}", err=True)
    for violation in getattr(exc, "violations", ()):
        line = str(violation)
        if line not in message:
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
