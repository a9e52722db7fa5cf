"""SharingService on the wire: the device plugin's sharing config, what it advertises, its
reloads, and a DRA node's DeviceClasses.

The agent reads a SetSharingRequest with `requested_config` (the coordinator's dry run
predicts the agent's answer with the same function) and answers with the ``*_pb`` functions;
clients read the answers back into the same records (`sharing_view_from`,
`sharing_change_from`), and ask for a config with `set_sharing_request`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from agent._proto.gpuagent.v1 import sharing_pb2, types_pb2
from agent.dra.mode import Allocation, AllocationMode
from agent.errors import FieldViolation, InvalidSpec
from agent.sharing import (
    Advertised,
    ApplyResult,
    PluginConfig,
    ReloadReport,
    SharingView,
    parse,
    parse_requested,
)
from agent.sharing.schema import render
from agent.sharing.view import DraObject, DraView, Pickup, StatusRecord
from agent.wire.timestamps import seconds, timestamp

__all__ = [
    "change_without_pids",
    "dra_pb",
    "keeps_sharing",
    "requested_config",
    "set_sharing_request",
    "sharing_change_from",
    "sharing_change_pb",
    "sharing_config_pb",
    "sharing_view_from",
    "sharing_view_pb",
    "strategy_request",
    "violations_pb",
    "without_pids",
]


_STRATEGIES = {
    "none": sharing_pb2.SHARING_STRATEGY_NONE,
    "time-slicing": sharing_pb2.SHARING_STRATEGY_TIME_SLICING,
    "mps": sharing_pb2.SHARING_STRATEGY_MPS,
}


def sharing_config_pb(config: PluginConfig) -> sharing_pb2.SharingConfig:
    active = config.sharing.active
    return sharing_pb2.SharingConfig(
        strategy=_STRATEGIES[config.sharing.strategy],
        mig_strategy=config.mig_strategy,
        rename_by_default=active is not None and active.rename_by_default,
        fail_requests_greater_than_one=config.sharing.fail_requests_greater_than_one,
        resources=[
            sharing_pb2.SharedResource(name=r.name, replicas=_uint32(r.replicas))
            for r in (active.resources if active is not None else ())
        ],
        config_yaml=render(config),
    )


def advertised_pb(advertised: Iterable[Advertised]) -> list[sharing_pb2.AdvertisedResource]:
    return [
        sharing_pb2.AdvertisedResource(
            resource=a.resource,
            devices=_uint32(a.devices),
            replicas=_uint32(a.replicas),
            count=_uint32(a.count),
        )
        for a in advertised
    ]


def _uint32(value: int) -> int:
    """Saturated, so a file on disk the rules refuse still shows (its problems say why)."""
    return min(max(value, 0), 0xFFFFFFFF)


def reload_pb(report: ReloadReport) -> sharing_pb2.PluginReload:
    return sharing_pb2.PluginReload(
        method=report.method,
        done=report.done,
        detail=report.detail,
        time=timestamp(report.at),
        pids=[p & 0xFFFFFFFF for p in report.pids],
    )


def violations_pb(violations: Iterable[FieldViolation]) -> list[types_pb2.FieldViolation]:
    return [types_pb2.FieldViolation(field=v.field, description=v.description) for v in violations]


def sharing_view_pb(view: SharingView) -> sharing_pb2.GetSharingResponse:
    response = sharing_pb2.GetSharingResponse(
        config=sharing_config_pb(view.config),
        config_path=str(view.config_path),
        exists=view.exists,
        advertised=advertised_pb(view.advertised),
        plugin_state=view.pickup.state,
        plugin_detail=view.pickup.detail,
        problems=violations_pb(view.problems),
        advertised_unknown=view.advertised_unknown,
    )
    last = view.last_write
    if last is not None:
        response.last_write.CopyFrom(
            sharing_pb2.SharingWrite(action=last.action, write_time=timestamp(last.written_at))
        )
        if last.reload is not None:
            response.last_write.reload.CopyFrom(reload_pb(last.reload))
    if view.dra is not None:
        response.dra.CopyFrom(dra_pb(view.dra))
    return response


def sharing_change_pb(result: ApplyResult) -> sharing_pb2.SharingChange:
    change = sharing_pb2.SharingChange(
        action=result.action,
        changed=result.changed,
        config=sharing_config_pb(result.config),
        config_path=str(result.config_path),
        advertised=advertised_pb(result.advertised),
        advertised_unknown=result.advertised_unknown,
        problems=violations_pb(result.problems),
    )
    if result.reload is not None:
        change.reload.CopyFrom(reload_pb(result.reload))
    if result.dra is not None:
        change.dra.CopyFrom(dra_pb(result.dra))
    return change


def dra_pb(view: DraView) -> sharing_pb2.DraSharing:
    """A node's DRA sharing as its message (objects as JSON, keys in a fixed order)."""
    return sharing_pb2.DraSharing(
        mode=view.allocation.mode.value,
        evidence=view.allocation.evidence,
        driver=view.allocation.driver,
        objects=[
            sharing_pb2.DraObject(
                kind=o.kind,
                name=o.name,
                namespace=o.namespace,
                state=o.state,
                json=json.dumps(o.body, sort_keys=True),
            )
            for o in view.objects
        ],
        notes=violations_pb(view.notes),
        error=view.error,
    )


