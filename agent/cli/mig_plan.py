"""``gpu-agent mig plan``: the agent's plan of a mig-parted config (PlanMig), drawn.

The agent owns the plan: it reads the GPUs live (processes, a MIG mode change already pending
and what applies it, a journal kept) and answers PlanMig as the apply will plan. This command
renders that answer; it plans nothing itself, so it cannot tell another story than the agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from agent.cli.context import CliContext
from agent.cli.mig_common import PENDING_EXIT, config_options, load_with_text
from agent.cli.render import emit, output_option
from agent.errors import Busy, Conflict
from agent.gpu.types import Placement
from agent.mig.view import Block, Box, grouped, slice_map
from agent.wire.mig import REBOOT_APPLIES, MigPlanView, PlannedGpu, PlannedInstance

#: statuses whose instances are planned (an infeasible GPU's are not)
_PLANNED = ("change", "unchanged", "blocked")


@click.command("plan", short_help="Dry run: what an apply would keep, destroy and create.")
@config_options
@click.option("--force", is_flag=True, help="Plan as if running processes were not in the way.")
@output_option
@click.pass_obj
def plan_command(
    obj: CliContext, config_file: str, selected: str | None, force: bool, output: str
) -> None:
    """Show, per GPU, the instances that stay, are destroyed and are created (with placements),
    whether the MIG mode changes (and a GPU reset is needed) or a change is already pending
    (and what applies it), which running processes block it, or why the layout cannot fit and
    what would fit instead: the agent's plan, as the apply will make it. Changes nothing. Exits
    4 if a layout cannot fit, 5 if running processes block it, 1 if a GPU it selects is lost
    or cannot be read, 14 if a mode change waits for a VM reboot, and 12 if the node's
    allocation mode forbids MIG changes, as the apply would.

    \b
    Example:
      gpu-agent mig plan -f /etc/nvidia-mig-manager/config.yaml -c all-balanced
    """
    spec, text = load_with_text(config_file)
    spec.select(selected)  # an unknown config is refused here, before the agent is asked
    plan = obj.agent().plan_mig(text, selected or "", force=force)
    emit(plan_data(plan), output, lambda _: plan_text(plan))
    # Like an apply would: 4 when a layout cannot fit, 5 when processes are in the way, 1 when
    # a GPU it selects is lost or cannot be read, 14 when a mode it changes stays pending until
    # a VM reboot.
    statuses = {g.status for g in plan.gpus}
    if "infeasible" in statuses:
        raise click.exceptions.Exit(Conflict.exit_code)
    if "blocked" in statuses:
        raise click.exceptions.Exit(Busy.exit_code)
    if plan.lost_gpus or plan.unread_gpus:
        raise click.exceptions.Exit(1)
    if any(_waits_for_reboot(g) for g in plan.gpus):
        raise click.exceptions.Exit(PENDING_EXIT)


def _waits_for_reboot(gpu: PlannedGpu) -> bool:
    """The apply switches the mode, and this VM's driver applies it only at a reboot."""
    change = gpu.mode_change
    return gpu.mode_pending == REBOOT_APPLIES and change is not None and change.reset_needed


def plan_data(plan: MigPlanView) -> dict[str, Any]:
    return {
        "config": plan.config_name,
        "gpus": [_gpu_data(g) for g in plan.gpus],
        "skipped_gpus": list(plan.skipped_gpus),
        "unselected_gpus": list(plan.unselected_gpus),
        "lost_gpus": list(plan.lost_gpus),
        "unread_gpus": unread_data(plan.unread_gpus),
        "summary": _summary(plan.gpus),
    }


def unread_data(unread: Sequence[tuple[int, str]]) -> list[dict[str, Any]]:
    """The GPUs that answer but cannot be read, each with its failing call, as -o json says
    them (a plan's and an assert's)."""
    return [{"gpu": i, "unread": why} for i, why in unread]


def _gpu_data(g: PlannedGpu) -> dict[str, Any]:
    change = g.mode_change
    return {
        "gpu": g.gpu_index,
        "uuid": g.gpu_uuid,
        "entry": g.entry,
        "status": g.status,
        "mode_change": None
        if change is None
        else {"enable": change.enable, "reset_needed": change.reset_needed},
        "mode_pending": g.mode_pending or None,
        "keep": list(g.keep),
        "destroy": list(g.destroy),
        "create": list(g.create),
        "blockers": [
            {"pid": b.pid, "instance": b.instance, "change": b.change} for b in g.blockers
        ],
        "infeasible": None
        if g.status != "infeasible"
        else {
            "reason": g.infeasible_reason,
            "profile": g.infeasible_profile or None,
            "collisions": [
                {
                    "placement": c.placement,
                    "blocked_by": list(c.blocked_by),
                    "slices": list(c.slices),
                }
                for c in g.collisions
            ],
            "fits_instead": dict(g.fits_instead),
        },
        "deferred": g.deferred,
        "free_region": g.free_region or None,
        "steps": list(g.steps),
    }


