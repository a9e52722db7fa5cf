"""``gpu-agent fleet plan``, ``replay`` and ``rightsize``: MIG layouts for a demand, a demand
replayed over the fleet, and the devices the pods use.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import yaml

from agent.cli.coordinator import (
    fleet_options,
    options_from,
    run_with_fleet,
)
from agent.cli.fleet.status import counts_text
from agent.cli.options import (
    file_option,
    float_option,
    refuse_bad_outputs,
    refuse_unwritable,
    write_output,
)
from agent.cli.render import emit, format_table, output_option
from agent.errors import AgentError, FieldViolation, InvalidSpec
from agent.safeyaml import ascii_int

if TYPE_CHECKING:  # the coordinator is imported when a command runs, not for --help
    from agent.coordinator.fleet.channels import Fleet


# -- plan and replay ---------------------------------------------------------------------------


def _no_node(selector: Any) -> AgentError:
    """What to say when a sweep selected nothing: the selector, or discovery, found no node."""
    from agent.errors import NotFound

    if selector.terms:
        return NotFound(f"the selector {selector} matched no node")
    return NotFound("no node found: discovery returned no agents")


class DemandUnmet(AgentError):
    """`fleet plan` made a plan, but some demand does not fit; the plan says what and why."""

    exit_code = 11


def _plan_table(data: dict[str, Any]) -> str:
    result = data["result"]
    p = result.plan
    changes = format_table(
        ["NODE", "GPU", "MODEL", "BEFORE", "AFTER", "CREATE", "DESTROY"],
        [
            [
                c.node,
                c.index,
                c.model.removeprefix("NVIDIA "),
                counts_text(dict(c.before)) + (" (MIG off)" if c.enable_mig else ""),
                counts_text(dict(c.after)),
                " ".join(c.create) or "-",
                " ".join(c.destroy) or "-",
            ]
            for c in p.changes
        ],
    )
    totals = format_table(
        ["PROFILE", "MODEL", "POOL", "PRIORITY", "DEMAND", "BEFORE", "AFTER"],
        [
            [t.profile, t.model or "any", t.pool or "any", t.priority, t.demand, t.before, t.after]
            for t in p.totals
        ],
    )
    lines = [
        changes if p.changes else "No GPU changes.",
        "",
        totals,
        "",
        f"{len(p.changes)} GPU(s) change: {p.created} instance(s) created, {p.destroyed} "
        f"destroyed (a plan from scratch would destroy {result.scratch_destroyed}); "
        f"{p.free_slices} memory slice(s) stay free on MIG GPUs.",
    ]
    if not p.optimal:
        lines.append("The solver's time limit cut the search short: the plan is valid, not proven.")
    if p.free_capacity:
        lines.append("Free slices could still hold: " + counts_text(dict(p.free_capacity)) + ".")
    for u in p.unmet:
        lines.append(f"UNMET {u.label} (priority {u.priority}): {u.reason}")
    for note in data.get("notes", ()):
        lines.append(f"Note: {note}")
    if result.unreachable:
        lines.append(f"Not planned (no answer): {', '.join(result.unreachable)}")
    lines += _dra_plan_lines(result)
    if data.get("out"):
        lines.append(
            f"Plan written to {data['out']}; apply it with: gpu-agent fleet apply mig "
            f"--plan {data['out']}"
        )
    return "\n".join(lines)


def _cluster_claims(client: Any) -> tuple[list[object], list[object], str | None]:
    """Every ResourceClaim and ResourceClaimTemplate, or why they could not be read (a cluster
    without resource.k8s.io/v1, or RBAC): then the plan is made without them, and says so."""
    from agent.coordinator.planning.claimdemand import list_claims, list_templates

    try:
        return list_claims(client), list_templates(client), None
    except AgentError as exc:
        return [], [], f"ResourceClaims not read ({exc}): demand from pods' resources only"


def _with_claims(found: Any, pods: list[object], claims: Any) -> Any:
    from agent.coordinator.planning.claimdemand import demand_from_claims
    from agent.coordinator.planning.clusterdemand import ClusterDemand, with_claims

    listed, templates, problem = claims
    if problem is not None:
        return ClusterDemand(
            found.demand, found.pending, found.running, (*found.notes, problem), found.waiting
        )
    return with_claims(found, demand_from_claims(pods, listed, templates))


def _dra_plan_lines(result: Any) -> list[str]:
    """Nodes (and lost or failed GPUs) the MIG planner left out, planned nodes a rollout would
    skip (a failed GPU), and fragmentation advice."""
    lines = [
        f"Not planned: {n.node}: {n.reason}" for n in (*result.not_planned, *result.left_out_gpus)
    ]
    lines += [
        f"Planned, but a rollout skips {node} until it is healthy: {why}"
        for node, why in sorted(result.unhealthy.items())
    ]
    for f in result.fragmented:
        lines.append(f"FRAGMENTED {f.text} (advice: nothing is changed on dynamic MIG nodes)")
    return lines


def _dra_plan_data(result: Any) -> dict[str, Any]:
    return {
        "not_planned": [
            {"node": n.node, "reason": n.reason}
            for n in (*result.not_planned, *result.left_out_gpus)
        ],
        "unhealthy": dict(result.unhealthy),
        "fragmented": [
            {
                "who": f.who,
                "profile": f.profile,
                "count": f.count,
                "gpus": f.gpus,
                "fits": [
                    {
                        "node": h.node,
                        "gpu": h.gpu,
                        "start": h.start,
                        "moves": [
                            {
                                "profile": m.profile,
                                "gpu_instance": m.gpu_instance,
                                "from_start": m.source.start,
                                "to_start": m.target.start,
                                "busy": m.busy,
                            }
                            for m in h.moves
                        ],
                        "text": h.text,
                    }
                    for h in f.hints
                ],
                "text": f.text,
            }
            for f in result.fragmented
        ],
    }


@click.command("plan")
@fleet_options
@file_option(
    "--demand",
    "demand_file",
    help="Demand file: devices wanted per MIG profile (and per GPU model, priority, pool).",
)
@click.option(
    "--from-cluster",
    is_flag=True,
    help="Take the demand from the cluster: Pending pods' MIG requests and pending ResourceClaims, "
    "plus what running pods and allocated claims hold (in a pod its service account, elsewhere "
    "the kubeconfig, as kubectl finds it).",
)
@click.option("--selector", "-l", default=None, help="Plan over the matching nodes only.")
@float_option(
    "--time-limit",
    low=1,
    high=600,
    default=30.0,
    help="Seconds the solver may search; past it the best plan found is used (not proven).",
)
@file_option("--out", help="Write the plan here, for `gpu-agent fleet apply mig --plan`.")
@output_option
def plan(
    demand_file: Path | None,
    from_cluster: bool,
    selector: str | None,
    time_limit: float,
    out: Path | None,
    output: str,
    **kwargs: Any,
) -> None:
    """Plan per-GPU MIG layouts that meet a demand with the least change.

    Devices already there count; instances with running processes stay. The plan is exact:
    most demand met (by priority), then fewest instances destroyed, then fewest mutations,
    then least fragmentation. Prints what changes where, and per unmet entry why, what it lost
    to and what would make it fit. Exit status 11 when any demand is left unmet (the plan is
    still printed and written). The demand file:

    \b
      version: v1
      demand:
        1g.10gb: 40
        3g.40gb: {NVIDIA H100 80GB HBM3: 6}
    \b
    or entries with priorities and pools:
      demand:
        - {profile: 7g.80gb, count: 8, priority: 100, pool: "pool=training"}

    \b
    Examples:
      gpu-agent fleet plan --demand demand.yaml --out plan.yaml --kubernetes
      gpu-agent fleet plan --from-cluster --kubernetes
    """
    from agent.coordinator.fleet.selector import parse_selector
    from agent.coordinator.flows import plan as plan_flow
    from agent.coordinator.flows import select
    from agent.coordinator.planning.demand import load_demand
    from agent.coordinator.planning.planfile import plan_document

    if (demand_file is None) == (not from_cluster):
        raise InvalidSpec(
            "give --demand FILE or --from-cluster (one of them)",
            [FieldViolation("demand", "--demand FILE or --from-cluster")],
        )
    refuse_bad_outputs({"demand": demand_file}, {"out": out})  # before a read, or the solver
    notes: tuple[str, ...] = ()
    pods: list[object] = []
    claims: tuple[list[object], list[object], str | None] = ([], [], None)
    waiting: Sequence[Any] = ()
    if demand_file is not None:
        demand = load_demand(demand_file)
        source = str(demand_file)
    else:
        from agent.coordinator.planning.clusterdemand import cluster_client, list_pods

        client = cluster_client()
        pods = list_pods(client)
        claims = _cluster_claims(client)
    chosen = parse_selector(selector)
    selection = run_with_fleet(options_from(kwargs), lambda f: select(f, chosen))
    if not selection.views:
        raise _no_node(chosen)
    if from_cluster:
        from agent.coordinator.planning.clusterdemand import demand_from_pods, sharing_replicas

        replicas = sharing_replicas(v.sharing for v in selection.reachable)
        found = _with_claims(demand_from_pods(pods, replicas), pods, claims)
        demand, notes, source = found.demand, found.notes, "cluster"
        counted = f"{found.pending} pod(s) pending, {found.running} running with MIG devices"
        notes = (counted, *notes)
        waiting = found.waiting
    result = plan_flow(selection, demand, time_limit_s=time_limit, waiting=waiting)
    if out is not None:
        document = plan_document(result.plan, source)
        write_output(out, yaml.safe_dump(document, sort_keys=False), "out")
    if output == "table":
        click.echo(_plan_table({"result": result, "out": out, "notes": notes}))
    else:
        emit(_plan_data(result, demand, source, notes), output)
    if result.plan.unmet:
        raise _unmet(result.plan.unmet)


def _plan_data(result: Any, demand: Any, source: str, notes: Sequence[str]) -> dict[str, Any]:
    """The plan as `-o json` shows it."""
    plan = result.plan
    return {
        "changes": plan.changes,
        "unmet": plan.unmet,
        "totals": plan.totals,
        "created": plan.created,
        "destroyed": plan.destroyed,
        "mutations": plan.mutations,
        "optimal": plan.optimal,
        "scratch_destroyed": result.scratch_destroyed,
        "free_slices": plan.free_slices,
        "free_capacity": dict(plan.free_capacity),
        "unreachable": result.unreachable,
        **_dra_plan_data(result),
        "demand": {"source": source, "entries": demand.entries, "notes": notes},
    }


def _unmet(unmet: Sequence[Any]) -> DemandUnmet:
    short = sum(u.missing for u in unmet)
    return DemandUnmet(
        f"{short} device(s) of {len(unmet)} demand entr{'y' if len(unmet) == 1 else 'ies'} "
        "left unmet: " + ", ".join(f"{u.label} short {u.missing}" for u in unmet)
    )


def _replay_table(steps: Sequence[Any]) -> str:
    rows = [
        [
            s.label,
            s.demand,
            s.met,
            " ".join(f"{p.priority}:{p.met}/{p.demand}" for p in s.by_priority) or "-",
            counts_text(dict(s.unmet)),
            s.disrupted,
            s.created,
            s.gpus_changed,
            f"{s.idle_slices}/{s.total_slices}",
            f"{s.gpu_hours_idle:.1f}",
        ]
        for s in steps
    ]
    table = format_table(
        [
            "TIME",
            "DEMAND",
            "MET",
            "MET BY PRIORITY",
            "UNMET",
            "DESTROYED",
            "CREATED",
            "GPUS RECONFIGURED",
            "IDLE SLICES",
            "GPU-H IDLE",
        ],
        rows,
    )
    short = sum(s.unmet_total > 0 for s in steps)
    return (
        f"{table}\n\n{short} of {len(steps)} step(s) leave demand unmet; "
        f"{sum(s.disrupted for s in steps)} instance(s) destroyed and "
        f"{sum(s.gpus_changed for s in steps)} GPU reconfiguration(s) across the trace; "
        f"{sum(s.gpu_hours_idle for s in steps):.1f} GPU-hour(s) idle."
    )


#: --end: a year's trace (and a day), the longest a capacity model replays.
REPLAY_END_MAX_S = 366 * 24 * 3600


@click.command("replay")
@fleet_options
@file_option(
    "--trace",
    "trace_file",
    required=True,
    help="CSV with time,profile,count[,model][,priority][,pool]: each row sets that entry's "
    "demand from then on.",
)
@click.option("--selector", "-l", default=None, help="Start from the matching nodes only.")
@click.option(
    "--add",
    "added",
    multiple=True,
    metavar="PRESET=N",
    help="Also N idle simulated nodes of a preset (e.g. hgx-h200=10): GPUs you might buy.",
)
@click.option("--offline", is_flag=True, help="Ask no agents: replay on the --add nodes alone.")
@float_option(
    "--end",
    low=0,
    high=REPLAY_END_MAX_S,
    default=None,
    help="Seconds after the trace's start when the last step ends (for its GPU-hours idle); "
    "at most 366 days.",
)
@file_option(
    "--report", "report_file", help="Write one row per step and priority here: .csv or .json."
)
@file_option(
    "--svg", "svg_file", help="Draw demand, capacity and met devices over time into this SVG file."
)
@output_option
def replay_cmd(
    trace_file: Path,
    selector: str | None,
    added: tuple[str, ...],
    offline: bool,
    end: float | None,
    report_file: Path | None,
    svg_file: Path | None,
    output: str,
    **kwargs: Any,
) -> None:
    """Replay a demand trace against the planner: a capacity model before buying GPUs.

    Starts from the fleet's current layouts (and any --add nodes); per step, reports demand met
    per priority, unmet demand, instances destroyed, GPUs reconfigured, memory slices idle
    (free, or in instances not in use) and GPU-hours idle until the next step.

    \b
    Example:
      gpu-agent fleet replay --trace week.csv --offline --add dgx-h100=20 --add hgx-h200=4 \\
        --report week-report.csv --svg week.svg
    """
    from agent.coordinator.fleet.selector import parse_selector
    from agent.coordinator.flows import replay_trace, select
    from agent.coordinator.planning.catalog import preset_layouts
    from agent.coordinator.planning.demand import load_trace
    from agent.coordinator.planning.planner import NodeLayouts
    from agent.coordinator.planning.replayreport import report_csv, report_json, report_svg

    if report_file is not None and report_file.suffix not in (".csv", ".json"):
        raise InvalidSpec(
            f"--report {report_file}: the name must end in .csv or .json",
            [FieldViolation("report", ".csv or .json")],
        )
    refuse_bad_outputs({"trace": trace_file}, {"report": report_file, "svg": svg_file})
    steps = load_trace(trace_file)
    extra: list[tuple[str, NodeLayouts]] = []
    for spec in added:
        preset, _, count = spec.partition("=")
        if not 1 <= (ascii_int(count, 5) or 0) <= 10_000:
            raise InvalidSpec(
                f"--add {spec!r} is not PRESET=N (N 1..10000)",
                [FieldViolation("add", "e.g. dgx-h100=4")],
            )
        extra += [
            (preset, NodeLayouts(f"{preset}-{i}", preset_layouts(preset, f"{preset}-{i}")))
            for i in range(int(count))
        ]
    options = options_from(kwargs)
    if offline and not extra:
        raise InvalidSpec("--offline needs --add nodes to replay on", [FieldViolation("add", "")])
    selection = None
    if not offline:
        chosen = parse_selector(selector)
        selection = run_with_fleet(options, lambda f: select(f, chosen))
        if not selection.views and not extra:
            raise _no_node(chosen)
    results = replay_trace(selection, extra, steps, end=end)
    if report_file is not None:
        render = report_csv if report_file.suffix == ".csv" else report_json
        write_output(report_file, render(results), "report")
    if svg_file is not None:
        title = f"Demand vs capacity: {trace_file.name}"
        write_output(svg_file, report_svg(results, title), "svg")
    emit(list(results), output, _replay_table)


def _sweeps(window: str, every: str) -> tuple[float, int]:
    """--every in seconds and how many sweeps --window takes (one for a window of 0)."""
    from agent.coordinator.fleet.query import parse_duration

    window_s, every_s = parse_duration(window, "window"), parse_duration(every, "every")
    if not 0 <= window_s <= 7 * 86400:
        raise InvalidSpec(
            f"--window {window} is not 0..7d", [FieldViolation("window", "0 to 7d, e.g. 1h")]
        )
    if window_s > 0 and not 1 <= every_s <= window_s:
        raise InvalidSpec(
            f"--every {every} is not 1s..--window", [FieldViolation("every", "1s up to --window")]
        )
    return every_s, 1 if window_s == 0 else int(window_s // every_s) + 1


def _swept(done: int, window: Any, *, samples: int, every_s: float) -> None:
    """A line on stderr after each sweep of a long watch: the table comes only at its end."""
    if samples == 1:
        return
    left = (samples - done) * every_s
    failing = f", {len(window.failed)} node(s) not answering" if window.failed else ""
    click.echo(
        f"sweep {done}/{samples}: {len(window.observations)} pod device(s) seen{failing}"
        + (f"; {left:.0f}s left" if left else ""),
        err=True,
    )


def _rightsize_table(data: dict[str, Any]) -> str:
    rows = [
        [
            f"{s.observation.namespace}/{s.observation.pod}",
            s.observation.node,
            f"{s.observation.gpu_uuid[-8:]}/"
            + (
                "-" if s.observation.gpu_instance_id is None else str(s.observation.gpu_instance_id)
            ),
            s.observation.device + (" (shared)" if s.observation.shared else ""),
            "-"
            if s.observation.peak_memory_mib is None
            else f"{s.observation.peak_memory_mib:.0f}",
            "?" if s.observation.peak_activity is None else f"{s.observation.peak_activity:.0%}",
            s.fits or "-",
            s.reason,
        ]
        for s in data["suggestions"]
    ]
    table = format_table(
        ["POD", "NODE", "GPU/GI", "NOW", "PEAK MIB", "PEAK ACTIVE", "FITS", "WHY"], rows
    )
    fits = [s for s in data["suggestions"] if s.fits]
    lines = [
        table if rows else "No pod on a MIG device or shared GPU was seen.",
        "",
        f"{len(fits)} of {len(rows)} pod(s) fit a smaller profile (headroom "
        f"{data['headroom']:.0%}), freeing {sum(s.saves_slices for s in fits)} memory slice(s); "
        f"{data['samples']} sample(s) over {data['window']}.",
    ]
    window = data["observed"]
    if window.unattributed:
        shared = sum(window.unattributed.values())
        lines.append(f"{shared} busy shared device sample(s) named no container: not sized.")
    for node, error in sorted(window.failed.items()):
        lines.append(f"No telemetry from {node}: {error}")
    if data.get("demand_out"):
        lines.append(
            f"Demand written to {data['demand_out']}: gpu-agent fleet plan --demand "
            f"{data['demand_out']}"
        )
    return "\n".join(lines)


@click.command("rightsize")
@fleet_options
@click.option("--selector", "-l", default=None, help="Only pods on the matching nodes.")
@click.option(
    "--window",
    default="10m",
    show_default=True,
    help="How long to watch the pods' use (s, m, h, d); 0 takes one sample.",
)
@click.option(
    "--every", default="30s", show_default=True, help="Telemetry sweep interval (s, m, h)."
)
@float_option(
    "--headroom",
    low=0,
    high=4,
    default=0.2,
    help="Margin over the peaks a smaller profile must still hold (0.2 = 20%).",
)
@file_option(
    "--demand-out",
    help="Write the pods' devices as a demand file (the smaller profile where one fits).",
)
@output_option
def rightsize(
    selector: str | None,
    window: str,
    every: str,
    headroom: float,
    demand_out: Path | None,
    output: str,
    **kwargs: Any,
) -> None:
    """List pods whose observed work fits a smaller MIG profile than the device they hold.

    Watches every agent's telemetry over --window: per pod on a MIG device its peak memory and
    engine activity (GPM, Hopper); per container on a shared (time-sliced) GPU its own memory
    and SM utilisation. A smaller profile of the same model fits when it holds the peaks with
    --headroom to spare; unknown activity is never taken as 0.

    \b
    Example:
      gpu-agent fleet rightsize --window 1h --every 1m --demand-out smaller.yaml --kubernetes
      gpu-agent fleet plan --demand smaller.yaml --kubernetes
    """
    from agent.coordinator.fleet.selector import parse_selector
    from agent.coordinator.flows import observe, select
    from agent.coordinator.planning.catalog import Catalog
    from agent.coordinator.planning.demand import demand_yaml
    from agent.coordinator.planning.rightsize import rightsized_demand, suggest

    every_s, samples = _sweeps(window, every)
    refuse_unwritable({"demand-out": demand_out})  # before the window is watched
    chosen = parse_selector(selector)

    async def work(f: Fleet) -> Any:
        selection = await select(f, chosen)
        if not selection.views:
            raise _no_node(chosen)
        if samples > 1:
            click.echo(
                f"Watching {len(selection.reachable)} node(s) for {window}: {samples} sweeps, "
                f"one every {every}.",
                err=True,
            )
        progress = partial(_swept, samples=samples, every_s=every_s)
        return selection, await observe(
            f, selection, samples=samples, every_s=every_s, swept=progress
        )

    selection, observed = run_with_fleet(options_from(kwargs), work)
    seen = [g for v in selection.reachable for g in v.layouts]
    catalog = Catalog(seen)  # a GPU with MIG off reports no profiles: its model's
    suggestions = suggest(observed, {g.gpu.uuid: catalog.complete(g) for g in seen}, headroom)
    if demand_out is not None:
        text = demand_yaml(
            rightsized_demand(suggestions),
            f"From `gpu-agent fleet rightsize` over {window} (headroom {headroom:.0%}).",
        )
        write_output(demand_out, text, "demand-out")
    data = {
        "suggestions": suggestions,
        "observed": observed,
        "headroom": headroom,
        "samples": samples,
        "window": window,
        "demand_out": demand_out,
    }
    if output == "table":
        click.echo(_rightsize_table(data))
        return
    emit(
        {
            "pods": suggestions,
            "unattributed": dict(observed.unattributed),
            "failed": observed.failed,
            "samples": samples,
        },
        output,
    )
