"""``gpu-agent fleet resume``: carry a rollout on from its record."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from agent.cli.coordinator import (
    fleet_options,
    lease_option,
    options_from,
    run_with_fleet,
)
from agent.cli.fleet.rollout import finish_rollout, progress_report
from agent.cli.options import choice_option, float_option
from agent.cli.render import output_option
from agent.coordinator.rollout.schedule import NODE_TIMEOUT_MAX_S

if TYPE_CHECKING:  # the coordinator is imported when a command runs, not for --help
    from agent.coordinator.fleet.channels import Fleet


@click.command("resume")
@fleet_options
@click.argument("record_file", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--dry-run", is_flag=True, help="Show what the resumed rollout would do.")
@click.option(
    "--max-unavailable",
    default=None,
    help="Change the record's limit: nodes changing at once (a count or a percentage).",
)
@click.option(
    "--max-failures",
    type=click.IntRange(min=0),
    default=None,
    help="Change the record's limit: halt after this many failed nodes (0: never).",
)
@float_option(
    "--node-timeout",
    low=1.0,
    high=NODE_TIMEOUT_MAX_S,
    default=None,
    help="Change the record's limit: seconds one node may take.",
)
@choice_option(
    "--on-unhealthy",
    choices=["stop", "skip"],
    help="Change the record's policy for a node whose GPU fails during the rollout.",
)
@lease_option
@output_option
def resume(
    record_file: Path,
    dry_run: bool,
    max_unavailable: str | None,
    max_failures: int | None,
    node_timeout: float | None,
    on_unhealthy: str | None,
    lease_name: str,
    output: str,
    **kwargs: Any,
) -> None:
    """Carry on a halted or interrupted rollout from its record.

    Finished nodes are skipped, failed nodes retried, nodes left mid-operation re-attached to
    their operation on the agent. --max-unavailable, --max-failures and --node-timeout replace
    the record's limits (kept in the record from then on); failures so far count against the
    new --max-failures.

    \b
    Example:
      gpu-agent fleet resume rollout.json --max-unavailable 25% --max-failures 3 --kubernetes
    """
    from agent.coordinator.fleet.selector import Selector
    from agent.coordinator.flows import rollout as rollout_flow
    from agent.coordinator.flows import select
    from agent.coordinator.rollout.record import RolloutRecord
    from agent.coordinator.rollout.schedule import parse_max_unavailable

    record = RolloutRecord.load(record_file)
    if max_unavailable is not None:
        parse_max_unavailable(max_unavailable, len(record.nodes))  # refused before any change
        record.max_unavailable = max_unavailable
    if max_failures is not None:
        record.max_failures = max_failures
    if node_timeout is not None:
        record.node_timeout_s = node_timeout
    if on_unhealthy is not None:
        record.on_unhealthy = on_unhealthy
    record.check_limits()  # the file's own limits too, before any node is contacted

    async def work(fleet: Fleet) -> Any:
        selection = await select(fleet, Selector())
        order = record.resume()
        if dry_run:
            record.path = None
        report = progress_report(output, None if dry_run else options, record.kind)
        return await rollout_flow(
            fleet, selection, record, order=order, dry_run=dry_run, report=report
        )

    options = options_from(kwargs)
    lease = None if dry_run else lease_name
    finish_rollout(run_with_fleet(options, work, lease=lease), output)
