"""``gpu-agent mig``: MIG layouts from mig-parted config files (show, plan, apply, assert, export).

The flags, environment variables, messages and exit codes of ``nvidia-mig-parted`` are kept
(reference/mig.md §3.2), so scripts written for it keep working. Every command goes through the
node's agent (the running one, or one embedded for the command): changes (apply, restore) are its
operations, followed to the end; ``plan`` and ``assert`` are the agent's answers (PlanMig, drawn
by agent/cli/mig_plan.py; AssertMig); the other reads take the GPUs as the agent read them
(GetNode) and run the same pure functions on them that the agent runs (agent.mig.node_plan), so
this module opens neither NVML nor the state database.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import yaml

from agent import logs
from agent.cli.context import CliContext
from agent.cli.errors import AgentGroup
from agent.cli.mig_advise import advise_command
from agent.cli.mig_common import PENDING_EXIT, config_options, load_with_text
from agent.cli.mig_plan import plan_command, unread_data
from agent.cli.options import choice_option, write_output
from agent.cli.render import emit, format_table, output_option, plain
from agent.errors import AgentError, FieldViolation, InvalidSpec
from agent.mig.checkpoint import MAX_BYTES as CHECKPOINT_MAX_BYTES
from agent.mig.checkpoint import checkpoint_document, parse_checkpoint
from agent.mig.generate import generate
from agent.mig.hooks import NO_HOOKS, apply_with_hooks, load_hooks
from agent.mig.node_plan import (
    checkpoint_holds,
    refuse_lost,
)
from agent.mig.outcomes import NOT_ANSWERING
from agent.mig.spec import MigSpec, name_problem
from agent.mig.view import show_data, show_text
from agent.wire.operations import MigApplied

if TYPE_CHECKING:
    from agent.client import AgentClient
    from agent.gpu.types import GpuInfo, GpuLayout
    from agent.wire.operations import OperationView

F = TypeVar("F", bound=Callable[..., Any])

_DEBUG = "gpu-agent.mig.debug"
log = logging.getLogger(__name__)


def _layouts(obj: CliContext, feature: str) -> tuple[GpuLayout, ...]:
    return _read(obj, feature)[0]


def _read(
    obj: CliContext, feature: str
) -> tuple[tuple[GpuLayout, ...], tuple[GpuInfo, ...], dict[int, str]]:
    """The node's GPUs as its agent read them, the lost and unread ones, and why each unread
    one is: the one read path. No driver attached is DriverNotReady (exit 11) naming its cause,
    never an empty node. A lost GPU, or one whose layout was not read in the latest sample (a
    failing call: its layout is stale or unknown), is named on stderr and left out of the
    layouts (it can be neither read nor partitioned)."""
    node = obj.agent().node()
    node.require_driver(feature)
    layouts, lost, unread = [], [], {}
    for gpu in node.gpus:
        index = gpu.layout.gpu.index
        if gpu.lost:
            why = gpu.detail or "it does not answer"
            click.echo(f"warning: GPU {index} left out: lost ({why})", err=True)
            lost.append(gpu.layout.gpu)
            continue
        if gpu.unread or gpu.never_read:
            unread[index] = gpu.unread or "never read"
            click.echo(f"warning: GPU {index} left out: not read ({unread[index]})", err=True)
            lost.append(gpu.layout.gpu)
            continue
        layouts.append(gpu.layout)
    return tuple(layouts), tuple(lost), unread


def _refuse_by_mode(obj: CliContext, what: str) -> None:
    """The agent's own refusal of MIG changes (GetNode's ``mig_refusal``), asked before the
    assert that skips a phase already applied: a no-op apply or restore is refused as a real
    one is (exit 12), never "applied"."""
    obj.agent().node().refuse_mig_change(what)


def _load(config_file: str) -> MigSpec:
    return load_with_text(config_file)[0]


@click.group("mig", cls=AgentGroup)
@click.option(
    "--debug", "-d", is_flag=True, help="Debug logging, and show the hooks' output (mig-parted -d)."
)
@click.pass_context
def mig(ctx: click.Context, debug: bool) -> None:
    """MIG partitions: mig-parted config files, applied with as little disruption as possible."""
    ctx.meta[_DEBUG] = debug
    if debug:
        logs.configure(logging.DEBUG)


@mig.command("show", short_help="Show each GPU's slice map: instances, free slices, busy ones.")
@output_option
@click.pass_obj
def show_command(obj: CliContext, output: str) -> None:
    """Show every GPU's memory slices (8, or 4 on A30): which instance holds which, the free
    ones, and (*) instances with running processes.

    \b
    Example:
      gpu-agent --simulate dgx-a100 --state-dir /tmp/node mig show
    """
    layouts = _layouts(obj, "mig show")
    emit(show_data(layouts), output, lambda _: show_text(layouts))


@mig.command("apply", short_help="Apply a config: keep what can stay, roll back on failure.")
@config_options
@click.option(
    "--force",
    is_flag=True,
    help="Go ahead even where running processes use instances that must go (the driver still "
    "refuses to destroy an instance in use, and the apply then rolls back).",
)
@click.option(
    "--skip-reset",
    "-s",
    is_flag=True,
    envvar="MIG_PARTED_SKIP_RESET",
    help="Leave a MIG mode change pending instead of resetting the GPU "
    "(env MIG_PARTED_SKIP_RESET).",
)
@click.option(
    "--mode-only",
    "-m",
    is_flag=True,
    envvar="MIG_PARTED_MODE_CHANGE_ONLY",
    help="Only change the MIG mode of the GPUs whose mode differs; create no instances "
    "(env MIG_PARTED_MODE_CHANGE_ONLY).",
)
@click.option(
    "--hooks-file",
    "-k",
    envvar="MIG_PARTED_HOOKS_FILE",
    metavar="FILE",
    help="mig-parted hooks file: apply-start, pre-apply-mode, pre-apply-config, apply-exit "
    "(env MIG_PARTED_HOOKS_FILE).",
)
@output_option
@click.pass_context
def apply_command(
    ctx: click.Context,
    config_file: str,
    selected: str | None,
    force: bool,
    skip_reset: bool,
    mode_only: bool,
    hooks_file: str | None,
    output: str,
) -> None:
    """Bring every selected GPU to its layout, destroying only the instances that must go and
    creating the others at planned placements. Refused before any change if a layout cannot fit
    or running processes are in the way; on a failure midway every GPU is rolled back. Exits 14
    when a MIG mode change is left pending (docs/mig.md, "Exit codes").

    \b
    Example:
      gpu-agent mig apply -f config.yaml -c all-balanced
      gpu-agent mig apply -f config.yaml -c all-1g.10gb --skip-reset
      gpu-agent mig -d apply --mode-only -f config.yaml -c all-balanced -k hooks.yaml
    """
    obj: CliContext = ctx.obj
    # Bad input is refused here, before anything is asked of anyone.
    log.debug("Parsing config file %s", config_file)
    spec, text = load_with_text(config_file)
    log.debug("Selected MIG config: %s", spec.select(selected)[0])
    if hooks_file:
        log.debug("Parsing hooks file %s", hooks_file)
    hooks = load_hooks(hooks_file) if hooks_file else None
    client = obj.agent()  # the node's agent applies it, as an operation (one path)

    def run(only_mode: bool) -> _Applied:
        op = client.apply_mig(
            text, selected or "", force=force, mode_only=only_mode, skip_reset=skip_reset
        )
        return _follow(client, op, obj.embedded)

    def applied_now(only_mode: bool) -> bool:
        return client.assert_mig(text, selected or "", mode_only=only_mode).applied

    _refuse_by_mode(obj, "mig apply")
    if hooks is None:
        applied = [run(mode_only)]
    else:
        # mig-parted's two phases, so that its hooks run between them.
        env = {
            "MIG_PARTED_CONFIG_FILE": config_file,
            "MIG_PARTED_SELECTED_CONFIG": selected or "",
            "MIG_PARTED_HOOKS_FILE": hooks_file or "",
            "MIG_PARTED_SKIP_RESET": _go_bool(skip_reset),
            "MIG_PARTED_MODE_CHANGE_ONLY": _go_bool(mode_only),
        }
        applier = _Applier(run, applied_now)
        applied = apply_with_hooks(
            hooks, env, applier, output=ctx.meta.get(_DEBUG, False), mode_only=mode_only
        )
    if not applied:  # every phase was already applied: nothing was asked of the GPUs
        emit({"config": spec.select(selected)[0], "gpus": []}, output, lambda _: _verdict([]))
        return
    last = applied[-1]
    _say_unheld(last.unheld)  # no GPU planned: selected by no entry, or not MIG-capable
    emit(last.data, output, lambda _: last.table)
    if last.pending:
        raise click.exceptions.Exit(PENDING_EXIT)
    if last.lost:
        raise click.exceptions.Exit(1)


def _say_unheld(mismatches: Sequence[str]) -> None:
    """An apply that planned no GPU succeeds, as mig-parted's does, but where the agent's assert
    of the config still fails (its entries select none of these GPUs: another model's device
    filter, indices the node lacks) that is said, not left to the next `mig assert`: the
    apply's result carries the assert's lines (``assert_mismatches``)."""
    for line in mismatches:
        click.echo(f"warning: {line}", err=True)
    if mismatches:
        click.echo("warning: no GPU changed, and `mig assert` of this config fails", err=True)


@dataclass(frozen=True, slots=True)
class _Applied:
    """One reconfiguration's result: its data (for -o json/yaml), its table and the messages of
    the GPUs left with a MIG mode change pending."""

    data: Any
    table: str
    pending: list[str]
    #: messages of the GPUs the config selects that are lost: not applied
    lost: list[str] = field(default_factory=list)
    #: when the config selected no GPU: why its assert fails (the agent's lines)
    unheld: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class _Applier:
    """mig-parted's `MigConfigApplier` over the agent, for an apply or a restore: a phase is
    one call with ``mode_only`` (``run``), asserted first against the node (``holds``)."""

    run: Callable[[bool], _Applied]
    holds: Callable[[bool], bool]

    def mode_applied(self) -> bool:
        return self.holds(True)

    def apply_mode(self) -> _Applied:
        return self.run(True)

    def config_applied(self) -> bool:
        return self.holds(False)

    def apply_config(self) -> _Applied:
        return self.run(False)

    def stop_after_mode(self, result: _Applied) -> bool:
        return bool(result.pending)


def _go_bool(value: bool) -> str:
    return "true" if value else "false"  # as mig-parted formats its flags for hooks (%v)


def _step_line(phase: str, mutation: int, message: str) -> str:
    """``[12] apply: GPU 3: create ...`` per mutation, ``GPU 3 done`` per GPU."""
    return message if phase == "done" else f"[{mutation}] {phase}: {message}"


def _follow(client: AgentClient, op: OperationView, embedded: bool) -> _Applied:
    """Follow a ``mig.apply`` operation (an apply or a restore) to its end, one line per step.
    Ctrl-C detaches from a running agent's operation, which goes on; an embedded agent stops
    with the command, as ``serve`` stops (an apply is suspended, a restore rolled back)."""
    click.echo(f"reconfiguring through the node's agent: {op.name}", err=True)
    printed: set[tuple[str, int, str]] = set()
    finished: list[int] = []
    latest = [op]

    def progress(update: OperationView) -> None:
        # Updates repeat (a forced one per GPU, then the operation's end): one line per step.
        # A watcher may miss one, so the GPUs done come from the list each update carries.
        latest[0] = update
        meta = update.mig_progress
        if meta is None:
            return
        for index in meta.done_gpus[len(finished) :]:
            finished.append(index)
            click.echo(f"GPU {index} done", err=True)
        key = (meta.phase, meta.steps_done, meta.current_step)
        said = meta.phase == "done" and bool(meta.done_gpus)  # the list said it
        if meta.current_step and key not in printed and not said:
            printed.add(key)
            click.echo(_step_line(meta.phase, meta.steps_done, meta.current_step), err=True)

    try:
        done = client.follow(op, progress)
    except AgentError:
        # Failed only because a GPU is pending or lost: what it did is the answer, said as
        # before (PENDING_EXIT, or 1 for a lost GPU).
        if latest[0].mig_result is None:
            raise
        done = latest[0]
    except KeyboardInterrupt:
        if embedded:
            click.echo(f"interrupted: {op.name} stops with this command's agent", err=True)
        else:
            click.echo(
                f"detached from {op.name}; the node's agent carries on with it "
                f"(gpu-agent operations wait {op.name} follows it)",
                err=True,
            )
        raise SystemExit(130) from None
    result = done.mig_result
    if result is None:  # an agent that answered without the result: nothing was done
        result = MigApplied("", (), False, (), 0, ())
    data = plain(result)
    pending = [g.message for g in result.gpus if g.status == "pending"]
    lost = [g.message for g in result.gpus if g.status in NOT_ANSWERING]
    return _Applied(data, _apply_table(result), pending, lost, result.assert_mismatches)


def _apply_table(result: MigApplied) -> str:
    rows = [[g.gpu_index, g.status, g.kept, g.destroyed, g.created] for g in result.gpus]
    pending = [g.message for g in result.gpus if g.status == "pending"]
    lost = [g.message for g in result.gpus if g.status in NOT_ANSWERING]
    plugin = [f"Device plugin: {result.device_plugin}"] if result.device_plugin else []
    table = format_table(_APPLY_HEADERS, rows)
    return "\n".join([*result.recovered, table, *plugin, _verdict(pending, lost)])


_APPLY_HEADERS = ["GPU", "STATUS", "KEPT", "DESTROYED", "CREATED"]


def _verdict(pending: list[str], lost: Sequence[str] = ()) -> str:
    """mig-parted's success line, or why the config is not applied yet (exit PENDING_EXIT), or
    not on every GPU it selects: some are lost (exit 1, as mig-parted's NVML error)."""
    if pending:  # the lost are named too: a reset alone would not apply the config
        return "\n".join(
            [
                *pending,
                *lost,
                "MIG configuration NOT applied yet: a MIG mode change is pending (see above)",
            ]
        )
    if lost:
        gone = (
            "some are lost"
            if all("cannot be read" not in m for m in lost)
            else ("some are lost or cannot be read")
        )
        return "\n".join([*lost, f"MIG configuration NOT applied to every GPU: {gone}"])
    return "MIG configuration applied successfully"


@mig.command("assert", short_help="Exit 0 if the config is applied, 1 if not (mig-parted).")
@config_options
@click.option("--mode-only", "-m", is_flag=True, help="Only check the MIG mode, not the instances.")
@click.option(
    "--valid-config",
    "-a",
    is_flag=True,
    help="Only check that the file is valid and has the config.",
)
@output_option
@click.pass_obj
def assert_command(
    obj: CliContext,
    config_file: str,
    selected: str | None,
    mode_only: bool,
    valid_config: bool,
    output: str,
) -> None:
    """Check that the selected config is applied: every GPU selected, in the right MIG mode, with
    the right counts per profile (placement ignored, as in mig-parted). Exit 1 if it is not.

    \b
    Example:
      gpu-agent mig assert -f config.yaml -c all-balanced && echo ready
    """
    spec, text = load_with_text(config_file)
    spec.select(selected)  # an unknown config is refused here, before the agent is asked
    if valid_config:
        click.echo("Selected MIG configuration is valid")
        return
    result = obj.agent().assert_mig(text, selected or "", mode_only=mode_only)
    if output != "table":
        emit({**plain(result), "unread": unread_data(result.unread)}, output)
    elif result.applied:
        what = "MIG mode settings from configuration" if mode_only else "MIG configuration"
        click.echo(f"Selected {what} currently applied")
    else:
        for line in result.mismatches:
            click.echo(f"  {line}", err=True)
        click.echo("Assertion failure: selected configuration not currently applied", err=True)
    if not result.applied:
        raise click.exceptions.Exit(1)


@mig.command("export", short_help="Print the current layout as a mig-parted config.")
@choice_option(
    "--output-format", "-o", choices=["yaml", "json"], default="yaml", help="Format of the config."
)
@click.option(
    "--config-label", "-l", default="current", show_default=True, help="Name of the config written."
)
@click.pass_obj
def export_command(obj: CliContext, output_format: str, config_label: str) -> None:
    """Print the node's current MIG state as a mig-parted v1 config (GPUs with equal layouts
    share an entry), ready for `mig apply` on another node.

    \b
    Example:
      gpu-agent mig export -l golden > golden.yaml
    """
    if bad := name_problem(config_label, "config-label"):  # named as the user gave it
        raise InvalidSpec("--config-label is too long or not printable", [bad])
    document = yaml.safe_load(obj.agent().export_mig(config_label))  # the agent's own answer
    emit(document, output_format)


@mig.command(
    "generate-config", short_help="Print every MIG layout this node's GPUs can hold (mig-parted)."
)
@click.option(
    "--output-file",
    "-f",
    envvar="MIG_PARTED_OUTPUT_FILE",
    metavar="FILE",
    help="Write here instead of stdout (env MIG_PARTED_OUTPUT_FILE).",
)
@choice_option(
    "--output-format",
    "-o",
    choices=["yaml", "json"],
    default="yaml",
    envvar="MIG_PARTED_OUTPUT_FORMAT",
    help="Format of the config (env MIG_PARTED_OUTPUT_FORMAT).",
)
@click.pass_obj
def generate_config_command(obj: CliContext, output_file: str | None, output_format: str) -> None:
    """A mig-parted v1 config with mig-parted's generated configs (all-disabled, all-enabled,
    all-balanced, all-<profile>) and one layout-... config for every set of GPU instances that
    fits on each GPU model of this node, from the profiles and placements the driver reports.

    \b
    Example:
      gpu-agent mig generate-config -f /etc/nvidia-mig-manager/generated.yaml
    """
    generated = generate(_layouts(obj, "mig generate-config"))
    for index, why in generated.skipped:
        click.echo(f"warning: GPU {index} left out: {why}", err=True)
    document = generated.document
    text = (
        json.dumps(document, indent=2) + "\n"
        if output_format == "json"
        else yaml.safe_dump(document, sort_keys=False)
    )
    if output_file:
        write_output(Path(output_file), text, "output-file")
    else:
        click.echo(text, nl=False)


def _checkpoint_file(verb: str) -> Callable[[F], F]:
    """-f: mig-parted's checkpoint file, which ``checkpoint`` writes and ``restore`` reads."""
    return click.option(
        "--checkpoint-file",
        "-f",
        envvar="MIG_PARTED_CHECKPOINT_FILE",
        required=True,
        metavar="FILE",
        help=f"Checkpoint file to {verb} (env MIG_PARTED_CHECKPOINT_FILE).",
    )


@mig.command("checkpoint", short_help="Save every GPU's exact MIG state to a file (mig-parted).")
@_checkpoint_file("write")
@click.pass_obj
def checkpoint_command(obj: CliContext, checkpoint_file: str) -> None:
    """Save each GPU's MIG mode and its instances with their profiles and placements, keyed by
    GPU UUID, in mig-parted's checkpoint format; `mig restore` brings them back exactly.

    \b
    Example:
      gpu-agent mig checkpoint -f /var/lib/mig-before-upgrade.json
    """
    layouts, lost, unread = _read(obj, "mig checkpoint")
    refuse_lost(
        lost, f"a checkpoint would not bring it back; nothing written to {checkpoint_file}", unread
    )
    capable = [layout for layout in layouts if layout.gpu.mig_capable]
    write_output(
        Path(checkpoint_file), json.dumps(checkpoint_document(capable)) + "\n", "checkpoint-file"
    )
    click.echo("MIG configuration checkpointed successfully")


@mig.command("restore", short_help="Bring the GPUs back to a checkpoint exactly (mig-parted).")
@_checkpoint_file("read")
@click.option(
    "--hooks-file",
    "-k",
    envvar="MIG_PARTED_HOOKS_FILE",
    metavar="FILE",
    help="mig-parted hooks file (env MIG_PARTED_HOOKS_FILE).",
)
@click.option(
    "--mode-only",
    "-m",
    is_flag=True,
    envvar="MIG_PARTED_MODE_CHANGE_ONLY",
    help="Only restore the MIG mode (env MIG_PARTED_MODE_CHANGE_ONLY).",
)
@output_option
@click.pass_context
def restore_command(
    ctx: click.Context,
    checkpoint_file: str,
    hooks_file: str | None,
    mode_only: bool,
    output: str,
) -> None:
    """Restore each GPU the checkpoint lists (by UUID) to its exact state: mode, instances,
    placements. The node's agent does it as an operation, journalled and rolled back on failure
    like an apply (an agent stopping midway rolls it back). Exits 14 when a mode change is left
    pending.

    \b
    Example:
      gpu-agent mig restore -f /var/lib/mig-before-upgrade.json
    """
    obj: CliContext = ctx.obj
    try:
        with Path(checkpoint_file).open("rb") as f:  # one byte past the limit: refused unread
            text = f.read(CHECKPOINT_MAX_BYTES + 1)
    except OSError as exc:
        raise InvalidSpec(
            f"cannot read checkpoint file {checkpoint_file}: {exc.strerror or exc}",
            [FieldViolation("checkpoint-file", "a readable mig-parted checkpoint file")],
        ) from exc
    states = parse_checkpoint(text, checkpoint_file)  # bad input refused before the agent
    hooks = load_hooks(hooks_file) if hooks_file else NO_HOOKS
    client = obj.agent()  # the node's agent restores it, as an operation (one path)
    _refuse_by_mode(obj, "mig restore")

    def run(only_mode: bool) -> _Applied:
        return _follow(client, client.restore_mig(text, mode_only=only_mode), obj.embedded)

    def holds(only_mode: bool) -> bool:
        layouts, lost, unread = _read(obj, "mig restore")
        return checkpoint_holds(states, layouts, mode_only=only_mode, lost=lost, unread=unread)

    env = {
        "MIG_PARTED_CHECKPOINT_FILE": checkpoint_file,
        "MIG_PARTED_HOOKS_FILE": hooks_file or "",
        "MIG_PARTED_MODE_CHANGE_ONLY": _go_bool(mode_only),
    }
    results = apply_with_hooks(
        hooks, env, _Applier(run, holds), output=ctx.meta.get(_DEBUG, False), mode_only=mode_only
    )
    last = results[-1] if results else None
    pending = last.pending if last is not None else []
    emit(
        last.data if last is not None else {"gpus": []},
        output,
        lambda _: "\n".join(
            [*pending, "MIG configuration NOT restored yet: a MIG mode change is pending"]
            if pending
            else ["MIG configuration restored successfully"]
        ),
    )
    if pending:
        raise click.exceptions.Exit(PENDING_EXIT)


mig.add_command(plan_command)
mig.add_command(advise_command)
