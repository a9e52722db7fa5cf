"""``gpu-agent fleet doctor``: every node's doctor at once; the fleet's problems grouped."""

from __future__ import annotations

import json
from typing import Any

import click

from agent import safeyaml
from agent.cli.coordinator import fleet_options, options_from, run_with_fleet
from agent.cli.render import emit, format_table, output_option

__all__ = ["doctor"]

#: Exit codes as `gpu-agent doctor`'s (agent/cli/doctor.py), by the fleet's worst node.
_CODES = {"ok": 0, "degraded": 20, "failed": 21}


def _names(nodes: list[str], shown: int) -> str:
    return safeyaml.some(nodes, shown)


def _table(doc: dict[str, Any]) -> str:
    from agent.coordinator.fleet.doctor import SHOWN_NODES

    totals = doc["totals"]
    head = (
        f"{totals['nodes']} node(s): {totals['ok']} ok, {totals['degraded']} degraded, "
        f"{totals['failed']} failed"
    )
    parts = [head]
    if doc["findings"]:
        parts += [
            "",
            format_table(
                ["NODES", "CHECK", "STATE", "EXAMPLE", "FIX"],
                [
                    [
                        f["count"],
                        f"{f['duty']}/{f['name']}",
                        f["state"],
                        f["evidence"],
                        f["fix"],
                    ]
                    for f in doc["findings"]
                ],
            ),
            "",
        ]
        parts += [
            f"{f['duty']}/{f['name']} ({f['state']}): {_names(f['nodes'], SHOWN_NODES)}"
            + (
                f"; another fix on {_names(f['other_fix_nodes'], SHOWN_NODES)} "
                "(gpu-agent doctor there)"
                if f["other_fix_nodes"]
                else ""
            )
            for f in doc["findings"]
        ]
    parts += [
        "",
        format_table(
            ["NODE", "STATE", "FAILED", "DEGRADED"],
            [
                [
                    n["name"],
                    n["state"],
                    ", ".join(n["failed"]) or "-",
                    ", ".join(n["degraded"]) or "-",
                ]
                for n in doc["nodes"]
            ],
        ),
    ]
    return "\n".join(parts)


@click.command("doctor")
@fleet_options
@output_option
@click.pass_context
def doctor(ctx: click.Context, output: str, **kwargs: Any) -> None:
    """Every node's `gpu-agent doctor` at once: the problems grouped by check, most nodes
    first, then one row per node. A node that does not answer is its own group.

    Exit code: 0 every node ok, 20 the worst is degraded, 21 a check failed (or a node did
    not answer).

    \b
    Examples:
      gpu-agent fleet doctor --kubernetes
      gpu-agent fleet doctor --agents n1:9401,n2:9401 --tls-dir ./tls -o json
    """
    from agent.coordinator.fleet.doctor import doctor_document, sweep

    options = options_from(kwargs)
    doc = doctor_document(run_with_fleet(options, sweep))
    if output == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        emit(doc, output, _table)
    totals = doc["totals"]
    code = _CODES["failed"] if totals["failed"] else _CODES["degraded"] if totals["degraded"] else 0
    if code:
        ctx.exit(code)
