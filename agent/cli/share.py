"""``gpu-agent share``: GPU sharing (time-slicing / MPS) through NVIDIA's device plugin, or on
DRA nodes through NVIDIA's DRA driver config in DeviceClasses.

Every command but ``render`` goes through the node's agent (the running one, or one embedded
for the command: `CliContext.agent`), which validates, writes the plugin's config and reloads
it, or writes the DeviceClasses. ``render --dra`` prints the DRA objects of a spec, for GitOps.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import click
import yaml

from agent.cli.errors import AgentGroup
from agent.cli.options import choice_option, read_input
from agent.cli.render import emit, output_option
from agent.dra.mode import Allocation, AllocationMode
from agent.kube_names import is_dns_label
from agent.sharing import (
    Advertised,
    ApplyResult,
    PluginConfig,
    ReloadReport,
    SharingView,
    dra,
    dra_api,
    parse,
    parse_requested,
    to_document,
)
from agent.sharing.view import DraView
from agent.wire.sharing import strategy_request

if TYPE_CHECKING:
    from agent.client import AgentClient


_REPLICAS = re.compile(r"\s*[-+]?[0-9]+\s*", re.ASCII)
_INT64_MAX = 2**63 - 1


class SharingCalls(Protocol):
    """What the commands call: the agent's sharing API (`RemoteSharing`)."""

    def show(self) -> SharingView: ...
    def set(self, requested: PluginConfig, *, keep_sharing: bool = False) -> ApplyResult: ...
    def clear(self) -> ApplyResult: ...
    def rollback(self) -> ApplyResult: ...


class ShareContext(Protocol):
    def sharing_service(self) -> SharingCalls: ...


@dataclass(frozen=True, slots=True)
class _Spec:
    """The options that say what to share, as given; `requested` reads them into a config."""

    time_slicing: Sequence[str]
    mps: Sequence[str]
    rename_by_default: bool
    fail_requests: bool | None
    mig_strategy: str | None
    config_file: str | None

    def requested(self) -> PluginConfig:
        if self.config_file is not None:
            flags = (self.time_slicing, self.mps, self.rename_by_default, self.mig_strategy)
            if any(flags) or self.fail_requests is not None:
                raise click.UsageError("-f FILE cannot be combined with the other set options")
            return parse_requested(read_input(self.config_file, "file"), "file")
        if self.time_slicing or self.mps:
            return parse(
                _document(
                    self.time_slicing,
                    self.mps,
                    self.rename_by_default,
                    self.fail_requests,
                    self.mig_strategy,
                )
            )
        options = self._sharing_options()
        if options:
            verb = "applies" if len(options) == 1 else "apply"
            raise click.UsageError(
                f"{' and '.join(options)} {verb} to the resources of --time-slicing or --mps: "
                "give one of those too (or write the setting in -f FILE)"
            )
        raise click.UsageError(
            "give --time-slicing, --mps or -f FILE (to stop sharing: gpu-agent share clear)"
        )

    def _sharing_options(self) -> list[str]:
        """The options given that set a sharing section's fields, which need its resources."""
        options = ["--rename-by-default"] if self.rename_by_default else []
        if self.fail_requests is not None:
            no = "" if self.fail_requests else "no-"
            options.append(f"--{no}fail-requests-greater-than-one")
        return options

    def strategy_config(self) -> PluginConfig:
        """``--mig-strategy`` as a config of that flag alone, through the one parser."""
        return parse({"version": "v1", "flags": {"migStrategy": self.mig_strategy}})

    @property
    def strategy_only(self) -> bool:
        """``--mig-strategy`` alone: change that flag and keep the node's sharing."""
        return self.mig_strategy is not None and not (
            self.time_slicing
            or self.mps
            or self.config_file
            or self.rename_by_default
            or self.fail_requests is not None
        )


def _spec_options(fn: Callable[..., None]) -> Callable[..., None]:
    """The options that say what to share (``set`` and ``render`` take the same spec), handed
    to the command as one ``spec``."""

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> None:
        spec = _Spec(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(_Spec)})
        fn(*args, spec=spec, **kwargs)

    for option in reversed(_SPEC_OPTIONS):
        command = option(command)
    return command


