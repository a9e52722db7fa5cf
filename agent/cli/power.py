"""``gpu-agent power``: declarative power caps, kept across reboots and driver reloads.

Every command goes through the node's agent (the running one, or one embedded for the
command: `CliContext.agent`), which checks the spec against every GPU, journals and applies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import click

from agent.cli.errors import AgentGroup
from agent.cli.options import read_input
from agent.cli.render import emit, format_table, output_option

if TYPE_CHECKING:
    from agent.client import AgentClient
    from agent.power import Change, GpuPower, PowerResult, PowerView


class PowerContext(Protocol):
    def agent(self) -> AgentClient: ...


@click.group("power", cls=AgentGroup)
def power() -> None:
    """Power caps per GPU, as a spec the agent keeps: set again after every reboot and driver
    reload, which forget `nvidia-smi -pl` (docs/power.md)."""


@power.command("show", short_help="Each GPU's power range, default, set and enforced limits.")
@output_option
@click.pass_obj
def show_command(obj: PowerContext, output: str) -> None:
    """Show each GPU's power limit range, default, set and enforced limits, what the spec in
    force wants, and what `power restore` would put back.

    \b
    Example:
      gpu-agent power show
      gpu-agent power show -o json
    """
    view = obj.agent().get_power()
    lost = _say_lost(obj, "its limits cannot be read")
    data = {
        "spec": view.spec_text or None,
        "gpus": [_gpu(g, view) for g in view.gpus],
        "lost_gpus": lost,
        "unread_gpus": _say_unread(obj, view, lost),
    }
    emit(data, output, _show_table)


@power.command("apply", short_help="Apply a power spec (every GPU checked first).")
@click.option(
    "-f",
    "--file",
    "spec_file",
    metavar="FILE",
    required=True,
    help="The power spec (YAML, version v1; '-' for stdin).",
)
@output_option
@click.pass_obj
def apply_command(obj: PowerContext, spec_file: str, output: str) -> None:
    """Make a spec the node's power caps. The whole spec is checked against every GPU first; a
    limit outside a GPU's range is refused, naming the GPU and its range, and nothing changes.
    The limits from before the first change are kept for `power restore`. A GPU the spec
    names by index or UUID that is lost refuses it (exit 7); `gpus: all` and a model cap the
    GPUs that answer, and a lost one once it answers again.

    \b
    Spec:
      version: v1
      power:
        - gpus: all              # or [0, 1], or GPU UUIDs
          limit: 0.8             # a fraction of the default limit (or "80%")
        - model: H100 80GB HBM3  # the name NVML reports, "NVIDIA " optional
          limit: 500W            # watts
    \b
    Example:
      gpu-agent power apply -f power.yaml
    """
    text = read_input(spec_file, "file")  # refused before the agent is asked
    done = obj.agent().apply_power(text)
    _say_not_held(done.changes)
    lost = _say_pending(done, "capped", "the agent sets the spec's cap when it answers again")
    unread = _say_unread_pending(done, "capped", "the agent sets the spec's cap once it is read")
    result = {"changes": _changes(done.changes), "lost_gpus": lost, "unread_gpus": unread}
    emit(result, output, _changes_table)


@power.command("restore", short_help="Forget the spec; put back the limits from before it.")
@output_option
@click.pass_obj
def restore_command(obj: PowerContext, output: str) -> None:
    """Forget the power spec and put back each GPU's limit from before the agent first changed
    it (usually the default).

    \b
    Example:
      gpu-agent power restore
    """
    done = obj.agent().restore_power()
    _say_not_held(done.changes)
    lost = _say_pending(done, "restored", "the agent puts its limit back when it answers again")
    unread = _say_unread_pending(done, "restored", "the agent puts its limit back once it is read")
    result = {"changes": _changes(done.changes), "lost_gpus": lost, "unread_gpus": unread}
    emit(result, output, _changes_table)


def _say_not_held(changes: Sequence[Change]) -> None:
    """A limit NVML took but the driver does not hold (read back): AFTER is what it holds, so
    the row alone would read as a spec not followed; say what was set beside it."""
    for c in changes:
        if not c.held:
            click.echo(
                f"warning: GPU {c.index} ({c.uuid}): set to {_watts(c.requested_mw):g} W, but the "
                f"driver holds {_watts(c.after_mw):g} W (another writer of the limit on the host?)",
                err=True,
            )


def _say_lost(obj: PowerContext, what: str) -> list[int]:
    """A lost GPU is in no table of the agent's answer: say so, rather than let the rows read
    as every GPU of the node; its index goes in ``lost_gpus`` for scripts."""
    lost = [gpu.layout.gpu.index for gpu in obj.agent().node().gpus if gpu.lost]
    for index in lost:
        click.echo(f"warning: GPU {index} is lost: {what}", err=True)
    return lost


def _say_pending(done: PowerResult, what: str, later: str) -> list[int]:
    """The lost GPUs the agent says the change is for (not those it leaves alone): not in the
    rows, so say so; their indexes go in ``lost_gpus`` for scripts."""
    for g in done.lost:
        click.echo(f"warning: GPU {g.index} is lost: not {what} now; {g.unsure or later}", err=True)
    return [g.index for g in done.lost]


def _say_unread_pending(done: PowerResult, what: str, later: str) -> list[int]:
    """The GPUs the change is for that answer but cannot be read now (one needing a reset):
    in no row either, so say so, with the failing call; their indexes go in ``unread_gpus``."""
    for g in done.unread:
        said = f"warning: GPU {g.index} cannot be read ({g.unread}): not {what} now"
        click.echo(f"{said}; {g.unsure or later}", err=True)
    return [g.index for g in done.unread]


def _say_unread(obj: PowerContext, view: PowerView, lost: list[int]) -> list[int]:
    """A GPU that answers but whose limits cannot be read (no power management) is in no row
    either: say so, rather than let the rows read as every GPU of the node."""
    shown = {g.index for g in view.gpus} | set(lost)
    left = [g for g in obj.agent().node().gpus if g.layout.gpu.index not in shown]
    for gpu in left:
        index = gpu.layout.gpu.index
        if gpu.unread:  # the GPU's own read fails (it may need a reset): say the call
            click.echo(f"warning: GPU {index} cannot be read ({gpu.unread})", err=True)
            continue
        click.echo(
            f"warning: GPU {index}: its power limits cannot be read (no power management, or "
            "NVML refused the read; the agent's log says which)",
            err=True,
        )
    return [g.layout.gpu.index for g in left]


def _watts(milliwatts: int) -> float:
    return milliwatts / 1000


def _gpu(g: GpuPower, view: PowerView) -> dict[str, Any]:
    lim = g.limits
    desired, baseline = view.desired_mw.get(g.uuid), view.baseline_mw.get(g.uuid)
    return {
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "min_w": _watts(lim.min_mw),
        "max_w": _watts(lim.max_mw),
        "default_w": _watts(lim.default_mw),
        "limit_w": _watts(lim.current_mw),
        "enforced_w": _watts(lim.enforced_mw),
        "desired_w": None if desired is None else _watts(desired),
        "baseline_w": None if baseline is None else _watts(baseline),
    }


def _changes(changes: Sequence[Change]) -> list[dict[str, Any]]:
    return [
        {
            "index": c.index,
            "uuid": c.uuid,
            "before_w": _watts(c.before_mw),
            "after_w": _watts(c.after_mw),
            "requested_w": _watts(c.requested_mw),
        }
        for c in changes
    ]


def _w(value: float | None) -> str | None:
    return None if value is None else f"{value:g} W"


def _show_table(data: dict[str, Any]) -> str:
    rows = [
        (
            g["index"],
            g["name"],
            f"{g['min_w']:g}-{g['max_w']:g} W",
            _w(g["default_w"]),
            _w(g["limit_w"]),
            _w(g["enforced_w"]),
            _w(g["desired_w"]),
            _w(g["baseline_w"]),
        )
        for g in data["gpus"]
    ]
    table = format_table(
        ("GPU", "NAME", "RANGE", "DEFAULT", "LIMIT", "ENFORCED", "SPEC", "RESTORES TO"), rows
    )
    return table + ("" if data["spec"] else "\nno power spec applied")


def _changes_table(data: dict[str, Any]) -> str:
    if not data["changes"] and data["lost_gpus"]:
        lost = ", ".join(map(str, data["lost_gpus"]))
        return f"no GPU that answers changed; GPU {lost} lost: not done there (see the warning)"
    if not data["changes"]:
        return "no GPU changed: every limit was already as asked"
    rows = [(c["index"], c["uuid"], _w(c["before_w"]), _w(c["after_w"])) for c in data["changes"]]
    return format_table(("GPU", "UUID", "BEFORE", "AFTER"), rows)
