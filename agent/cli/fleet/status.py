"""``gpu-agent fleet status``: the fleet in totals and MIG profiles, the nodes that need
attention, and with ``--nodes`` every node's GPUs, MIG devices, sharing and health marks."""

from __future__ import annotations

import json
from typing import Any

import click

from agent.cli.coordinator import (
    fleet_options,
    options_from,
    run_with_fleet,
)
from agent.cli.render import emit, format_table, output_option

# -- status ----------------------------------------------------------------------------------


#: the keys of the JSON and YAML answer (docs/coordinator.md, "fleet status"); ``nodes`` only
#: with --nodes
_KEYS = ("totals", "profiles", "attention", "nodes")


def _status_table(doc: dict[str, Any]) -> str:
    listed = doc["nodes"] if "nodes" in doc else doc["attention"]
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
                len(n["gpus"]) if n.get("gpus_read", True) else "? (not read)",
                n["models"],
                " ".join(g["slices"] for g in n["gpus"]) or "-",
                _idle_cell(n),
                n["sharing"],
                n["warm"],
                n["idle_gpus"],
            ]
            for n in listed
        ],
    )
    if "nodes" not in doc:
        nodes = _attention_heading(doc) + (nodes if listed else "")
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
        f"{totals['nodes']} node(s), {totals['reachable']} answering; {totals['gpus']} GPU(s)"
        f"{_unread(totals)}, {totals['idle_gpus']} idle for {doc['idle_after']} or more"
        f"{_idle_unknown(totals)}. "
        "MIG SLICES: one character per memory slice: the instance's size in compute slices, "
        "* in use, . free; - whole GPU (MIG off); lost: fell off the bus, layout unknown; "
        "unread: listed, but its reads fail (it may need a reset), layout unknown."
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
        none = "none read" if _unread(totals) else "no GPU"
        summary += f" GPU health: {counts or none}."
    states = ", ".join(f"{n} {state}" for state, n in totals["node_health"].items() if n)
    summary += f" Nodes: {states or 'none'}."
    return f"{nodes}\n\n{marks}{profiles}\n\n{summary}"


def _idle_cell(node: dict[str, Any]) -> str:
    if node["health"] == "unreachable":
        return "-"
    return "withheld" if node["idle"] is None else counts_text(node["idle"])


def _idle_unknown(totals: dict[str, Any]) -> str:
    unknown = totals.get("idle_unknown_nodes", 0)  # a coordinator from before the key: none
    return f" (idle time unknown on {unknown} node(s))" if unknown else ""


def _unread(totals: dict[str, Any]) -> str:
    """How many nodes' GPUs are not in the count: their driver is not ready, or they did not
    answer."""
    driverless = totals.get("gpus_unread_nodes", 0)
    silent = totals["nodes"] - totals["reachable"]
    why = {"driver not ready": driverless, "not answering": silent}
    said = [f"{n} {what}" if driverless and silent else what for what, n in why.items() if n]
    if not said:
        return ""
    return f" (and the GPUs of {driverless + silent} node(s) not read: {', '.join(said)})"


def _attention_heading(doc: dict[str, Any]) -> str:
    """What the default table lists, and how to see the rest."""
    count, shown = doc["totals"]["attention"], len(doc["attention"])
    if not count:
        return "No node needs attention (--nodes lists every node).\n"
    more = f", the first {shown} listed" if shown < count else ""
    return (
        f"{count} node(s) need attention (unreachable, unhealthy, or a GPU failed or "
        f"degraded){more}; --nodes lists every node.\n"
    )


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
        for n in doc.get("nodes", doc["attention"])
        for g in n["gpus"]
        if "health" in g and g["health"]["state"] in ("failed", "degraded")
    ]
    if not rows:
        return ""
    table = format_table(["NODE", "GPU", "STATE", "REASON", "ACTION", "PODS"], rows)
    return f"{table}\n\n"


def counts_text(counts: dict[str, int]) -> str:
    """Device counts in words (the coordinator's words, imported when a command runs)."""
    from agent.coordinator.fleet import capacity

    return capacity.counts_text(counts)


@click.command("status")
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
    "--nodes",
    "all_nodes",
    is_flag=True,
    help="Every node's row (JSON/YAML: the nodes list), not only the nodes that need "
    "attention. At thousands of nodes that is megabytes.",
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
    all_nodes: bool,
    output: str,
    **kwargs: Any,
) -> None:
    """The fleet in totals, per MIG profile, and the nodes that need attention.

    Totals count nodes per state (ok, unhealthy, unreachable), GPUs per health verdict, nodes
    per allocation mode and model. A node needs attention when it does not answer, is
    unhealthy, or has a failed or degraded GPU; those are listed (up to 100). --nodes lists
    every node. Per node: GPUs and models, the MIG layout as a slice map, idle MIG devices,
    sharing, warm cache items, health, and GPUs idle longer than --idle-after.

    \b
    Examples:
      gpu-agent fleet status --agents n1:9401,n2:9401 --tls-dir ./tls -o json
      gpu-agent fleet status --coordinator http://gpu-agent-coordinator.gpu-agent:9400
      gpu-agent fleet status --kubernetes --nodes -l pool=train
    """
    from agent.coordinator.fleet.query import parse_duration

    options = options_from(kwargs)
    seconds = parse_duration(idle_after)
    if coordinator_url:  # the coordinator checks the selector: nothing heavy loads here
        from agent.coordinator.fleet.query import StatusQuery, fetch_status

        query = StatusQuery(selector or "", idle_after, fresh, all_nodes)
        doc = fetch_status(coordinator_url, query)
    else:
        from agent.coordinator.fleet.selector import parse_selector
        from agent.coordinator.fleet.status import fleet_status, status_document
        from agent.coordinator.flows import select

        chosen = parse_selector(selector)
        selection = run_with_fleet(options, lambda f: select(f, chosen, idle_after_s=seconds))
        doc = status_document(fleet_status(selection.views), idle_after, nodes=all_nodes)
    shown = {k: doc[k] for k in _KEYS if k in doc}
    if output == "table":
        click.echo(_status_table(doc))
    elif output == "json":  # already JSON data: skip emit's record walk (0.27 s at 1,000 nodes)
        click.echo(json.dumps(shown, indent=2))
    else:
        emit(shown, output)