_SPEC_OPTIONS = [
    click.option(
        "--time-slicing",
        "time_slicing",
        multiple=True,
        metavar="RESOURCE=REPLICAS",
        help="Time-slice RESOURCE into REPLICAS (>= 2). Repeatable.",
    ),
    click.option(
        "--mps",
        multiple=True,
        metavar="RESOURCE=REPLICAS",
        help="Share nvidia.com/gpu through MPS into REPLICAS (>= 2). Repeatable.",
    ),
    click.option(
        "--rename-by-default",
        is_flag=True,
        help="Advertise shared resources as <name>.shared.",
    ),
    click.option(
        "--fail-requests-greater-than-one/--no-fail-requests-greater-than-one",
        "fail_requests",
        default=None,
        help="Refuse pods asking for more than one replica (plugin default: off for "
        "time-slicing, on for MPS).",
    ),
    choice_option(
        "--mig-strategy",
        choices=["none", "single", "mixed"],
        help="Also set flags.migStrategy (default: keep the file's).",
    ),
    click.option(
        "-f",
        "--file",
        "config_file",
        metavar="FILE",
        default=None,
        help="A config in the device plugin's own schema ('-' for stdin).",
    ),
]


@click.group("share", cls=AgentGroup)
def share() -> None:
    """GPU sharing on this node: time-slicing or MPS replicas, advertised by NVIDIA's device
    plugin (one setting for every GPU of the node); on a DRA node, the DRA driver's sharing
    config in DeviceClasses that claims name."""


@share.command(
    "show", short_help="Show sharing, advertised capacity and whether the plugin loaded it."
)
@output_option
@click.pass_obj
def show_command(obj: ShareContext, output: str) -> None:
    """Show the node's sharing, what the device plugin advertises, and whether it loaded it.

    On a DRA node: the spec set here and its DeviceClasses (present, missing or differs).

    \b
    Example:
      gpu-agent share show
      gpu-agent share show -o json
    """
    view = obj.sharing_service().show()
    _emit(_view_data(view), output, lambda: _view_table(view))


#: ``share set``/``clear``/``rollback`` exit status when the config is on disk but the reload
#: did not reach the plugin: it runs its old config, so the change is not done (not 0), and no
#: error's code (docs/sharing.md "Exit codes", docs/api.md).
NOT_RELOADED_EXIT = 15


@share.command("set", short_help="Set time-slicing or MPS sharing and reload the plugin.")
@_spec_options
@output_option
@click.pass_obj
def set_command(obj: ShareContext, spec: _Spec, output: str) -> None:
    """Set the node's sharing, write it for the device plugin and reload the plugin.

    Refused, with the rule and the field, when the plugin would reject or ignore it. The
    previous config is kept for `share rollback`. On a DRA node it creates one DeviceClass per
    shared resource instead, where absent, refused where the DRA driver cannot take the spec.

    \b
    Examples:
      gpu-agent share set --time-slicing nvidia.com/gpu=4
      gpu-agent share set --time-slicing gpu=4 --rename-by-default \\
          --fail-requests-greater-than-one
      gpu-agent share set --mps nvidia.com/gpu=2
      gpu-agent share set --mig-strategy mixed --time-slicing nvidia.com/mig-1g.10gb=3
      gpu-agent share set --mig-strategy mixed
      gpu-agent share set -f time-slicing.yaml

    `--mig-strategy` alone keeps the node's sharing as the agent shows it and changes only
    flags.migStrategy. Exits 15 when the config is written but the reload did not reach the
    plugin (not done; run it again to retry the reload), as do clear and rollback.
    """
    service = obj.sharing_service()
    if spec.strategy_only:
        _emit_result(service.set(spec.strategy_config(), keep_sharing=True), output)
    else:
        _emit_result(service.set(spec.requested()), output)


@share.command("clear", short_help="Stop sharing and reload the plugin.")
@output_option
@click.pass_obj
def clear_command(obj: ShareContext, output: str) -> None:
    """Stop sharing: remove the sharing section (other plugin settings stay) and reload.

    On a DRA node: forgets the node's spec; its DeviceClasses stay, since other nodes'
    claims may name them.

    \b
    Example:
      gpu-agent share clear
    """
    _emit_result(obj.sharing_service().clear(), output)


@share.command("rollback", short_help="Restore the config from before the last change.")
@output_option
@click.pass_obj
def rollback_command(obj: ShareContext, output: str) -> None:
    """Restore the config that was there before the last change, and reload the plugin.

    The replaced config becomes the previous one, so a second rollback undoes the first. On a
    DRA node: the spec from before the last change, and its DeviceClasses.

    \b
    Example:
      gpu-agent share rollback
    """
    _emit_result(obj.sharing_service().rollback(), output)


