"""``gpu-agent fleet apply mig|share``: roll a MIG layout or a sharing config over nodes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from agent import safeyaml
from agent.cli.coordinator import (
    fleet_options,
    options_from,
)
from agent.cli.errors import AgentGroup
from agent.cli.fleet.rollout import rollout_args, rollout_options, start_rollout
from agent.cli.options import file_option
from agent.cli.render import output_option
from agent.errors import FieldViolation, InvalidSpec


@click.group("apply", cls=AgentGroup)
def apply() -> None:
    """Roll a MIG layout or a sharing config across nodes, a few at a time."""


@apply.command("mig")
@fleet_options
@rollout_options
@file_option("--file", "-f", "config_file", help="mig-parted v1 config file.")
@click.option("--config", "-c", "config_name", default="", help="Config name in the file.")
@file_option(
    "--plan", "plan_file", help="A plan from `fleet plan --out`: each node gets its own config."
)
@click.option(
    "--drain",
    is_flag=True,
    help="For a node whose change must destroy busy instances: cordon it, evict the pods on "
    "the affected GPUs (Eviction API: PodDisruptionBudgets respected), apply, uncordon. Needs "
    "a Kubernetes API (pod or KUBECONFIG) allowed to patch nodes and create pods/eviction.",
)
@output_option
def apply_mig(
    config_file: Path | None,
    config_name: str,
    plan_file: Path | None,
    drain: bool,
    selector: str | None,
    output: str,
    **kwargs: Any,
) -> None:
    """Apply a MIG config (or a fleet plan) to the selected nodes, a few at a time.

    Each node plans first (unchanged nodes are skipped, blocked or infeasible ones fail without
    a change), then applies; its operation is watched to the end. At most --max-unavailable
    nodes change at once; after --max-failures failures the rollout halts.

    \b
    Examples:
      gpu-agent fleet apply mig -f mig.yaml -c all-1g.10gb -l model=*H100* \\
        --max-unavailable 10% --record rollout.json --kubernetes
      gpu-agent fleet apply mig --plan plan.yaml --dry-run --kubernetes
    """
    from agent.coordinator.planning.planfile import PLAN_CONFIG, load_plan
    from agent.mig.spec import load_spec

    rollout = rollout_args(kwargs, {"file": config_file, "plan": plan_file})
    if (config_file is None) == (plan_file is None):
        raise InvalidSpec(
            "give a config (-f FILE [-c NAME]) or a plan (--plan FILE), not both",
            [FieldViolation("file", "-f or --plan")],
        )
    if plan_file is not None:
        configs = load_plan(plan_file)
        spec = {"configs": dict(configs), "config_name": PLAN_CONFIG}
        nodes: Sequence[str] | None = list(configs)
    else:
        assert config_file is not None
        text = safeyaml.read_text(config_file, "file", what="-f")
        name, _ = load_spec(config_file, text).select(config_name or None, flag="config")
        spec = {"config_yaml": text, "config_name": name}
        nodes = None
    start_rollout(options_from(kwargs), "mig", spec, selector, rollout, output, nodes, drain=drain)


@apply.command("share")
@fleet_options
@rollout_options
@click.option(
    "--strategy", type=click.Choice(["time-slicing", "mps"]), default=None, help="How to share."
)
@click.option(
    "--replicas",
    type=click.IntRange(min=2, max=0xFFFFFFFF),  # the API's uint32; the agents check the rest
    default=None,
    help="Replicas per device.",
)
@click.option(
    "--resource",
    "resources",
    multiple=True,
    default=("nvidia.com/gpu",),
    show_default=True,
    help="Resources to share (repeat for several).",
)
@click.option("--rename", is_flag=True, help="Advertise shared resources as <name>.shared.")
@file_option("--file", "-f", "config_file", help="A whole device-plugin config file instead.")
@output_option
def apply_share(
    strategy: str | None,
    replicas: int | None,
    resources: tuple[str, ...],
    rename: bool,
    config_file: Path | None,
    selector: str | None,
    output: str,
    **kwargs: Any,
) -> None:
    """Set GPU sharing (time-slicing or MPS) on the selected nodes, a few at a time.

    \b
    Example:
      gpu-agent fleet apply share --strategy time-slicing --replicas 4 -l name=inference-* \\
        --max-unavailable 2 --kubernetes
    """
    from agent.coordinator.rollout.specs import sharing_spec

    rollout = rollout_args(kwargs, {"file": config_file})
    given = [
        option
        for option, value in (
            ("--strategy", strategy),
            ("--replicas", replicas),
            ("--rename", rename),
            ("--resource", resources != ("nvidia.com/gpu",)),
        )
        if value
    ]
    if config_file is not None and given:
        raise InvalidSpec(
            f"-f FILE is a whole device-plugin config: {', '.join(given)} cannot come with it",
            [FieldViolation("file", f"give -f alone, or {', '.join(given)} without it")],
        )
    if config_file is not None:
        spec = sharing_spec(safeyaml.read_text(config_file, "file", what="-f"))
    elif strategy is not None and replicas is not None:
        spec = sharing_spec(None, strategy, resources, replicas, rename)
    else:
        raise InvalidSpec(
            "give --strategy and --replicas, or -f with a device-plugin config file",
            [FieldViolation("strategy", "time-slicing or mps, with --replicas N >= 2")],
        )
    start_rollout(options_from(kwargs), "share", spec, selector, rollout, output)
