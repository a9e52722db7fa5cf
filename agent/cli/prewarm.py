"""``gpu-agent prewarm …`` and ``gpu-agent cache …``: warm files and images, see the inventory.

Every command goes through the node's agent (the running one, or one embedded for the command:
`CliContext.agent`), which owns the cache and its queue. A warm is an operation: the command
follows it with progress on stderr until every item is ready or failed, and its exit code is
the operation's. Ctrl-C (or ``--no-wait``) leaves the items with the agent: a running agent
goes on; an embedded one stops with the command and the next agent to start resumes them from
their partial files.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from agent.cli import kind_options
from agent.cli.context import CliContext
from agent.cli.errors import AgentGroup
from agent.cli.render import emit, format_table, human_bytes, output_option, plain
from agent.client import AgentClient
from agent.prewarm import kinds
from agent.prewarm.manifest import load_manifest
from agent.prewarm.model import CacheItem, ItemState, Warmth
from agent.prewarm.source import SourceRequest
from agent.prewarm.target import FieldType, TargetSchema
from agent.wire.prewarm import NOT_CARRIED

if TYPE_CHECKING:
    from agent.wire.operations import ItemProgress, OperationView

Request = SourceRequest  # a request of any registered kind


def progress_line(
    items: Sequence[ItemProgress], took_s: float | None, state: str = "succeeded"
) -> str:
    """``12.0 MiB / 28.6 MiB  42.0% 96.0 MiB/s ETA 1s`` while warming; once the operation
    ended (``took_s``) how: ``... done in 0.4s``, ``... failed after 0.4s`` or ``... cancelled
    after 0.4s`` (its ``state``)."""
    done = sum(i.done_bytes for i in items)
    sizes = [i.total_bytes for i in items]
    total = None if None in sizes else sum(s for s in sizes if s is not None)
    shown = human_bytes(total) if total is not None else "?"
    line = f"{human_bytes(done)} / {shown}" + (f" {100 * done / total:5.1f}%" if total else "")
    if took_s is not None:
        ended = "done in" if state == "succeeded" else f"{state} after"
        return f"{line} {ended} {took_s:.1f}s"
    rate = sum(i.rate_bytes_per_second for i in items)
    etas = [i.eta_seconds for i in items if i.eta_seconds is not None]
    return (
        line
        + (f" {human_bytes(int(rate))}/s" if rate > 0 else "")
        + (f" ETA {max(etas):.0f}s" if etas else "")
        + _unmeasured(items)
    )


def _unmeasured(items: Sequence[ItemProgress]) -> str:
    """What the bytes do not show: items waiting to resume after a failure, with why (the
    first), items fetching with no size yet (an image pull, a file before its headers), named
    (three at most), and items waiting for a worker, counted."""
    waiting = [f"{i.name}: {i.retrying}" for i in items if i.retrying]
    blind = [i.name for i in items if i.state == "fetching" and i.total_bytes is None and i.name]
    queued = sum(1 for i in items if i.state == "queued")
    more = f" (+{len(waiting) - 1})" if len(waiting) > 1 else ""
    words = [f"retrying {waiting[0]}{more}"] if waiting else []
    if blind:
        words.append(f"fetching {', '.join(blind[:3])}" + (" …" if len(blind) > 3 else ""))
    words += [f"{queued} queued"] if queued else []
    return (" " + ", ".join(words)) if words else ""


def _client(ctx: click.Context) -> AgentClient:
    obj: CliContext = ctx.obj
    return obj.agent()


class _Terminal:
    """Progress on stderr: one rewritten line on a terminal, a line every 5 s in a log.

    A rate is shown only while an item is fetching (0 means "no fetch in flight", not a measured
    stall); the last line says how long the warm took as this command saw it.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._tty = sys.stderr.isatty()
        self._clock = clock
        self._start = clock()
        self._last = -math.inf

    def __call__(self, op: OperationView) -> None:
        now = self._clock()
        if not self._tty and now - self._last < 5 and not op.done:
            return
        self._last = now
        line = progress_line(op.prewarm, None if not op.done else now - self._start, op.state)
        click.echo(("\r" + line.ljust(60)) if self._tty else line, err=True, nl=not self._tty)

    def close(self) -> None:
        if self._tty:
            click.echo("", err=True)