# -- requests -------------------------------------------------------------------------------------

_MAX_YAML = 1024 * 1024

_SPEC_SECTIONS = {
    sharing_pb2.SHARING_STRATEGY_TIME_SLICING: "timeSlicing",
    sharing_pb2.SHARING_STRATEGY_MPS: "mps",
}


def keeps_sharing(request: sharing_pb2.SetSharingRequest) -> bool:
    """Whether ``request`` changes only the MIG strategy: a spec with no strategy and no
    resources, only ``mig_strategy`` (`gpu-agent share set --mig-strategy` alone); the node's
    sharing stays as its file has it."""
    return request.WhichOneof("config") == "spec" and _strategy_only(request.spec)


def _strategy_only(spec: sharing_pb2.SharingSpec) -> bool:
    """Only ``mig_strategy``: a section's option beside it (``rename_by_default``,
    ``fail_requests_greater_than_one``) makes it a spec that lacks its strategy and resources,
    refused as such, not one whose option is dropped."""
    unset = spec.strategy == sharing_pb2.SHARING_STRATEGY_UNSPECIFIED
    options = spec.rename_by_default or spec.HasField("fail_requests_greater_than_one")
    return unset and not spec.resources and not options and bool(spec.mig_strategy)


def strategy_request(mig_strategy: str) -> sharing_pb2.SetSharingRequest:
    """The request `keeps_sharing` recognises: set ``flags.migStrategy``, keep the sharing."""
    return sharing_pb2.SetSharingRequest(spec=sharing_pb2.SharingSpec(mig_strategy=mig_strategy))


def _document_from(spec: sharing_pb2.SharingSpec) -> dict[str, object]:
    """A SharingSpec as a document in the plugin's schema, so it goes through the one parser
    and the one validator, as the CLI's flags do."""
    if _strategy_only(spec):  # the flag alone; the service keeps the sharing (`keeps_sharing`)
        return {"version": "v1", "flags": {"migStrategy": spec.mig_strategy}}
    section_key = _SPEC_SECTIONS.get(spec.strategy)
    bad = []
    if section_key is None:
        bad.append(FieldViolation("spec.strategy", "must be TIME_SLICING or MPS"))
    if not spec.resources:
        bad.append(FieldViolation("spec.resources", "give at least one resource"))
    if bad:
        raise InvalidSpec("the sharing spec is incomplete", bad)
    section: dict[str, object] = {
        "renameByDefault": spec.rename_by_default,
        "resources": [{"name": r.name, "replicas": r.replicas} for r in spec.resources],
    }
    if spec.HasField("fail_requests_greater_than_one"):
        section["failRequestsGreaterThanOne"] = spec.fail_requests_greater_than_one
    doc: dict[str, object] = {"version": "v1", "sharing": {section_key: section}}
    if spec.mig_strategy:
        doc["flags"] = {"migStrategy": spec.mig_strategy}
    return doc


def requested_config(request: sharing_pb2.SetSharingRequest) -> PluginConfig:
    """The config ``request`` asks for (before it is laid over the node's file); InvalidSpec
    naming the request field when it is malformed."""
    which = request.WhichOneof("config")
    if which == "spec":
        return parse(_document_from(request.spec))
    if which == "config_yaml":
        if len(request.config_yaml) > _MAX_YAML:
            raise InvalidSpec(
                "config_yaml is too large",
                [FieldViolation("config_yaml", f"at most {_MAX_YAML} bytes")],
            )
        return parse_requested(request.config_yaml, "config_yaml")
    raise InvalidSpec(
        "SetSharing needs a config", [FieldViolation("config", "set spec or config_yaml")]
    )


