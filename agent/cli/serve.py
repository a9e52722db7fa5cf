"""``gpu-agent serve``: run the node agent in the foreground."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from agent import logs
from agent.cli.context import CliContext
from agent.cli.options import choice_option, file_option
from agent.cli.waits import stopped_by
from agent.ownership import SERVE_ROLE

if TYPE_CHECKING:
    from agent.ownership import NodeOwnership


@click.command()
@click.option(
    "--metrics-listen",
    default=None,
    help="HTTP listen address for /metrics, /healthz and /readyz (default 0.0.0.0:9400).",
)
@file_option(
    "--collectors",
    help="dcgm-exporter counters CSV choosing the exported fields (default: dcgm's defaults).",
)
@choice_option(
    "--metric-names",
    choices=["dcgm", "native"],
    help="DCGM_FI_* names (dcgm-exporter drop-in, default) or Prometheus-native names.",
)
@click.pass_obj
def serve(
    obj: CliContext, metrics_listen: str | None, collectors: Path | None, metric_names: str | None
) -> None:
    """Run the agent: the control API (gRPC on the admin Unix socket, and on TCP with mTLS
    when its certificates are set) and /metrics, /healthz, /readyz HTTP on :9400.

    Without --simulate it uses the real NVML. With no driver yet it still runs, says
    "waiting for the NVIDIA driver" in `status` and `doctor`, and attaches when the driver
    appears (docs/operations.md).

    \b
    Example:
      gpu-agent --simulate dgx-h100 --state-dir /tmp/node serve --metrics-listen 127.0.0.1:9400
    """
    from agent.errors import Conflict
    from agent.node import Node, build_services
    from agent.ownership import NodeOwnership
    from agent.preflight import preflight

    obj.flags = {
        **obj.flags,
        "metrics_listen": metrics_listen,
        "telemetry.collectors": collectors,
        "telemetry.metric_names": metric_names,
    }
    config = obj.config
    logs.configure(config.log_level)
    # The node's one owner while it runs: a CLI command's embedded agent finishes first.
    ownership = NodeOwnership(config.state_dir)
    if not ownership.try_acquire(SERVE_ROLE, config.socket_path):
        # Another serve never finishes on its own: say so at once instead of waiting for it.
        pid = ownership.holder_pid(SERVE_ROLE)
        if pid is not None:
            raise Conflict(
                f"an agent (pid {pid}) already serves the state dir {config.state_dir}: stop it "
                f"first (kill -TERM {pid}), or give this one another --state-dir"
            )
    # Every other precondition, before any service is built: a refusal is the last line.
    preflight(config)
    if not _acquire(ownership, config.socket_path):
        return  # stopped (SIGTERM/SIGINT) while waiting: nothing was started
    node = Node(build_services(config))
    asyncio.run(node.run(exit_if_stuck=True, ready=ownership.mark_serving))
    # The agent closed all it opened; what is left is the interpreter's teardown (finalizing
    # every module, collecting the heap), nothing the node needs and half the SIGTERM-to-exit
    # time on a loaded node (0.3 to 0.6 s of 0.6 to 1.1 s): exit without it, the logs flushed.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _acquire(ownership: NodeOwnership, socket: Path) -> bool:
    """Wait for the node's owner (a command's embedded agent) to finish; SIGTERM or SIGINT
    meanwhile ends the wait, and ``serve``, at once."""
    with stopped_by(signal.SIGTERM, signal.SIGINT) as stop:
        return ownership.acquire(
            SERVE_ROLE,
            lambda holder: logging.getLogger(__name__).warning("waiting for %s to finish", holder),
            stop,
            socket,
        )
