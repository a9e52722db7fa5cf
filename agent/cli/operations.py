"""``gpu-agent operations``: the agent's long work (MIG applies and restores, prewarms) as the
operations it keeps: list them, show one, follow one to its end, cancel one.

A ``mig apply`` or ``prewarm`` that Ctrl-C detached from goes on in the running agent; these
commands find it again (OperationsService: ListOperations, GetOperation, WatchOperation,
CancelOperation), through the node's agent like every command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from agent.cli.context import CliContext
from agent.cli.errors import AgentGroup, report
from agent.cli.mig import PENDING_EXIT
from agent.cli.options import choice_option
from agent.cli.render import emit, format_table, output_option, plain
from agent.wire.operations import OPERATION_PREFIX

if TYPE_CHECKING:
    from agent.wire.operations import OperationView

#: the kinds of operation the agent runs (agent/api/operations.py)
KINDS = ("mig.apply", "prewarm")


def _name(name: str) -> str:
    """``operations/ID``, or the bare ID as the user may paste it."""
    return name if name.startswith(OPERATION_PREFIX) else OPERATION_PREFIX + name


def record(op: OperationView) -> dict[str, Any]:
    """An operation for people and scripts: what it is, where it stands, how it ended."""
    error = None
    if op.error is not None or op.error_message:
        error = {"reason": op.error_reason, "message": op.error_message}
    result: Any = None
    if op.mig_result is not None:
        result = plain(op.mig_result)
    elif op.prewarm_result:
        result = [plain(item) for item in op.prewarm_result]
    return {
        "name": op.name,
        "kind": op.kind,
        "state": op.state,
        "done": op.done,
        "progress": op.progress,
        "error": error,
        "result": result,
    }


def _rows_table(records: list[dict[str, Any]]) -> str:
    if not records:
        return "no operation"
    rows = [
        [
            r["name"],
            r["kind"],
            r["state"],
            r["progress"],
            (r["error"] or {}).get("message") or None,
        ]
        for r in records
    ]
    return format_table(["NAME", "KIND", "STATE", "PROGRESS", "ERROR"], rows)


def _one_table(r: dict[str, Any]) -> str:
    lines = [
        f"Name:      {r['name']}",
        f"Kind:      {r['kind']}",
        f"State:     {r['state']}",
        f"Progress:  {r['progress']}",
    ]
    if r["error"]:
        lines.append(f"Error:     {r['error']['reason']}: {r['error']['message']}")
    return "\n".join(lines)


@click.group("operations", cls=AgentGroup)
def operations() -> None:
    """The agent's long work (MIG applies and restores, prewarms): list, show, wait, cancel.

    \b
    Example:
      gpu-agent operations list
      gpu-agent operations wait operations/8f3226449f574064ac25b2b83fdc5975
    """


@operations.command("list", short_help="The operations not done yet (--all: the latest 100).")
@click.option("--all", "show_all", is_flag=True, help="Also those done: the newest 100.")
@choice_option("--kind", choices=KINDS, help="Only operations of this kind.")
@output_option
@click.pass_obj
def list_command(obj: CliContext, show_all: bool, kind: str | None, output: str) -> None:
    """The agent's operations not done yet, newest first; with --all, done ones too (the
    newest 100 the agent keeps).

    \b
    Example:
      gpu-agent operations list --all --kind mig.apply -o json
    """
    ops = obj.agent().list_operations(kind or "", None if show_all else False)
    emit([record(op) for op in ops], output, _rows_table)


@operations.command("show", short_help="One operation: its state, progress and error.")
@click.argument("name")
@output_option
@click.pass_obj
def show_command(obj: CliContext, name: str, output: str) -> None:
    """One operation (NAME: operations/ID, or ID) as it stands now; -o json/yaml adds what it
    did once it succeeded.

    \b
    Example:
      gpu-agent operations show operations/8f3226449f574064ac25b2b83fdc5975
    """
    emit(record(obj.agent().get_operation(_name(name))), output, _one_table)


@operations.command("wait", short_help="Follow an operation to its end; exit as it ended.")
@click.argument("name")
@output_option
@click.pass_obj
def wait_command(obj: CliContext, name: str, output: str) -> None:
    """Follow one operation to its end, its progress on stderr as it changes, then show it.
    Exits 0 when it succeeded, and with its error's exit code when it failed or was cancelled
    (docs/api.md, "Exit codes"); a MIG apply that left a mode change pending exits 14, one
    that left a GPU it selects lost 1, as `mig apply` does. Ctrl-C stops waiting; the
    operation goes on.

    \b
    Example:
      gpu-agent operations wait operations/8f3226449f574064ac25b2b83fdc5975
    """
    client = obj.agent()
    op = client.get_operation(_name(name))
    said = ""
    try:
        for update in client.watch_operation(op.name):
            op = update
            if not op.done and op.progress != said:
                said = op.progress
                click.echo(f"{op.name}: {op.state}: {said}", err=True)
    except KeyboardInterrupt:
        click.echo(f"stopped waiting for {op.name}; the agent carries on with it", err=True)
        raise SystemExit(130) from None
    emit(record(op), output, _one_table)
    if op.error is not None and op.mig_result is not None:
        # An apply that left a GPU's mode pending or a GPU lost: exit as `mig apply` does.
        pending = any(g.status == "pending" for g in op.mig_result.gpus)
        report(op.error)
        raise SystemExit(PENDING_EXIT if pending else 1)
    if op.error is not None:
        raise op.error


@operations.command("cancel", short_help="Cancel an operation (a MIG change is rolled back).")
@click.argument("name")
@output_option
@click.pass_obj
def cancel_command(obj: CliContext, name: str, output: str) -> None:
    """Ask the agent to cancel one operation: a MIG apply stops before its next change and rolls
    back every GPU it touched; a prewarm cancels its items. Prints the operation as it stands
    after the request (`operations wait` follows it to its end).

    \b
    Example:
      gpu-agent operations cancel operations/8f3226449f574064ac25b2b83fdc5975
    """
    emit(record(obj.agent().cancel_operation(_name(name))), output, _one_table)
