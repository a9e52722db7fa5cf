"""``gpu-agent metrics``: print what a /metrics scrape of the node's agent returns."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from agent.cli.context import SIGTERM_EXIT, CliContext
from agent.cli.options import choice_option, file_option
from agent.cli.render import OUTPUT_FORMATS, emit, format_table
from agent.cli.waits import stopped_by
from agent.errors import FieldViolation, InvalidSpec

if TYPE_CHECKING:
    from agent.telemetry.snapshot import SourceStatus

_SECOND_SAMPLE_S = 30.0  # at most this long for the embedded agent's second sample


@click.command()
@file_option(
    "--collectors",
    help="dcgm-exporter counters CSV choosing the fields (default: the shipped default set).",
)
@choice_option(
    "--metric-names",
    choices=["dcgm", "native"],
    help="DCGM_FI_* names and labels (dcgm-exporter drop-in) or gpu_agent_* base-unit names.",
)
@click.option("--openmetrics", is_flag=True, help="OpenMetrics instead of the classic text format.")
@click.option(
    "--sources",
    is_flag=True,
    help="Print each collection source of the latest sample (up, or degraded and why) instead.",
)
@click.option(
    "--output",
    "-o",
    type=click.Choice(OUTPUT_FORMATS),
    default=None,
    help="With --sources: table for people (the default); json or yaml for scripts.",
)
@click.pass_obj
def metrics(
    obj: CliContext,
    collectors: Path | None,
    metric_names: str | None,
    openmetrics: bool,
    sources: bool,
    output: str | None,
) -> None:
    """Print what a scrape of the node agent's /metrics returns, in Prometheus exposition
    format.

    With no agent running, one is embedded for the command (with --collectors and
    --metric-names applied) and its second sample is printed, so rate fields (GPM) have
    values. A running agent exports with its own configured fields and names: the
    two options are then refused (set telemetry.collectors / telemetry.metric_names in its
    config instead).

    \b
    Examples:
      gpu-agent --simulate dgx-h100 --state-dir /tmp/node metrics
      gpu-agent metrics --metric-names native --collectors my-counters.csv
      gpu-agent metrics --sources -o json
    """
    from agent.telemetry.gpm import MIN_WINDOW_S

    if output is not None and not sources:
        raise InvalidSpec("--output: only with --sources", [FieldViolation("output", "--sources")])
    if openmetrics and sources:
        raise InvalidSpec(
            "--openmetrics: not with --sources (a table, or -o json/yaml)",
            [FieldViolation("openmetrics", "without --sources")],
        )
    chosen = {"telemetry.collectors": collectors, "telemetry.metric_names": metric_names}
    obj.flags = {**obj.flags, **chosen}
    client = obj.agent()
    if not obj.embedded:
        given = [f"--{k.split('.')[1].replace('_', '-')}" for k, v in chosen.items() if v]
        if given:
            raise InvalidSpec(
                f"{', '.join(given)}: the running agent exports with its own configured fields",
                [FieldViolation(g.lstrip("-"), "only without a running agent") for g in given],
            )
    if sources:
        _print_sources(client.telemetry().sources, output or "table")
        return
    response = client.metrics(openmetrics=openmetrics)
    first = response.sample_time
    if obj.embedded and first is not None:
        # The agent's first sample has no rates (GPM needs two, a window apart): the next one.
        # (None without a driver: the agent's own series are all there is.)
        deadline = time.monotonic() + _SECOND_SAMPLE_S
        with stopped_by(signal.SIGTERM) as stop:
            while response.sample_time == first and time.monotonic() < deadline:
                if stop.wait(MIN_WINDOW_S):
                    raise SystemExit(SIGTERM_EXIT)  # the closers stop the embedded agent
                response = client.metrics(openmetrics=openmetrics)
    click.echo(response.body.decode(), nl=False)
    if response.sample_time is None:
        # The agent's own series are printed, but a GPU metrics read without a driver is not
        # a success: exit 11 naming why (the same rule as every other GPU read).
        client.node().require_driver("metrics")


def _print_sources(states: tuple[SourceStatus, ...], output: str) -> None:
    """The gpu_agent_collection_source_up series, from the snapshot: a degraded source's
    fields are absent from the scrape, and this says why."""
    data = [{"source": s.source, "up": s.degraded is None, "reason": s.degraded} for s in states]

    def table(rows: list[dict[str, object]]) -> str:
        cells = [[r["source"], "up" if r["up"] else "degraded", r["reason"]] for r in rows]
        return format_table(["SOURCE", "STATE", "REASON"], cells)

    emit(data, output, table)