# -- back into records, for clients ---------------------------------------------------------------


def set_sharing_request(config: PluginConfig) -> sharing_pb2.SetSharingRequest:
    """Ask for ``config`` as the plugin's own file: the agent parses it with the same parser."""
    return sharing_pb2.SetSharingRequest(config_yaml=render(config))


def sharing_view_from(view: sharing_pb2.GetSharingResponse) -> SharingView:
    """`sharing_view_pb` inverted (the DRA part included)."""
    last = None
    if view.HasField("last_write"):
        w = view.last_write
        last = StatusRecord(
            w.action,
            "",
            seconds(w.write_time),
            _reload_from(w.reload) if w.HasField("reload") else None,
        )
    return SharingView(
        config_path=Path(view.config_path),
        exists=view.exists,
        config=parse(view.config.config_yaml),
        advertised=_advertised_from(view.advertised),
        problems=tuple(FieldViolation(p.field, p.description) for p in view.problems),
        pickup=Pickup(view.plugin_state, view.plugin_detail),  # type: ignore[arg-type]
        last_write=last,
        dra=_dra_from(view.dra) if view.HasField("dra") else None,
        advertised_unknown=view.advertised_unknown,
    )


def sharing_change_from(change: sharing_pb2.SharingChange) -> ApplyResult:
    """`sharing_change_pb` inverted (the DRA part included)."""
    return ApplyResult(
        action=change.action,
        changed=change.changed,
        config_path=Path(change.config_path),
        config=parse(change.config.config_yaml),
        advertised=_advertised_from(change.advertised),
        reload=_reload_from(change.reload) if change.HasField("reload") else None,
        dra=_dra_from(change.dra) if change.HasField("dra") else None,
        advertised_unknown=change.advertised_unknown,
        problems=tuple(FieldViolation(p.field, p.description) for p in change.problems),
    )


def _reload_from(msg: sharing_pb2.PluginReload) -> ReloadReport:
    return ReloadReport(msg.method, msg.done, msg.detail, seconds(msg.time), tuple(msg.pids))


def _advertised_from(
    items: Iterable[sharing_pb2.AdvertisedResource],
) -> tuple[Advertised, ...]:
    return tuple(Advertised(a.resource, a.devices, a.replicas) for a in items)


def _dra_from(msg: sharing_pb2.DraSharing) -> DraView:
    return DraView(
        allocation=Allocation(AllocationMode(msg.mode), msg.evidence, msg.driver),
        objects=tuple(
            DraObject(o.kind, o.name, o.state, json.loads(o.json) if o.json else {}, o.namespace)
            for o in msg.objects
        ),
        notes=tuple(FieldViolation(n.field, n.description) for n in msg.notes),
        error=msg.error,
    )


# How reload reports and pickup details name the plugin's processes (agent/sharing/reload.py).
_PIDS = re.compile(r"\bpids? \d+(?:, \d+)*")


def without_pids(view: sharing_pb2.GetSharingResponse) -> sharing_pb2.GetSharingResponse:
    """``view`` as a caller that sees no processes gets it (agent/api/auth.py, PROCESS_ROLES):
    the plugin's state and reload as they were, without its pids. ``view`` is not changed."""
    shown = sharing_pb2.GetSharingResponse()
    shown.CopyFrom(view)
    shown.plugin_detail = _PIDS.sub("pid (withheld)", view.plugin_detail)
    if shown.HasField("last_write"):
        _withhold(shown.last_write.reload)
    return shown


def change_without_pids(change: sharing_pb2.SharingChange) -> sharing_pb2.SharingChange:
    """A set, clear or rollback's answer as a caller that sees no processes gets it: the
    reload as it went, without the plugin's pids. ``change`` is not changed."""
    shown = sharing_pb2.SharingChange()
    shown.CopyFrom(change)
    if shown.HasField("reload"):
        _withhold(shown.reload)
    return shown


def _withhold(reload: sharing_pb2.PluginReload) -> None:
    del reload.pids[:]
    reload.detail = _PIDS.sub("pid (withheld)", reload.detail)