@share.command("render", short_help="Print the DRA objects a spec renders, writing nothing.")
@click.option(
    "--dra",
    "for_dra",
    is_flag=True,
    help="Render for NVIDIA's DRA driver (DeviceClasses, and templates with --namespace).",
)
@click.option(
    "--namespace",
    default=None,
    help="Also render a ResourceClaimTemplate per shared resource in this namespace.",
)
@click.option(
    "--dynamic-mig",
    is_flag=True,
    help="For nodes whose driver makes MIG devices per claim (allocation mode dra-dynamic-mig).",
)
@_spec_options
@choice_option(
    "--output",
    "-o",
    choices=["yaml", "json"],
    default="yaml",
    help="yaml: one document per object; json: a v1 List.",
)
def render_command(
    for_dra: bool,
    namespace: str | None,
    dynamic_mig: bool,
    spec: _Spec,
    output: str,
) -> None:
    """Print the objects a sharing spec renders for the DRA driver, for GitOps: nothing is
    written and no agent is asked. Refused, naming the field, where the driver cannot take it.

    The objects are labelled gpu-agent.io/rendered-by, so no agent takes them for its own.

    \b
    Examples:
      gpu-agent share render --dra --time-slicing nvidia.com/gpu=4
      gpu-agent share render --dra --mps nvidia.com/gpu=4 --namespace team-a -o json
    """
    if not for_dra:
        raise click.UsageError(
            "render prints the DRA driver's objects: give --dra (on device-plugin nodes "
            "share set writes the plugin's file)"
        )
    if namespace is not None and not is_dns_label(namespace):
        raise click.BadParameter(
            f"{namespace!r}: a namespace is a DNS label (lowercase letters, digits and '-', "
            "at most 63)",
            param_hint="--namespace",
        )
    if spec.strategy_only:
        raise click.UsageError(
            "--mig-strategy alone renders no object: the DRA driver has no MIG strategy (full "
            "GPUs and MIG devices are devices of their own); give --time-slicing, --mps or "
            "-f FILE"
        )
    requested = spec.requested()
    mode = AllocationMode.DRA_DYNAMIC_MIG if dynamic_mig else AllocationMode.DRA
    allocation = Allocation(mode, "share render", dra_api.DRIVER)
    objects = dra.render(requested, allocation, namespace)
    if output == "json":
        listing = {"apiVersion": "v1", "kind": "List", "items": objects}
        click.echo(json.dumps(listing, indent=2))
    else:
        click.echo(yaml.safe_dump_all(objects, sort_keys=False).rstrip())
    for note in dra.plan(requested, allocation).notes:  # stderr: the objects stay pipeable
        click.echo(f"note: {note}", err=True)


class RemoteSharing:
    """The agent's sharing API under the names the commands call (`SharingCalls`)."""

    def __init__(self, client: AgentClient) -> None:
        self._client = client

    def show(self) -> SharingView:
        return self._client.get_sharing()

    def set(self, requested: PluginConfig, *, keep_sharing: bool = False) -> ApplyResult:
        if keep_sharing:  # only the strategy: the agent keeps the sharing under its lock
            assert requested.flags.mig_strategy is not None
            return self._client.set_sharing(strategy_request(requested.flags.mig_strategy))
        return self._client.set_sharing(requested)

    def clear(self) -> ApplyResult:
        return self._client.clear_sharing()

    def rollback(self) -> ApplyResult:
        return self._client.rollback_sharing()


def _document(
    time_slicing: Sequence[str],
    mps: Sequence[str],
    rename_by_default: bool,
    fail_requests: bool | None,
    mig_strategy: str | None,
) -> dict[str, object]:
    """The flags as a document in the plugin's schema, so they go through the one parser."""
    sharing: dict[str, object] = {}
    for key, option, specs in (
        ("timeSlicing", "--time-slicing", time_slicing),
        ("mps", "--mps", mps),
    ):
        if not specs:
            continue
        section: dict[str, object] = {
            "renameByDefault": rename_by_default,
            "resources": [_resource(spec, option) for spec in specs],
        }
        if fail_requests is not None:
            section["failRequestsGreaterThanOne"] = fail_requests
        sharing[key] = section
    doc: dict[str, object] = {"version": "v1", "sharing": sharing}
    if mig_strategy is not None:
        doc["flags"] = {"migStrategy": mig_strategy}
    return doc


