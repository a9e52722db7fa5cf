"""``gpu-agent fleet …``: see the fleet, plan MIG layouts for it, roll changes across it.

Thin: parse, call `agent.coordinator.flows`, render. Every command talks to the agents through
their gRPC API (mTLS), found by a static list, a DNS name or the Kubernetes API.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import yaml
from google.protobuf import json_format

from agent.cli.coordinator import (
    FleetOptions,
    fleet_options,
    lease_option,
    options_from,
    run_with_fleet,
)
from agent.cli.errors import AgentGroup
from agent.cli.render import emit, format_table, output_option
from agent.errors import AgentError, FieldViolation, InvalidSpec

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:  # the coordinator is imported when a command runs, not for --help
    from agent._proto.gpuagent.v1.prewarm_pb2 import PrewarmTarget
    from agent.coordinator.fleet import Fleet


class RolloutIncomplete(AgentError):
    """A rollout halted, or left nodes failed or unreached; its record says where."""

    exit_code = 10


@click.group(cls=AgentGroup)
def fleet() -> None:
    """See and change many nodes at once, through their agents' gRPC API (mTLS).

    \b
    Examples:
      gpu-agent fleet status --kubernetes
      gpu-agent fleet apply mig -f mig.yaml -c all-1g.10gb --selector model=*H100* \\
        --agents n1:9401,n2:9401 --max-unavailable 25% --record rollout.json
      gpu-agent fleet plan --demand demand.yaml --out plan.yaml --kubernetes
    """


# -- status ----------------------------------------------------------------------------------


def _status_table(doc: dict[str, Any]) -> str:
    nodes = format_table(
        [
            "NODE",
            "HEALTH",
            "GPU HEALTH",
            "ALLOCATION",
            "GPUS",
            "MODELS",
            "MIG SLICES",
            "IDLE DEVICES",
            "SHARING",
            "WARM",
            "IDLE GPUS",
        ],
        [
            [
                n["name"],
                n["health"] if not n["detail"] else f"{n['health']}: {n['detail']}",
                n.get("gpu_health", "unknown"),
                (n.get("allocation") or {}).get("mode") or "-",
                len(n["gpus"]),
                n["models"],
                " ".join(g["slices"] for g in n["gpus"]) or "-",
                "withheld" if n["idle"] is None else _counts(n["idle"]),
                n["sharing"],
                n["warm"],
                n["idle_gpus"],
            ]
            for n in doc["nodes"]
        ],
    )
    profiles = format_table(
        ["PROFILE", "DEVICES", "IN USE", "IDLE", "CREATABLE"],
        [
            [p["profile"], p["devices"], p["in_use"], p["idle"], p["creatable"]]
            for p in doc["profiles"]
        ],
    )
    marks = _gpu_health_table(doc)
    totals = doc["totals"]
    summary = (
        f"{totals['nodes']} node(s), {totals['reachable']} answering; {totals['gpus']} GPU(s), "
        f"{totals['idle_gpus']} idle for {doc['idle_after']} or more. "
        "MIG SLICES: one character per memory slice: the instance's size in compute slices, "
        "* in use, . free; - whole GPU (MIG off)."
    )
    unknown = sum(p.get("unknown", 0) for p in doc["profiles"])
    if unknown:
        summary += (
            f" {unknown} MIG device(s) on nodes that withhold their process lists from this "
            "identity: whether they are in use is not known (not counted in IN USE or IDLE)."
        )
    if "age_s" in doc:  # answered by a coordinator from its latest sweep
        summary += f" Swept by the coordinator {doc['age_s']:.0f} s ago (--fresh for a new one)."
    if "gpu_health" in totals:
        counts = ", ".join(f"{n} {state}" for state, n in totals["gpu_health"].items() if n)
        summary += f" GPU health: {counts or 'no GPU'}."
    return f"{nodes}\n\n{marks}{profiles}\n\n{summary}"


def _gpu_health_table(doc: dict[str, Any]) -> str:
    """One row per failed or degraded GPU, with the verdict's reason, the action that clears
    it and the pods it names; '' when none (GPUs without a verdict are counted in the summary
    and shown unknown in their node's row)."""
    rows = [
        [
            n["name"],
            g["index"],
            g["health"]["state"],
            g["health"]["reason"] or "-",
            g["health"]["action"] or "-",
            ", ".join(g["health"]["pods"]) or "-",
        ]
        for n in doc["nodes"]
        for g in n["gpus"]
        if "health" in g and g["health"]["state"] in ("failed", "degraded")
    ]
    if not rows:
        return ""
    table = format_table(["NODE", "GPU", "STATE", "REASON", "ACTION", "PODS"], rows)
    return f"{table}\n\n"


def _counts(counts: dict[str, int]) -> str:
    from agent.coordinator.capacity import counts_text

    return counts_text(counts)


@fleet.command("status")
@fleet_options
@click.option("--selector", "-l", default=None, help="Only nodes matching key=value[,key!=value].")
@click.option(
    "--idle-after",
    default="1h",
    show_default=True,
    help="A GPU idle at least this long counts as idle (s, m, h, d).",
)
@click.option(
    "--coordinator",
    "coordinator_url",
    default=None,
    envvar="GPU_AGENT_COORDINATOR",
    help="Ask a running `coordinator serve` (http://HOST:PORT) instead of dialling every agent: "
    "it keeps its connections open, so a large fleet answers in about half the time. The "
    "connection options are then not used.",
)
@click.option(
    "--fresh",
    is_flag=True,
    help="With --coordinator: a new sweep, not the coordinator's latest (up to its "
    "--status-max-age old).",
)
@output_option
def status(
    selector: str | None,
    idle_after: str,
    coordinator_url: str | None,
    fresh: bool,
    output: str,
    **kwargs: Any,
) -> None:
    """One table of the fleet's nodes, and totals per MIG profile.

    Per node: GPUs and models, the MIG layout as a slice map, idle MIG devices, sharing, warm
    cache items, health, and GPUs idle longer than --idle-after.

    \b
    Examples:
      gpu-agent fleet status --agents n1:9401,n2:9401 --tls-dir ./tls -o json
      gpu-agent fleet status --coordinator http://gpu-agent-coordinator.gpu-agent:9400
    """
    from agent.coordinator.query import parse_duration

    options = options_from(kwargs)
    seconds = parse_duration(idle_after)
    if coordinator_url:  # the coordinator checks the selector: nothing heavy loads here
        from agent.coordinator.query import StatusQuery, fetch_status

        doc = fetch_status(coordinator_url, StatusQuery(selector or "", idle_after, fresh))
    else:
        from agent.coordinator.flows import select
        from agent.coordinator.selector import parse_selector
        from agent.coordinator.status import fleet_status, status_document

        chosen = parse_selector(selector)
        selection = run_with_fleet(options, lambda f: select(f, chosen, idle_after_s=seconds))
        doc = status_document(fleet_status(selection.views), idle_after)
    if output == "table":
        click.echo(_status_table(doc))
    elif output == "json":  # already JSON data: skip emit's record walk (0.27 s at 1,000 nodes)
        click.echo(json.dumps({k: doc[k] for k in ("nodes", "profiles", "totals")}, indent=2))
    else:
        emit({k: doc[k] for k in ("nodes", "profiles", "totals")}, output)


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
                _counts(dict(c.before)) + (" (MIG off)" if c.enable_mig else ""),
                _counts(dict(c.after)),
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
        lines.append("Free slices could still hold: " + _counts(dict(p.free_capacity)) + ".")
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
    from agent.coordinator.claimdemand import list_claims, list_templates

    try:
        return list_claims(client), list_templates(client), None
    except AgentError as exc:
        return [], [], f"ResourceClaims not read ({exc}): demand from pods' resources only"


def _with_claims(found: Any, pods: list[object], claims: Any) -> Any:
    from agent.coordinator.claimdemand import demand_from_claims
    from agent.coordinator.clusterdemand import ClusterDemand, with_claims

    listed, templates, problem = claims
    if problem is not None:
        return ClusterDemand(
            found.demand, found.pending, found.running, (*found.notes, problem), found.waiting
        )
    return with_claims(found, demand_from_claims(pods, listed, templates))


def _dra_plan_lines(result: Any) -> list[str]:
    """Nodes the MIG planner left out for their allocation mode, and fragmentation advice."""
    lines = [f"Not planned: {n.node}: {n.reason}" for n in result.not_planned]
    for f in result.fragmented:
        lines.append(f"FRAGMENTED {f.text} (advice: nothing is changed on dynamic MIG nodes)")
    return lines


def _dra_plan_data(result: Any) -> dict[str, Any]:
    return {
        "not_planned": [{"node": n.node, "reason": n.reason} for n in result.not_planned],
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


@fleet.command("plan")
@fleet_options
@click.option(
    "--demand",
    "demand_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Demand file: devices wanted per MIG profile (and per GPU model, priority, pool).",
)
@click.option(
    "--from-cluster",
    is_flag=True,
    help="Take the demand from the cluster: Pending pods' MIG requests and pending ResourceClaims, "
    "plus what running pods and allocated claims hold (the pod's service account, or the API "
    "server in KUBERNETES_SERVICE_HOST).",
)
@click.option("--selector", "-l", default=None, help="Plan over the matching nodes only.")
@click.option(
    "--time-limit",
    type=click.FloatRange(min=1, max=600),
    default=30.0,
    show_default=True,
    help="Seconds the solver may search; past it the best plan found is used (not proven).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the plan here, for `gpu-agent fleet apply mig --plan`.",
)
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
    from agent.coordinator.demand import load_demand
    from agent.coordinator.flows import plan as plan_flow
    from agent.coordinator.flows import select
    from agent.coordinator.planfile import plan_document
    from agent.coordinator.selector import parse_selector

    if (demand_file is None) == (not from_cluster):
        raise InvalidSpec(
            "give --demand FILE or --from-cluster (one of them)",
            [FieldViolation("demand", "--demand FILE or --from-cluster")],
        )
    notes: tuple[str, ...] = ()
    pods: list[object] = []
    claims: tuple[list[object], list[object], str | None] = ([], [], None)
    waiting: Sequence[Any] = ()
    if demand_file is not None:
        demand = load_demand(demand_file)
        source = str(demand_file)
    else:
        from agent.coordinator.clusterdemand import cluster_client, list_pods

        client = cluster_client()
        pods = list_pods(client)
        claims = _cluster_claims(client)
    chosen = parse_selector(selector)
    selection = run_with_fleet(options_from(kwargs), lambda f: select(f, chosen))
    if not selection.views:
        raise _no_node(chosen)
    if from_cluster:
        from agent.coordinator.clusterdemand import demand_from_pods, sharing_replicas

        replicas = sharing_replicas(v.sharing for v in selection.reachable)
        found = _with_claims(demand_from_pods(pods, replicas), pods, claims)
        demand, notes, source = found.demand, found.notes, "cluster"
        counted = f"{found.pending} pod(s) pending, {found.running} running with MIG devices"
        notes = (counted, *notes)
        waiting = found.waiting
    result = plan_flow(selection, demand, time_limit_s=time_limit, waiting=waiting)
    if out is not None:
        out.write_text(yaml.safe_dump(plan_document(result.plan, source), sort_keys=False))
    if output == "table":
        click.echo(_plan_table({"result": result, "out": out, "notes": notes}))
    else:
        emit(
            {
                "changes": result.plan.changes,
                "unmet": result.plan.unmet,
                "totals": result.plan.totals,
                "created": result.plan.created,
                "destroyed": result.plan.destroyed,
                "mutations": result.plan.mutations,
                "optimal": result.plan.optimal,
                "scratch_destroyed": result.scratch_destroyed,
                "free_slices": result.plan.free_slices,
                "free_capacity": dict(result.plan.free_capacity),
                "unreachable": result.unreachable,
                **_dra_plan_data(result),
                "demand": {"source": source, "entries": demand.entries, "notes": notes},
            },
            output,
        )
    if result.plan.unmet:
        short = sum(u.missing for u in result.plan.unmet)
        raise DemandUnmet(
            f"{short} device(s) of {len(result.plan.unmet)} demand entr"
            f"{'y' if len(result.plan.unmet) == 1 else 'ies'} left unmet: "
            + ", ".join(f"{u.label} short {u.missing}" for u in result.plan.unmet)
        )


def _replay_table(steps: Sequence[Any]) -> str:
    rows = [
        [
            s.label,
            s.demand,
            s.met,
            " ".join(f"{p.priority}:{p.met}/{p.demand}" for p in s.by_priority) or "-",
            _counts(dict(s.unmet)),
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


@fleet.command("replay")
@fleet_options
@click.option(
    "--trace",
    "trace_file",
    type=click.Path(path_type=Path, dir_okay=False),
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
@click.option(
    "--end",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds after the trace's start when the last step ends (for its GPU-hours idle).",
)
@click.option(
    "--report",
    "report_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write one row per step and priority here: .csv or .json.",
)
@click.option(
    "--svg",
    "svg_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Draw demand, capacity and met devices over time into this SVG file.",
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
    from agent.coordinator.catalog import preset_layouts
    from agent.coordinator.demand import load_trace
    from agent.coordinator.flows import replay_trace, select
    from agent.coordinator.planner import NodeLayouts
    from agent.coordinator.replayreport import report_csv, report_json, report_svg
    from agent.coordinator.selector import parse_selector

    if report_file is not None and report_file.suffix not in (".csv", ".json"):
        raise InvalidSpec(
            f"--report {report_file}: the name must end in .csv or .json",
            [FieldViolation("report", ".csv or .json")],
        )
    _refuse_overwriting(trace_file, {"report": report_file, "svg": svg_file})
    steps = load_trace(trace_file)
    extra: list[tuple[str, NodeLayouts]] = []
    for spec in added:
        preset, _, count = spec.partition("=")
        if not count.isdigit() or not 1 <= int(count) <= 10_000:
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
        report_file.write_text(render(results))
    if svg_file is not None:
        svg_file.write_text(report_svg(results, f"Demand vs capacity: {trace_file.name}"))
    emit(list(results), output, _replay_table)


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # hard links and bind mounts too
    except OSError:
        return False  # one of them does not exist yet


def _refuse_overwriting(trace_file: Path, outputs: dict[str, Path | None]) -> None:
    """Refuse before reading anything when an output would overwrite the trace or another output."""
    named = [(flag, path) for flag, path in outputs.items() if path is not None]
    for i, (flag, path) in enumerate(named):
        if _same_file(path, trace_file):
            raise InvalidSpec(
                f"--{flag} {path} is the input trace {trace_file}: writing it would destroy the "
                "trace; name another file",
                [FieldViolation(flag, f"a file other than --trace {trace_file}")],
            )
        for other_flag, other in named[i + 1 :]:
            if _same_file(path, other):
                raise InvalidSpec(
                    f"--{flag} and --{other_flag} are both {path}: name two files",
                    [FieldViolation(other_flag, f"a file other than --{flag} {path}")],
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


@fleet.command("rightsize")
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
@click.option(
    "--headroom",
    type=click.FloatRange(min=0, max=4),
    default=0.2,
    show_default=True,
    help="Margin over the peaks a smaller profile must still hold (0.2 = 20%).",
)
@click.option(
    "--demand-out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
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
    from agent.coordinator.catalog import Catalog
    from agent.coordinator.demand import demand_yaml
    from agent.coordinator.flows import observe, select
    from agent.coordinator.query import parse_duration
    from agent.coordinator.rightsize import rightsized_demand, suggest
    from agent.coordinator.selector import parse_selector

    window_s, every_s = parse_duration(window), parse_duration(every)
    if not 0 <= window_s <= 7 * 86400:
        raise InvalidSpec(
            f"--window {window} is not 0..7d", [FieldViolation("window", "0 to 7d, e.g. 1h")]
        )
    if window_s > 0 and not 1 <= every_s <= window_s:
        raise InvalidSpec(
            f"--every {every} is not 1s..--window", [FieldViolation("every", "1s up to --window")]
        )
    samples = 1 if window_s == 0 else int(window_s // every_s) + 1
    chosen = parse_selector(selector)

    async def work(f: Fleet) -> Any:
        selection = await select(f, chosen)
        if not selection.views:
            raise _no_node(chosen)
        return selection, await observe(f, selection, samples=samples, every_s=every_s)

    selection, observed = run_with_fleet(options_from(kwargs), work)
    seen = [g for v in selection.reachable for g in v.layouts]
    catalog = Catalog(seen)  # a GPU with MIG off reports no profiles: its model's
    suggestions = suggest(observed, {g.gpu.uuid: catalog.complete(g) for g in seen}, headroom)
    if demand_out is not None:
        demand_out.write_text(
            demand_yaml(
                rightsized_demand(suggestions),
                f"From `gpu-agent fleet rightsize` over {window} (headroom {headroom:.0%}).",
            )
        )
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


# -- rollouts --------------------------------------------------------------------------------


on_unhealthy_option = click.option(
    "--on-unhealthy",
    type=click.Choice(["stop", "skip"]),
    default="stop",
    show_default=True,
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
        click.option(
            "--node-timeout",
            type=float,
            default=900.0,
            show_default=True,
            help="Seconds one node may take before its operation is cancelled and it fails.",
        ),
        on_unhealthy_option,
        click.option("--dry-run", is_flag=True, help="Show every node's plan; change nothing."),
        click.option(
            "--record",
            "record_file",
            type=click.Path(path_type=Path, dir_okay=False),
            default=None,
            help="Keep the rollout's progress in this JSON file, for `fleet resume`.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return lease_option(fn)


def _report(
    output: str, options: FleetOptions | None = None, kind: str = ""
) -> Callable[[str, Any, str], None]:
    """Node steps on stderr (table output), and as Events on the Node when a Kubernetes API is
    configured (``options``), as `coordinator serve` posts them."""
    import asyncio

    last: dict[str, str] = {}
    cluster = None
    kube = options.kube() if options is not None else None
    if kube is not None:
        from agent.coordinator.cluster import ClusterReport
        from agent.coordinator.lease import default_identity

        identity = "fleet-apply/" + default_identity()
        cluster = ClusterReport(kube, options.namespace if options else "", identity)

    def report(node: str, state: Any, detail: str) -> None:
        if cluster is not None and (state.finished or detail == "started"):
            # Off the loop; asyncio.run waits for these before the command exits.
            loop = asyncio.get_running_loop()
            loop.run_in_executor(None, cluster.node_step, kind, node, state.value, detail)
        line = f"{state.value}: {detail}" if detail else state.value
        if output == "table" and last.get(node) != line:
            last[node] = line
            click.echo(f"{node}: {line}", err=True)

    return report


def _rollout_table(result: Any) -> str:
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


def _health_lines(result: Any) -> list[str]:
    """The nodes a rollout left out for a failed GPU, and the degraded ones it went ahead on."""
    lines = [f"Skipped (GPU failed): {n}: {why}." for n, why in result.unhealthy.items()]
    lines += [f"Degraded (changed all the same): {n}: {why}." for n, why in result.degraded.items()]
    lines += [f"Skipped (allocation mode): {n}: {why}." for n, why in result.not_allowed.items()]
    return lines


def _finish(result: Any, output: str) -> None:
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
    reason = result.record.halted or "some nodes failed or did not answer"
    if result.unhealthy and not result.record.halted:
        reason = (
            f"{len(result.unhealthy)} node(s) skipped for a failed GPU "
            f"({', '.join(result.unhealthy)})"
            + ("; others failed or did not answer" if _others_left(result) else "")
        )
    if result.not_allowed and not result.record.halted:
        reason = (
            f"{len(result.not_allowed)} node(s) skipped: their allocation mode allows no MIG "
            f"change ({', '.join(result.not_allowed)})"
        )
    if result.busy:
        reason = (
            f"{len(result.busy)} node(s) mid-change by an operation this rollout did not start "
            f"({', '.join(result.busy)}), counted against max-unavailable"
        )
    raise RolloutIncomplete(f"the rollout is incomplete ({reason}); {hint}")


def _others_left(result: Any) -> bool:
    """Nodes other than the unhealthy ones that did not end succeeded or unchanged."""
    done = ("succeeded", "unchanged")
    return any(
        r.state not in done
        for n, r in result.record.nodes.items()
        if n not in result.unhealthy and n not in result.not_allowed
    )


def _start(
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
    from agent.coordinator.flows import rollout as rollout_flow
    from agent.coordinator.flows import select
    from agent.coordinator.record import RolloutRecord
    from agent.coordinator.selector import parse_selector

    chosen = parse_selector(selector)
    dry_run = rollout.pop("dry_run")
    path = rollout.pop("record_file")
    lease = rollout.pop("lease_name")

    async def work(fleet: Fleet) -> Any:
        selection = await select(fleet, chosen)
        names = [v.name for v in selection.views if nodes is None or v.name in nodes]
        if not names:
            raise InvalidSpec(
                f"no node matches the selector {chosen}", [FieldViolation("selector", str(chosen))]
            )
        record = RolloutRecord.start(kind, spec, sorted(names), selector=str(chosen), **rollout)
        record.path = None if dry_run else path
        report = _report(output, None if dry_run else options, kind)
        wrap = None
        if drainer is not None:
            from agent.coordinator.drain import Drain

            kube = drainer

            def wrap(action: Any) -> Any:
                return Drain(action, fleet, selection.targets, record, kube)

        return await rollout_flow(
            fleet, selection, record, dry_run=dry_run, report=report, wrap=wrap
        )

    # The Kubernetes API a drain needs is checked before any node is touched.
    drainer = options.kube(required=True) if drain and not dry_run else None

    # A dry run changes nothing: it needs no Lease.
    _finish(run_with_fleet(options, work, lease=None if dry_run else lease), output)


def _rollout_args(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {
        "max_unavailable": kwargs.pop("max_unavailable"),
        "max_failures": kwargs.pop("max_failures"),
        "node_timeout_s": kwargs.pop("node_timeout"),
        "on_unhealthy": kwargs.pop("on_unhealthy"),
        "dry_run": kwargs.pop("dry_run"),
        "record_file": kwargs.pop("record_file"),
        "lease_name": kwargs.pop("lease_name"),
    }


@fleet.group("apply", cls=AgentGroup)
def apply() -> None:
    """Roll a MIG layout or a sharing config across nodes, a few at a time."""


@apply.command("mig")
@fleet_options
@rollout_options
@click.option(
    "--file",
    "-f",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="mig-parted v1 config file.",
)
@click.option("--config", "-c", "config_name", default="", help="Config name in the file.")
@click.option(
    "--plan",
    "plan_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A plan from `fleet plan --out`: each node gets its own config.",
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
    from agent.coordinator.planfile import PLAN_CONFIG, load_plan
    from agent.mig.spec import load_spec

    rollout = _rollout_args(kwargs)
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
        text = config_file.read_text()
        name, _ = load_spec(config_file, text).select(config_name or None)
        spec = {"config_yaml": text, "config_name": name}
        nodes = None
    _start(options_from(kwargs), "mig", spec, selector, rollout, output, nodes, drain=drain)


@apply.command("share")
@fleet_options
@rollout_options
@click.option(
    "--strategy", type=click.Choice(["time-slicing", "mps"]), default=None, help="How to share."
)
@click.option("--replicas", type=click.IntRange(min=2), default=None, help="Replicas per device.")
@click.option(
    "--resource",
    "resources",
    multiple=True,
    default=("nvidia.com/gpu",),
    show_default=True,
    help="Resources to share (repeat for several).",
)
@click.option("--rename", is_flag=True, help="Advertise shared resources as <name>.shared.")
@click.option(
    "--file",
    "-f",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A whole device-plugin config file instead.",
)
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
    from agent._proto.gpuagent.v1 import sharing_pb2
    from agent.sharing.request import requested_config

    rollout = _rollout_args(kwargs)
    if config_file is not None:
        request = sharing_pb2.SetSharingRequest(config_yaml=config_file.read_text())
    elif strategy is not None and replicas is not None:
        request = sharing_pb2.SetSharingRequest(
            spec=sharing_pb2.SharingSpec(
                strategy=(
                    sharing_pb2.SHARING_STRATEGY_TIME_SLICING
                    if strategy == "time-slicing"
                    else sharing_pb2.SHARING_STRATEGY_MPS
                ),
                resources=[
                    sharing_pb2.SharedResource(name=r, replicas=replicas) for r in resources
                ],
                rename_by_default=rename,
            )
        )
    else:
        raise InvalidSpec(
            "give --strategy and --replicas, or -f with a device-plugin config file",
            [FieldViolation("strategy", "time-slicing or mps, with --replicas N >= 2")],
        )
    # A malformed file is one clear error here, not the same refusal from every node.
    requested_config(request)
    spec = {"request": json_format.MessageToDict(request)}
    _start(options_from(kwargs), "share", spec, selector, rollout, output)


@fleet.command("prewarm")
@fleet_options
@rollout_options
@click.option("--url", default=None, help="File to fetch (https://, or http:// where allowed).")
@click.option("--sha256", default="", help="Expected sha256 of the file.")
@click.option("--image", default=None, help="Container image to pull instead.")
@click.option("--runtime-handler", default="", help="CRI runtime handler, e.g. nydus.")
@click.option(
    "--model", default=None, metavar="REPO", help="Model repo snapshot to warm as one item."
)
@click.option("--revision", default="", help="The model's branch, tag or commit (default main).")
@click.option(
    "--endpoint",
    default="",
    help="Hub serving the model (/api/models/... and /<repo>/resolve/...); default huggingface.co.",
)
@click.option(
    "--include",
    multiple=True,
    metavar="GLOB",
    help="Only the model's files matching GLOB (repeatable); all files without it.",
)
@click.option("--name", "item_name", default="", help="Item name (the node label's name).")
@click.option("--pin", is_flag=True, help="Never evict it.")
@click.option(
    "--header-file",
    "header_files",
    multiple=True,
    metavar="HEADER=PATH",
    help="A header whose value each node reads from a file (a mounted secret).",
)
@output_option
def prewarm(
    url: str | None,
    sha256: str,
    image: str | None,
    runtime_handler: str,
    model: str | None,
    revision: str,
    endpoint: str,
    include: tuple[str, ...],
    item_name: str,
    pin: bool,
    header_files: tuple[str, ...],
    selector: str | None,
    output: str,
    **kwargs: Any,
) -> None:
    """Warm one file, image or model on many nodes, at most --max-unavailable nodes fetching
    at once.

    --max-unavailable is the concurrency here: it keeps the origin from being stampeded. Each
    node's readiness is reported as it comes, until every node is warm or failed. A model
    (--model) is a repo snapshot warmed and labelled as one item on each node.

    \b
    Examples:
      gpu-agent fleet prewarm --url https://models.example/llama.safetensors \\
        --sha256 9f86d0... --name llama-8b --max-unavailable 20 --max-failures 0 --kubernetes
      gpu-agent fleet prewarm --model meta-llama/Llama-3.1-8B-Instruct --name llama-8b \\
        --include '*.json' --include '*.safetensors' --header-file Authorization=/secrets/hf \\
        --max-unavailable 10 --max-failures 0 --kubernetes
    """
    rollout = _rollout_args(kwargs)
    target = _prewarm_target(
        {"url": url, "image": image, "model": model},
        {
            "sha256": sha256,
            "runtime_handler": runtime_handler,
            "revision": revision,
            "endpoint": endpoint,
            "include": include,
        },
        item_name,
        pin,
        header_files,
    )
    spec = {"targets": [json_format.MessageToDict(target)]}
    _start(options_from(kwargs), "prewarm", spec, selector, rollout, output)


_MODEL_OPTION = {"model.repo": "model"}
#: The options that belong to one source only, and that source.
_SOURCE_OPTIONS = {
    "sha256": "url",
    "runtime_handler": "image",
    "revision": "model",
    "endpoint": "model",
    "include": "model",
}


def _prewarm_target(
    sources: dict[str, str | None],
    extras: dict[str, Any],
    name: str,
    pin: bool,
    header_files: tuple[str, ...],
) -> PrewarmTarget:
    """The one PrewarmTarget the options ask for; a bad combination is refused here, naming
    the option, before any node is contacted."""
    from agent._proto.gpuagent.v1 import prewarm_pb2
    from agent.coordinator.targets import model_violations

    given = [k for k, v in sources.items() if v is not None]
    if len(given) != 1:
        raise InvalidSpec(
            "give exactly one of --url, --image, --model",
            [FieldViolation(given[1] if len(given) > 1 else "url", "--url, --image or --model")],
        )
    (source,) = given
    stray = [k for k, v in extras.items() if v and _SOURCE_OPTIONS[k] != source]
    if stray:
        option = "--" + stray[0].replace("_", "-")
        raise InvalidSpec(
            f"{option} is for --{_SOURCE_OPTIONS[stray[0]]}, not --{source}",
            [FieldViolation(stray[0], f"only with --{_SOURCE_OPTIONS[stray[0]]}")],
        )
    headers = {}
    for spec in header_files:
        key, sep, path = spec.partition("=")
        if not sep or not key or not path:
            raise InvalidSpec(
                f"--header-file {spec!r}: expected HEADER=PATH",
                [FieldViolation("header_files", "HEADER=PATH")],
            )
        headers[key] = path
    if source == "image":
        if headers:
            raise InvalidSpec(
                "--header-file is for --url and --model; image pulls use the node's "
                "registry credentials",
                [FieldViolation("header_files", "only with --url or --model")],
            )
        return prewarm_pb2.PrewarmTarget(
            image=prewarm_pb2.ImageTarget(
                ref=sources["image"] or "",
                name=name,
                runtime_handler=extras["runtime_handler"],
                pin=pin,
            )
        )
    if source == "url":
        return prewarm_pb2.PrewarmTarget(
            file=prewarm_pb2.FileTarget(
                url=sources["url"] or "",
                name=name,
                sha256=extras["sha256"],
                pin=pin,
                header_files=headers,
            )
        )
    model = prewarm_pb2.ModelTarget(
        repo=sources["model"] or "",
        revision=extras["revision"],
        endpoint=extras["endpoint"],
        include=list(extras["include"]),
        name=name,
        pin=pin,
        header_files=headers,
    )
    # Fields named as the options are: --model is the repo.
    bad = [
        FieldViolation(_MODEL_OPTION.get(v.field, v.field.removeprefix("model.")), v.description)
        for v in model_violations(model, "model")
    ]
    if bad:
        raise InvalidSpec(f"--model: {bad[0].field}: {bad[0].description}", bad)
    return prewarm_pb2.PrewarmTarget(model=model)


@fleet.command("resume")
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
@click.option(
    "--node-timeout",
    type=click.FloatRange(min=1.0),
    default=None,
    help="Change the record's limit: seconds one node may take.",
)
@click.option(
    "--on-unhealthy",
    type=click.Choice(["stop", "skip"]),
    default=None,
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
    from agent.coordinator.flows import rollout as rollout_flow
    from agent.coordinator.flows import select
    from agent.coordinator.record import RolloutRecord
    from agent.coordinator.rollout import parse_max_unavailable
    from agent.coordinator.selector import Selector

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

    async def work(fleet: Fleet) -> Any:
        selection = await select(fleet, Selector())
        order = record.resume()
        if dry_run:
            record.path = None
        report = _report(output, None if dry_run else options, record.kind)
        return await rollout_flow(
            fleet, selection, record, order=order, dry_run=dry_run, report=report
        )

    options = options_from(kwargs)
    lease = None if dry_run else lease_name
    _finish(run_with_fleet(options, work, lease=lease), output)


def _add_remediate() -> None:
    from agent.cli.fleet_remediate import remediate

    fleet.add_command(remediate)


_add_remediate()
