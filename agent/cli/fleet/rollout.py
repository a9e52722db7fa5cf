"""What every rollout command (``fleet apply``, ``prewarm``, ``resume``) shares: its options,
its progress report and its outcome.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from agent.cli.coordinator import (
    FleetOptions,
    lease_option,
    run_with_fleet,
)
from agent.cli.options import (
    choice_option,
    file_option,
    float_option,
    refuse_bad_outputs,
)
from agent.cli.render import emit, format_table
from agent.coordinator.rollout.schedule import NODE_TIMEOUT_MAX_S, parse_max_unavailable
from agent.errors import AgentError

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:  # the coordinator is imported when a command runs, not for --help
    from agent.coordinator.fleet.channels import Fleet
    from agent.coordinator.flows import RolloutResult


class RolloutIncomplete(AgentError):
    """A rollout halted, or left nodes failed or unreached; its record says where."""

    exit_code = 10


# -- rollouts --------------------------------------------------------------------------------


on_unhealthy_option = choice_option(
    "--on-unhealthy",
    choices=["stop", "skip"],
    default="stop",
    help="A node whose GPU fails during the rollout (found just before or after its change): "
    "stop halts the rollout (running nodes finish), skip fails that node alone. Nodes with a "
    "failed GPU at the start are always skipped.",
)


def rollout_options(fn: F) -> F:
    options = [
        click.option("--selector", "-l", default=None, help="Nodes to change: key=value,..."),
        click.option(
            "--max-unavailable",
            default="1",
            show_default=True,
            help="Nodes changing at once: a count or a percentage of the selected nodes.",
        ),
        click.option(
            "--max-failures",
            type=click.IntRange(min=0),
            default=1,
            show_default=True,
            help="Halt after this many nodes fail (0: never halt).",
        ),
        float_option(
            "--node-timeout",
            low=1.0,
            high=NODE_TIMEOUT_MAX_S,
            default=900.0,
            help="Seconds one node may take before its operation is cancelled and it fails.",
        ),
        on_unhealthy_option,
        click.option("--dry-run", is_flag=True, help="Show every node's plan; change nothing."),
        file_option(
            "--record",
            "record_file",
            help="Keep the rollout's progress in this JSON file, for `fleet resume`.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return lease_option(fn)


def progress_report(
    output: str, options: FleetOptions | None = None, kind: str = ""
) -> Callable[[str, Any, str], None]:
    """Node steps on stderr (table output, or any output while stderr is a terminal: a person
    running ``-o json`` still sees a long rollout move, a script reading stdout gets the
    document alone), and as Events on the Node when a Kubernetes API is configured
    (``options``), as `coordinator serve` posts them."""
    import asyncio

    said = output == "table" or sys.stderr.isatty()
    last: dict[str, str] = {}
    cluster = None
    kube = options.kube() if options is not None else None
    if kube is not None:
        from agent.coordinator.control.cluster import ClusterReport
        from agent.coordinator.control.lease import default_identity

        identity = "fleet-apply/" + default_identity()
        cluster = ClusterReport(kube, options.namespace if options else "", identity)

    def report(node: str, state: Any, detail: str) -> None:
        if cluster is not None and (state.finished or detail == "started"):
            # Off the loop; asyncio.run waits for these before the command exits.
            loop = asyncio.get_running_loop()
            loop.run_in_executor(None, cluster.node_step, kind, node, state.value, detail)
        line = f"{state.value}: {detail}" if detail else state.value
        if said and last.get(node) != line:
            last[node] = line
            click.echo(f"{node}: {line}", err=True)

    return report


def _rollout_table(result: RolloutResult) -> str:
    record = result.record
    if result.previews:
        rows = []
        for p in result.previews:
            rows.append([p.node, p.would, p.detail])
            for g in p.gpus:
                if g["status"] != "unchanged":
                    what = " ".join(
                        [f"+{c}" for c in g["create"]] + [f"-{d}" for d in g["destroy"]]
                    )
                    reason = g["reason"] or "; ".join(g["blockers"])
                    rows.append(["", f"GPU {g['gpu']}", f"{g['status']} {what or reason}".strip()])
        head = format_table(["NODE", "WOULD", "DETAIL"], rows)
        notes = "".join(f"\n{line}" for line in _health_lines(result))
        return f"{head}\n\nDry run of a {record.kind} rollout: nothing was changed.{notes}"
    table = format_table(
        ["NODE", "STATE", "ATTEMPT", "DETAIL"],
        [[n, r.state, r.attempt, r.detail] for n, r in record.nodes.items()],
    )
    lines = [table, ""]
    if record.halted:
        lines.append(record.halted.capitalize() + ".")
    if result.skipped:
        lines.append(f"Skipped (no answer): {', '.join(result.skipped)}.")
    lines += _health_lines(result)
    if record.path is not None:
        lines.append(f"Record: {record.path}")
    return "\n".join(lines)


def _health_lines(result: RolloutResult) -> list[str]:
    """The nodes a rollout left out for a failed GPU, and the degraded ones it went ahead on."""
    lines = [
        f"Skipped ({'driver not ready' if n in result.unread else 'GPU failed'}): {n}: {why}."
        for n, why in result.unhealthy.items()
    ]
    lines += [f"Degraded (changed all the same): {n}: {why}." for n, why in result.degraded.items()]
    lines += [f"Skipped (allocation mode): {n}: {why}." for n, why in result.not_allowed.items()]
    return lines


def finish_rollout(result: RolloutResult, output: str) -> None:
    if output == "table":
        click.echo(_rollout_table(result))
    elif result.previews:
        emit(
            {
                "kind": result.record.kind,
                "previews": result.previews,
                "unhealthy": dict(result.unhealthy),
                "degraded": dict(result.degraded),
                "not_allowed": dict(result.not_allowed),
            },
            output,
        )
    else:
        emit(
            {
                "record": result.record.to_dict(),
                "skipped": result.skipped,
                "unhealthy": dict(result.unhealthy),
                "degraded": dict(result.degraded),
                "not_allowed": dict(result.not_allowed),
            },
            output,
        )
    if result.previews or result.complete:
        return
    hint = (
        f"resume with: gpu-agent fleet resume {result.record.path}"
        if result.record.path
        else "pass --record FILE to be able to resume"
    )
    reason = "; ".join(result.incomplete())
    raise RolloutIncomplete(f"the rollout is incomplete ({reason}); {hint}")


def start_rollout(
    options: FleetOptions,
    kind: str,
    spec: dict[str, Any],
    selector: str | None,
    rollout: dict[str, Any],
    output: str,
    nodes: Sequence[str] | None = None,
    *,
    drain: bool = False,
) -> None:
    """Select nodes, write a new record, run (or dry-run) the rollout, render it."""
    from agent.coordinator.fleet.selector import parse_selector
    from agent.coordinator.flows import rollout as rollout_flow
    from agent.coordinator.flows import rollout_nodes, select
    from agent.coordinator.rollout.record import RolloutRecord

    chosen = parse_selector(selector)
    # Refused before any node is contacted, a dry run's too: the real rollout would refuse it.
    parse_max_unavailable(rollout["max_unavailable"], 1)
    dry_run = rollout.pop("dry_run")
    path = rollout.pop("record_file")
    lease = rollout.pop("lease_name")

    async def work(fleet: Fleet) -> RolloutResult:
        selection = await select(fleet, chosen)
        names = rollout_nodes(selection, chosen, nodes)
        record = RolloutRecord.start(kind, spec, names, selector=str(chosen), **rollout)
        record.path = None if dry_run else path
        report = progress_report(output, None if dry_run else options, kind)
        wrap = None
        if drainer is not None:
            from agent.coordinator.rollout.drain import Drain

            kube = drainer

            def wrap(action: Any) -> Any:
                return Drain(action, fleet, selection.targets, record, kube)

        return await rollout_flow(
            fleet, selection, record, dry_run=dry_run, report=report, wrap=wrap
        )

    # The Kubernetes API a drain needs is checked before any node is touched.
    drainer = options.kube(required=True) if drain and not dry_run else None

    # A dry run changes nothing: it needs no Lease.
    finish_rollout(run_with_fleet(options, work, lease=None if dry_run else lease), output)


def rollout_args(
    kwargs: dict[str, Any], inputs: Mapping[str, Path | None] | None = None
) -> dict[str, Any]:
    """The rollout's options out of ``kwargs``; a --record naming one of the ``inputs`` (flag ->
    file), or one that cannot be written, is refused before anything is read: the record would
    be written over it, or fail to be saved once nodes had changed."""
    refuse_bad_outputs(inputs or {}, {"record": kwargs["record_file"]})
    return {
        "max_unavailable": kwargs.pop("max_unavailable"),
        "max_failures": kwargs.pop("max_failures"),
        "node_timeout_s": kwargs.pop("node_timeout"),
        "on_unhealthy": kwargs.pop("on_unhealthy"),
        "dry_run": kwargs.pop("dry_run"),
        "record_file": kwargs.pop("record_file"),
        "lease_name": kwargs.pop("lease_name"),
    }