def _resource(spec: str, option: str) -> dict[str, object]:
    name, sep, replicas = spec.partition("=")
    if not sep or not name:
        raise click.BadParameter(
            f"{spec!r}: expected RESOURCE=REPLICAS, e.g. nvidia.com/gpu=4", param_hint=option
        )
    # Not int() alone: it takes '1_0' as 10 and any Unicode digit ('\u0664' as 4).
    if not _REPLICAS.fullmatch(replicas):
        raise click.BadParameter(
            f"{spec!r}: REPLICAS must be an integer (digits 0-9), e.g. nvidia.com/gpu=4",
            param_hint=option,
        )
    value = int(replicas)
    if abs(value) > _INT64_MAX:  # the plugin's Go int; past it the agent's parser refuses it
        raise click.BadParameter(
            f"{spec!r}: REPLICAS must be an integer of at most {_INT64_MAX}", param_hint=option
        )
    return {"name": name.strip(), "replicas": value}


def _emit(data: object, output: str, table: Callable[[], str]) -> None:
    emit(data, output, lambda _: table())


def _emit_result(result: ApplyResult, output: str) -> None:
    """The change's answer; exit NOT_RELOADED_EXIT when the config is on disk but the reload
    did not reach the plugin (which runs its old config): not done. With reload ``none``
    something else reloads the plugin: a warning only."""
    _emit(_result_data(result), output, lambda: _result_table(result))
    reload = result.reload
    if reload is None or reload.done:
        return
    if reload.method == "none":
        click.echo(f"warning: the plugin was not reloaded: {reload.detail}", err=True)
        return
    what = "written" if result.changed else "already written"
    click.echo(
        f"error: the config is {what}, but the plugin was not reloaded ({reload.method}): "
        f"{reload.detail}; `share show` says whether it loads it, and the same command "
        "retries the reload",
        err=True,
    )
    raise click.exceptions.Exit(NOT_RELOADED_EXIT)


def _time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def _sharing_data(config: PluginConfig) -> dict[str, object]:
    active = config.sharing.active
    return {
        "strategy": config.sharing.strategy,
        "mig_strategy": config.mig_strategy,
        "rename_by_default": active is not None and active.rename_by_default,
        "fail_requests_greater_than_one": config.sharing.fail_requests_greater_than_one,
        "resources": [
            {"name": r.name, "replicas": r.replicas}
            for r in (active.resources if active is not None else ())
        ],
    }


def _advertised_data(advertised: Sequence[Advertised]) -> list[dict[str, object]]:
    return [
        {"resource": a.resource, "devices": a.devices, "replicas": a.replicas, "count": a.count}
        for a in advertised
    ]


def _reload_data(report: ReloadReport | None) -> dict[str, object] | None:
    if report is None:
        return None
    return {
        "method": report.method,
        "done": report.done,
        "detail": report.detail,
        "at": _time(report.at),
        "pids": list(report.pids),
    }


def _dra_data(view: DraView | None) -> dict[str, object] | None:
    if view is None:
        return None
    return {
        "mode": view.allocation.mode.value,
        "evidence": view.allocation.evidence,
        "driver": view.allocation.driver,
        "objects": [
            {
                "kind": o.kind,
                "name": o.name,
                "namespace": o.namespace,
                "state": o.state,
                "object": dict(o.body),
            }
            for o in view.objects
        ],
        "notes": [{"field": n.field, "description": n.description} for n in view.notes],
        "error": view.error or None,
    }