#: What becomes of items a command leaves unfinished when no agent serves the node: its own
#: embedded agent stops with it, and the next agent to start takes them up.
_UNSERVED = (
    "no agent runs on this node: the items stay queued until one starts (gpu-agent serve, or "
    "any gpu-agent command while it runs) and resume from their partial files"
)


def _warm(ctx: click.Context, requests: Sequence[Request], wait: bool, output: str) -> None:
    """Submit the requests as one operation, follow it, render its items; fail as it failed."""
    obj: CliContext = ctx.obj
    client = obj.agent()
    op = client.submit_prewarm(requests)
    ids = [i.item_id for i in op.prewarm]
    if wait and not op.done:
        terminal = _Terminal()
        try:
            for update in client.watch_operation(op.name):
                terminal(update)
                op = update
        except KeyboardInterrupt:
            terminal.close()
            if obj.embedded:
                click.echo(f"interrupted: {op.name} stops with this command; {_UNSERVED}", err=True)
            else:
                click.echo(f"detached from {op.name}; the items stay with the agent", err=True)
            raise SystemExit(130) from None
        terminal.close()
    elif not op.done and obj.embedded:
        click.echo(_UNSERVED, err=True)
    by_id = {i.id: i for i in client.list_prewarm_items()}
    _emit_items([by_id[i] for i in ids if i in by_id], output)
    if op.done and op.error is not None:
        raise op.error


def item_record(item: CacheItem) -> dict[str, Any]:
    """An item for -o json/yaml: the fields the API carries, and for images how warm they are
    (an `unknown` image's layers were not counted: its counts are null, not 0)."""
    record: dict[str, Any] = {k: v for k, v in plain(item).items() if k not in NOT_CARRIED}
    warmth = item.image_warmth
    if warmth is not None:
        shown = plain(warmth)
        if warmth.warmth is Warmth.UNKNOWN:
            shown = {k: (v if k == "warmth" else None) for k, v in shown.items()}
        record["warmth"] = {**shown, "ratio": warmth.ratio}
    return record


def _emit_items(items: Sequence[CacheItem], output: str) -> None:
    emit([item_record(i) for i in items], output, lambda _: _items_table(items))


def _items_table(items: Sequence[CacheItem]) -> str:
    rows = [
        (
            i.id,
            str(i.kind),
            i.name,
            i.state.value,
            human_bytes(i.size),
            human_bytes(i.fetched_bytes) if i.state is ItemState.FETCHING else "-",
            _pinned_cell(i),
            i.hits,
            f"{i.warm_seconds:.1f}s" if i.warm_seconds is not None else "-",
            _warmth_cell(i),
            i.error or "",
        )
        for i in items
    ]
    headers = (
        "ID",
        "KIND",
        "NAME",
        "STATE",
        "SIZE",
        "FETCHED",
        "PINNED",
        "HITS",
        "WARM",
        "WARMTH",
        "ERROR",
    )
    return format_table(headers, rows)


def _pinned_cell(item: CacheItem) -> str:
    """``yes``; for an image the runtime would not pin (``pin_error``), that it is not."""
    if not item.pinned:
        return ""
    return "yes (not in runtime)" if "pin_error" in item.options else "yes"


def _warmth_cell(item: CacheItem) -> str:
    """``full``, ``bootstrap-only 1/3 blobs 2%``…: how much of an image's data is warm."""
    w = item.image_warmth
    if w is None:
        return "-"
    if w.ratio is None or (w.ratio == 1.0 and not w.lazy):
        return w.warmth.value
    return f"{w.warmth.value} {w.blobs_warm}/{w.blobs_total} blobs {100 * w.ratio:.0f}%"


_wait_option = click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Follow the warm with progress, or hand it to the agent and return at once.",
)


@click.group(cls=AgentGroup)
def prewarm() -> None:
    """Warm model/dataset files and container images on this node before pods land."""