def _summary(gpus: Sequence[PlannedGpu]) -> dict[str, int]:
    planned = [g for g in gpus if g.status in _PLANNED]
    return {
        "gpus_changing": sum(1 for g in gpus if g.steps),
        "instances_kept": sum(len(g.keep) for g in planned),
        "instances_destroyed": sum(len(g.destroy) for g in planned),
        "instances_created": sum(len(g.create) for g in planned),
        "mig_parted_would_destroy": sum(g.mig_parted_would_destroy for g in planned),
    }


def plan_text(plan: MigPlanView) -> str:
    """Every GPU's plan (GPUs planned the same way share one), the GPUs left out, a summary."""
    blocks = [
        Block(
            g.gpu_index,
            f"{g.gpu_name}{f' ({g.entry})' if g.entry else ''}: {g.status.upper()}",
            tuple(_gpu_lines(g)),
        )
        for g in plan.gpus
    ]
    parts = [f"MIG config {plan.config_name}", "", grouped(blocks)]
    for what, indexes in (
        ("skipped (not MIG-capable)", plan.skipped_gpus),
        ("not selected by any entry", plan.unselected_gpus),
        ("not planned (lost: an apply fails on it)", plan.lost_gpus),
    ):
        if indexes:
            parts.append(f"{what}: GPU " + ", ".join(map(str, indexes)))
    parts += [
        f"not planned (cannot be read: an apply fails on it): GPU {i} ({why})"
        for i, why in plan.unread_gpus
    ]
    s = _summary(plan.gpus)
    parts += [
        "",
        f"{s['gpus_changing']} GPU(s) change: {s['instances_kept']} instance(s) kept, "
        f"{s['instances_destroyed']} destroyed, {s['instances_created']} created "
        f"(mig-parted would destroy {s['mig_parted_would_destroy']})",
    ]
    return "\n".join(parts)


def _gpu_lines(g: PlannedGpu) -> list[str]:
    lines = _mode_lines(g)
    if g.status == "infeasible":
        lines.append(f"  cannot fit: {g.infeasible_reason}")
        if g.fits_instead:
            lines.append("  fits instead: " + ", ".join(f"{n}: {c}" for n, c in g.fits_instead))
        return lines
    if g.deferred:
        lines.append(
            "  the driver lists no profiles while MIG is off: instances are planned once it is on"
        )
    for label, items in (
        ("keep", _with_ids(g.keep, g.keep_ids)),
        ("destroy", _with_ids(g.destroy, g.destroy_ids)),
        ("create", list(g.create)),
    ):
        if items:
            lines.append(f"  {label:<8} " + ", ".join(items))
    lines += [f"  BLOCKED  process {b.pid} on {b.instance} blocks {b.change}" for b in g.blockers]
    if g.after and g.steps and g.memory_slices:
        lines.append("  after:")
        lines.append(slice_map([_box(i) for i in g.after], g.memory_slices, "    "))
    if g.steps:
        lines.append("  steps:")
        lines += [f"    {i}. {step}" for i, step in enumerate(g.steps, start=1)]
    return lines


def _mode_lines(g: PlannedGpu) -> list[str]:
    """The mode change already pending (and what applies it), and the one the apply makes."""
    lines = [f"  MIG mode change pending: {g.mode_pending} applies it"] if g.mode_pending else []
    change = g.mode_change
    if change is None:
        return lines
    state = "enabled" if change.enable else "disabled"
    if not change.reset_needed:
        lines.append(f"  MIG mode: cancel the pending change, stay {state}")
    elif g.mode_pending == REBOOT_APPLIES:
        lines.append(f"  MIG mode -> {state}: stays pending until this VM reboots")
    else:
        lines.append(
            f"  MIG mode -> {state}: needs a GPU reset unless the driver switches at once "
            "(nothing may hold the GPU)"
        )
    return lines


def _with_ids(instances: Sequence[str], ids: Sequence[int]) -> list[str]:
    """``2g.20gb@0:2 (GI 3)``; an agent that sent no ids gets the placements alone."""
    if len(ids) != len(instances):
        return list(instances)
    return [f"{i} (GI {n})" for i, n in zip(instances, ids, strict=True)]


def _box(i: PlannedInstance) -> Box:
    cis = "" if i.compute_instances == 1 else f" · {i.compute_instances} CIs"
    return Box(Placement(i.start, i.size), i.profile, ("kept" if i.kept else "new") + cis)
