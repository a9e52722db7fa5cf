"""``gpu-agent metrics``: collect once and print what a /metrics scrape would return."""

from __future__ import annotations

import time
from pathlib import Path

import click

from agent.cli.context import CliContext

_OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@click.command()
@click.option(
    "--collectors",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="dcgm-exporter counters CSV choosing the fields (default: the shipped default set).",
)
@click.option(
    "--metric-names",
    type=click.Choice(["dcgm", "native"]),
    default=None,
    help="DCGM_FI_* names and labels (dcgm-exporter drop-in) or gpu_agent_* base-unit names.",
)
@click.option("--openmetrics", is_flag=True, help="OpenMetrics instead of the classic text format.")
@click.pass_obj
def metrics(
    obj: CliContext, collectors: Path | None, metric_names: str | None, openmetrics: bool
) -> None:
    """Collect one snapshot and print it in Prometheus exposition format.

    Samples twice, one profiling window apart, so rate fields (GPM) have values. Reads NVML
    directly; it does not need a running agent.

    \b
    Examples:
      gpu-agent --simulate dgx-h100 --state-dir /tmp/node metrics
      gpu-agent metrics --metric-names native --collectors my-counters.csv
    """
    from agent.telemetry.gpm import MIN_WINDOW_S
    from agent.telemetry.service import build_telemetry

    obj.flags = {
        **obj.flags,
        "telemetry.collectors": collectors,
        "telemetry.metric_names": metric_names,
    }
    config = obj.config
    gpu = obj.gpu()  # first: on a new state dir this creates the simulated node from the preset
    proc_root = None
    if config.simulate:
        from agent.gpu.sim import SimControl

        proc_root = SimControl(config.state_dir).proc_root
    service = build_telemetry(gpu, config.telemetry, hostname=config.node_name, proc_root=proc_root)
    service.start()
    try:
        time.sleep(MIN_WINDOW_S * 1.2)
        service.sampler.tick()
        body, _ = service.exporter.render(_OPENMETRICS if openmetrics else "text/plain")
    finally:
        service.stop()
    click.echo(body.decode(), nl=False)