def _kind_command(schema: TargetSchema) -> click.Command:
    """``prewarm <kind>``: the kind's source as the argument, its other fields as options."""
    fields = [f for f in schema.by_name.values() if f.name != schema.source]

    def refuse(spec: str) -> Exception:
        return click.BadParameter(
            f"{spec!r}: expected NAME=FILE, FILE an absolute path", param_hint="--header"
        )

    @click.argument(schema.source)
    @kind_options.options(fields, fleet=False)
    @_wait_option
    @output_option
    @click.pass_context
    def warm(ctx: click.Context, wait: bool, output: str, **given: Any) -> None:
        values = kind_options.values(schema, given, refuse)
        for name, kind in schema.fields.items():  # the agent reads them on the node
            if kind is FieldType.HEADERS:
                relative = [
                    f"{k}={v}" for k, v in values[name].items() if not Path(v).is_absolute()
                ]
                if relative:
                    raise refuse(relative[0])
        _warm(ctx, [schema.build(values)], wait, output)

    return click.command(schema.kind, help=schema.summary)(warm)


for _schema in kinds.schemas():
    prewarm.add_command(_kind_command(_schema))


@prewarm.command("apply")
@click.argument("manifest", type=click.Path(path_type=Path, dir_okay=False))
@_wait_option
@output_option
@click.pass_context
def prewarm_apply(ctx: click.Context, manifest: Path, wait: bool, output: str) -> None:
    """Warm every file and image of a manifest (version: 1, items: [...]).

    \b
    Example:
      gpu-agent prewarm apply models.yaml --no-wait
    """
    _warm(ctx, load_manifest(manifest), wait, output)


@prewarm.command("list")
@output_option
@click.pass_context
def prewarm_list(ctx: click.Context, output: str) -> None:
    """Every item with its state, size, hits, time to warm and, for images, how warm they are.

    \b
    Example:
      gpu-agent prewarm list -o json
    """
    _emit_items(_client(ctx).list_prewarm_items(), output)


@prewarm.command("cancel")
@click.argument("item")
@output_option
@click.pass_context
def prewarm_cancel(ctx: click.Context, item: str, output: str) -> None:
    """Cancel a queued or running item, or a failed one waiting for its retry (by id or name);
    its partial file is deleted and no retry follows.

    \b
    Example:
      gpu-agent prewarm cancel llama-70b-shard-3
    """
    _emit_items([_client(ctx).cancel_prewarm_item(item)], output)


@prewarm.command("delete")
@click.argument("item")
@output_option
@click.pass_context
def prewarm_delete(ctx: click.Context, item: str, output: str) -> None:
    """Remove an item (by id or name) from the inventory; a ready one is evicted first. Says
    what was deleted; -o json gives the item as it was, with "deleted": true.

    \b
    Example:
      gpu-agent prewarm delete llama-70b-shard-3
    """
    gone = _client(ctx).delete_prewarm_item(item)
    said = f"deleted {gone.name} ({gone.kind} {gone.id}; it was {gone.state.value})"
    emit([{**item_record(gone), "deleted": True}], output, lambda _: said)


@click.group(cls=AgentGroup)
def cache() -> None:
    """The node's file cache: usage, eviction and pins."""


@cache.command("list")
@output_option
@click.pass_context
def cache_list(ctx: click.Context, output: str) -> None:
    """Ready items and the budget they count against.

    \b
    Example:
      gpu-agent cache list
    """
    contents = _client(ctx).list_cache()
    usage = plain(contents.usage)
    ready = contents.items
    data = {"usage": usage, "items": [item_record(i) for i in ready]}

    def table(d: dict[str, object]) -> str:
        head = (
            f"used {human_bytes(usage['used_bytes'])} of {human_bytes(usage['capacity_bytes'])} "
            f"(pinned {human_bytes(usage['pinned_bytes'])}, "
            f"reserved {human_bytes(usage['reserved_bytes'])})"
        )
        return head + "\n" + _items_table(ready)

    emit(data, output, table)


@cache.command("evict")
@click.argument("item")
@output_option
@click.pass_context
def cache_evict(ctx: click.Context, item: str, output: str) -> None:
    """Delete a ready, unpinned item: a file no process holds, or an image from containerd.

    \b
    Example:
      gpu-agent cache evict llama-70b-shard-3
    """
    _emit_items([_client(ctx).evict_cache_item(item)], output)


@cache.command("pin")
@click.argument("item")
@click.option("--unpin", is_flag=True, help="Make the item evictable again.")
@output_option
@click.pass_context
def cache_pin(ctx: click.Context, item: str, unpin: bool, output: str) -> None:
    """Keep an item out of LRU eviction (or release it with --unpin).

    \b
    Example:
      gpu-agent cache pin llama-70b-shard-3
    """
    _emit_items([_client(ctx).pin_cache_item(item, not unpin)], output)
