"""``gpu-agent fleet remediate NODE``: act on a failed GPU's health mark (dry run by default).

Thin: find the node's agent, plan with `agent.coordinator.rollout.remediate`, print the
plan, and with --apply do it with progress on stderr.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click

from agent.cli.coordinator import fleet_options, lease_option, options_from, run_with_fleet
from agent.cli.options import GPU_INDEX, float_option
from agent.cli.render import emit, output_option
from agent.errors import AgentError, NotFound

if TYPE_CHECKING:
    from agent.coordinator.fleet.channels import Fleet
    from agent.coordinator.rollout.remediate import Outcome, Remedy


class RemedyIncomplete(AgentError):
    """The action was taken but the GPU did not report healthy in time: the node stays
    cordoned."""

    exit_code = 10


def _document(
    remedy: Remedy, applied: bool, outcome: Outcome | None, notes: list[str]
) -> dict[str, Any]:
    return {
        "node": remedy.node,
        "apply": applied,
        "cordon": remedy.cordon,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "failures": list(g.failures),
                "action": g.action,
                "pods": [f"{ns}/{name}" for ns, name in g.pods],
            }
            for g in remedy.gpus
        ],
        "evict": [f"{ns}/{name}" for ns, name in remedy.pods],
        "steps": remedy.steps(),
        "notes": notes,
        "outcome": None
        if outcome is None
        else {"result": outcome.result, "detail": outcome.detail, "cordoned": outcome.cordoned},
    }


def _text(doc: dict[str, Any]) -> str:
    lines = [f"Node {doc['node']}:"]
    for g in doc["gpus"]:
        lines.append(f"  GPU {g['index']} ({g['uuid']}): {'; '.join(g['failures'])}")
        lines.append(f"    action {g['action']}; pods: {', '.join(g['pods']) or 'none'}")
    verb = "Steps" if doc["apply"] else "Would (dry run; --apply to do it)"
    lines.append(f"{verb}:")
    lines += [f"  {i}. {step}" for i, step in enumerate(doc["steps"], 1)]
    lines += [f"Note: {n}" for n in doc["notes"]]
    outcome = doc["outcome"]
    if outcome is not None:
        lines.append(f"Outcome: {outcome['result']}: {outcome['detail']}")
    return "\n".join(lines)


@click.command("remediate")
@fleet_options
@click.argument("node")
@click.option(
    "--gpu",
    "gpu_index",
    type=GPU_INDEX,
    default=None,
    help="The failed GPU's index; default: every failed GPU of the node.",
)
@click.option("--apply", "apply_", is_flag=True, help="Do it (default: a dry run).")
@float_option(
    "--wait",
    "wait_s",
    low=1,
    high=86400,
    default=600.0,
    help="Seconds to wait for the processes to end and for the GPU to report healthy.",
)
@lease_option
@output_option
def remediate(
    node: str,
    gpu_index: int | None,
    apply_: bool,
    wait_s: float,
    lease_name: str,
    output: str,
    **kwargs: Any,
) -> None:
    """Act on a failed GPU's health mark: cordon, evict its pods, reset or ask for a reboot.

    A dry run by default: prints the failed GPUs, the action each mark asks for, whether the
    node is cordoned, the pods to evict (those the mark names and those on the GPU now) and
    the steps. --apply does them: cordon (for reset-gpu and reboot-node), evictions through
    the Eviction API (PodDisruptionBudgets respected), then a GPU reset through the agent
    (reset-gpu), or says a reboot is needed and never reboots (reboot-node); the node is
    uncordoned once the GPU reports healthy. A GPU that is not failed, an action the agent
    cannot take, or a node whose driver is not ready (its GPUs unread) is refused and nothing
    changes.

    \b
    Examples:
      gpu-agent fleet remediate gpu-node-7 --kubernetes
      gpu-agent fleet remediate gpu-node-7 --gpu 3 --apply --kubernetes
    """
    from agent.coordinator.fleet.selector import Selector
    from agent.coordinator.flows import select
    from agent.coordinator.rollout.remediate import remedy_for, run_remedy

    options = options_from(kwargs)
    kube = None

    async def work(fleet: Fleet) -> dict[str, Any]:
        selection = await select(fleet, Selector())
        view = next((v for v in selection.views if v.name == node), None)
        if view is None:
            known = ", ".join(v.name for v in selection.views) or "none"
            raise NotFound(f"no agent answers for node {node} (nodes: {known})")
        if not view.reachable:
            raise NotFound(f"the agent of {node} does not answer: {view.error}")
        client = fleet.client(selection.targets[node])
        remedy, withheld = await remedy_for(client, node, gpu_index)
        notes = []
        if withheld:
            notes.append(
                "the agent withholds pods from this identity (read role): only the pods the "
                "marks name are listed"
            )
        if remedy.unparsed:
            notes.append(f"not namespace/name, not evicted: {', '.join(remedy.unparsed)}")
        if not apply_:
            return _document(remedy, False, None, notes)
        if output == "table":
            click.echo(_text(_document(remedy, True, None, notes)), err=True)

        def progress(text: str) -> None:
            if output == "table":
                click.echo(f"{node}: {text}", err=True)

        request_id = f"remediate-{node}-{int(time.time())}"
        outcome = await run_remedy(
            remedy, client, kube, progress, request_id=request_id, timeout_s=wait_s
        )
        return _document(remedy, True, outcome, notes)

    if apply_:
        kube = options.kube(required=True)  # checked before any node is touched
    doc = run_with_fleet(options, work, lease=lease_name if apply_ else None)
    if output == "table" and apply_:
        click.echo(f"Outcome: {doc['outcome']['result']}: {doc['outcome']['detail']}")
    elif output == "table":
        click.echo(_text(doc))
    else:
        emit(doc, output)
    if doc["outcome"] is not None and doc["outcome"]["result"] == "not-healthy":
        raise RemedyIncomplete(doc["outcome"]["detail"])