def _dra_lines(view: DraView | None) -> list[str]:
    if view is None:
        return []
    lines = [f"Mode:      {view.allocation.describe()}: sharing is the DRA driver's config"]
    if view.error:
        lines.append(f"Objects:   unknown: {view.error}")
    elif not view.objects:
        lines.append("Objects:   none for this node")
    else:
        rows = [["DEVICECLASS", "STATE", "RESOURCE"]] + [
            [o.name, o.state, str(_annotation(o.body, dra.RESOURCE_NAME))] for o in view.objects
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines += ["", "Claims share a device by naming one of these DeviceClasses:"]
        lines += [
            "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]
    if view.notes:
        lines += ["", "Not carried by the driver, or mapped:"]
        lines += [f"  {n}" for n in view.notes]
    return lines


def _annotation(body: Mapping[str, Any], key: str) -> str:
    meta = body.get("metadata")
    found = meta.get("annotations") if isinstance(meta, Mapping) else None
    return str(found.get(key, "-")) if isinstance(found, Mapping) else "-"


def _view_data(view: SharingView) -> dict[str, object]:
    last = view.last_write
    return {
        "config_path": str(view.config_path),
        "exists": view.exists,
        **_sharing_data(view.config),
        # null, not []: no resource is advertised is a claim nobody could make (why: below)
        "advertised": None if view.advertised_unknown else _advertised_data(view.advertised),
        "advertised_unknown": view.advertised_unknown or None,
        "plugin": {"state": view.pickup.state, "detail": view.pickup.detail},
        "last_write": None
        if last is None
        else {
            "action": last.action,
            "written_at": _time(last.written_at),
            "reload": _reload_data(last.reload),
        },
        "problems": [{"field": p.field, "description": p.description} for p in view.problems],
        "config": to_document(view.config),
        "dra": _dra_data(view.dra),
    }


def _result_data(result: ApplyResult) -> dict[str, object]:
    return {
        "action": result.action,
        "changed": result.changed,
        "config_path": str(result.config_path),
        **_sharing_data(result.config),
        "advertised": None if result.advertised_unknown else _advertised_data(result.advertised),
        "advertised_unknown": result.advertised_unknown or None,
        "problems": [{"field": p.field, "description": p.description} for p in result.problems],
        "reload": _reload_data(result.reload),
        "config": to_document(result.config),
        "dra": _dra_data(result.dra),
    }


def _sharing_lines(config: PluginConfig) -> list[str]:
    strategy = config.sharing.strategy
    lines = [f"Strategy:  {strategy} (migStrategy {config.mig_strategy})"]
    active = config.sharing.active
    if active is not None:
        fail = str(config.sharing.fail_requests_greater_than_one).lower()
        lines.append(
            f"Options:   renameByDefault {str(active.rename_by_default).lower()}, "
            f"failRequestsGreaterThanOne {fail}"
        )
    return lines


def _advertised_table(advertised: Sequence[Advertised], unknown: str) -> str:
    if unknown:
        return f"Advertised: not known: {unknown}"
    if not advertised:
        return "The plugin advertises no GPU resources on this node."
    rows = [["RESOURCE", "DEVICES", "REPLICAS", "ADVERTISED"]] + [
        [a.resource, str(a.devices), str(a.replicas), str(a.count)] for a in advertised
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


def _view_table(view: SharingView) -> str:
    if view.dra is not None:
        return _dra_view_table(view, view.dra)
    lines = _head_lines(view, "Config:    ", "")  # the Plugin line says what that means
    lines += [f"Plugin:    {view.pickup.state}: {view.pickup.detail}", ""]
    lines.append(_advertised_table(view.advertised, view.advertised_unknown))
    lines += _problem_lines(view, "Problems (the plugin refuses or ignores these):")
    return "\n".join(lines)


def _dra_view_table(view: SharingView, dra_view: DraView) -> str:
    lines = _head_lines(view, "Spec:      ", "nothing set on this node") + _dra_lines(dra_view)
    return "\n".join(lines + _problem_lines(view, "Problems:"))


def _head_lines(view: SharingView, label: str, absent: str) -> list[str]:
    """Where the config is, what it says and which share command wrote it last."""
    state = "" if view.exists else f" (absent: {absent})" if absent else " (absent)"
    lines = [f"{label}{view.config_path}{state}", *_sharing_lines(view.config)]
    if view.last_write is not None:
        lines.append(
            f"Written:   {_time(view.last_write.written_at)} by gpu-agent "
            f"(share {view.last_write.action})"
        )
    return lines


def _problem_lines(view: SharingView | ApplyResult, title: str) -> list[str]:
    if not view.problems:
        return []
    return ["", title, *(f"  {p}" for p in view.problems)]


def _result_table(result: ApplyResult) -> str:
    if result.dra is not None:
        head = (
            f"{result.action.capitalize()}: the DRA driver's DeviceClasses"
            if result.changed
            else "Unchanged: the DeviceClasses already say this; nothing written."
        )
        return "\n".join([head, *_sharing_lines(result.config), *_dra_lines(result.dra)])
    if not result.changed and result.reload is not None:  # the plugin had not loaded it
        head = (
            f"Unchanged: {result.config_path} already says this; nothing written. The plugin "
            "had not loaded it: reloaded again."
        )
    elif not result.changed:
        head = f"Unchanged: {result.config_path} already says this; nothing written or reloaded."
    else:
        head = f"{result.action.capitalize()}: wrote {result.config_path}"
    lines = [head, *_sharing_lines(result.config)]
    if result.reload is not None:
        lines.append(f"Reload:    {result.reload.method}: {result.reload.detail}")
    lines += ["", _advertised_table(result.advertised, result.advertised_unknown)]
    lines += _problem_lines(result, "Problems (written all the same; share show lists them too):")
    return "\n".join(lines)
