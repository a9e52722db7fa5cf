"""``gpu-agent``: the command-line entry point. Commands live one group per module."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from agent import __version__
from agent.cli.context import CliContext
from agent.cli.errors import AgentGroup, report
from agent.errors import AgentError


@click.group(
    cls=AgentGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="gpu-agent")
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="GPU_AGENT_CONFIG",
    help="Agent config YAML (flags > env GPU_AGENT_* > this file > defaults).",
)
@click.option(
    "--simulate",
    metavar="PRESET",
    default=None,
    help="Use a simulated GPU node instead of the real NVML (env GPU_AGENT_SIMULATE). "
    "Presets: `gpu-agent sim presets`.",
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Agent state directory; the simulated driver's state lives here too "
    "(env GPU_AGENT_STATE_DIR, default /var/lib/gpu-agent).",
)
@click.pass_context
def cli(
    ctx: click.Context, config_file: Path | None, simulate: str | None, state_dir: Path | None
) -> None:
    """Node agent for GPU platforms: MIG layouts, GPU sharing, cache prewarm and telemetry.

    \b
    Examples:
      gpu-agent --simulate dgx-h100 --state-dir /tmp/node serve
      gpu-agent --simulate dgx-h100 --state-dir /tmp/node status -o json
    """
    obj = CliContext(config_file, {"simulate": simulate, "state_dir": state_dir})
    ctx.obj = obj
    ctx.call_on_close(obj.close)


def _register() -> None:
    # Imported here so each command module stays independent of the others.
    from agent.cli import coordinator, fleet, metrics, mig, prewarm, serve, share, sim, status

    cli.add_command(serve.serve)
    cli.add_command(status.status)
    cli.add_command(sim.sim)
    cli.add_command(share.share)
    cli.add_command(prewarm.prewarm)
    cli.add_command(prewarm.cache)
    cli.add_command(metrics.metrics)
    cli.add_command(mig.mig)
    cli.add_command(fleet.fleet)
    cli.add_command(coordinator.coordinator)


_register()


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; domain errors become one line on stderr and the error's exit code."""
    try:
        rv = cli.main(args=argv, prog_name="gpu-agent", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except AgentError as exc:  # raised outside any command (while resolving the context)
        report(exc)
        sys.exit(exc.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
