"""``gpu-agent doctor``: what each duty of the agent needs, checked read-only, with the fix.

The node's agent answers (its ``Doctor`` call): the running one, or one embedded for this
command when none runs, so both give the same checks. The exit code is the worst state.
"""

from __future__ import annotations

from typing import Any

import click

from agent.cli.context import CliContext
from agent.cli.render import emit, format_table, output_option
from agent.wire.doctor import CheckState, DoctorReport

__all__ = ["DEGRADED_EXIT", "FAILED_EXIT", "doctor", "doctor_view", "exit_code"]

#: Exit codes by the worst check (docs/api.md, "Exit codes"); past the domain errors' 1-12.
DEGRADED_EXIT = 20
FAILED_EXIT = 21
_CODES = {CheckState.OK: 0, CheckState.DEGRADED: DEGRADED_EXIT, CheckState.FAILED: FAILED_EXIT}


def exit_code(state: CheckState) -> int:
    return _CODES[state]


def doctor_view(report: DoctorReport) -> dict[str, Any]:
    """``-o json``: ``{"node", "checks": [{"duty", "name", "state", "evidence", "fix"}]}``."""
    return {
        "node": report.node,
        "checks": [
            {
                "duty": c.duty,
                "name": c.name,
                "state": c.state.value,
                "evidence": c.evidence,
                "fix": c.fix,
            }
            for c in report.checks
        ],
    }


def _table(view: dict[str, Any]) -> str:
    checks = view["checks"]
    table = format_table(
        ["DUTY", "CHECK", "STATE", "EVIDENCE"],
        [[c["duty"], c["name"], c["state"], c["evidence"]] for c in checks],
    )
    order = {"failed": 0, "degraded": 1}
    bad = sorted((c for c in checks if c["state"] in order), key=lambda c: order[c["state"]])
    parts = [table]
    if bad:
        parts += ["", "To fix, most severe first:"]
        parts += [f"  {c['duty']}/{c['name']} ({c['state']}): {c['fix']}" for c in bad]
    counts = {s: sum(1 for c in checks if c["state"] == s) for s in ("ok", "degraded", "failed")}
    parts += [
        "",
        f"{view['node']}: {len(checks)} checks, {counts['ok']} ok, {counts['degraded']} "
        f"degraded, {counts['failed']} failed",
    ]
    return "\n".join(parts)


@click.command()
@output_option
@click.pass_obj
@click.pass_context
def doctor(ctx: click.Context, obj: CliContext, output: str) -> None:
    """Check, read-only, what each duty of the agent needs, and say the fix.

    One check or more per duty (telemetry, mig, sharing, prewarm, power, health, api,
    kubernetes, state): ok, degraded or failed, the evidence, and the one fix. Changes nothing;
    answers in under 10 s, through the running agent or one embedded for the command.

    Exit code: 0 all ok, 20 the worst is degraded, 21 a check failed.

    \b
    Examples:
      gpu-agent doctor
      gpu-agent --simulate dgx-h100 --state-dir /tmp/node doctor -o json
    """
    report = obj.agent().doctor()
    emit(doctor_view(report), output, _table)
    code = exit_code(report.worst)
    if code:
        ctx.exit(code)
