"""Prewarm targets as the coordinator sends them: the name each node lists a target under,
and the checks that can be made before any node is contacted (a bad target refused once here,
not the same refusal from every node). They are the agent's own, for every registered kind:
its target schema's (agent/prewarm/target.py) and its `Source.check`. The agent checks again,
with what needs the node (its URL policy, header files, the runtime)."""

from __future__ import annotations

import json

from agent._proto.gpuagent.v1 import prewarm_pb2
from agent.errors import FieldViolation, InvalidSpec
from agent.prewarm import kinds
from agent.prewarm.model import GroupRequest
from agent.prewarm.naming import check_name
from agent.prewarm.source import SourceRequest
from agent.prewarm.target import TargetSchema
from agent.wire.prewarm import UNKNOWN_KIND, ItemStatus, at, message_values, target_request

__all__ = ["held_elsewhere", "target_name", "target_violations"]


def target_name(target: prewarm_pb2.PrewarmTarget) -> str:
    """The item name a target asks for ("" when the node derives one)."""
    which = target.WhichOneof("target")
    return str(getattr(target, which).name) if which else ""


def target_violations(schema: TargetSchema, message: object, where: str) -> list[FieldViolation]:
    """What is wrong with ``message``, a target of ``schema``'s kind, each violation at
    ``<where>.<field>`` (the field's API name); [] when it can go."""
    bad: list[FieldViolation] = []
    values = message_values(schema, message, where, bad)
    if bad:
        return bad
    request = schema.build(values)
    # The checks name a field as a manifest spells it (the model's "model"): read back.
    spelled = {v: k for k, v in schema.manifest_names.items()}
    try:
        if request.name is not None:
            check_name(request.name)
        kinds.for_request(request).check(request)
    except InvalidSpec as exc:
        return [
            FieldViolation(at(where, spelled.get(v.field, v.field)), v.description)
            for v in exc.violations
        ] or [FieldViolation(where or schema.source, str(exc))]
    return []


def held_elsewhere(target: prewarm_pb2.PrewarmTarget, held: ItemStatus) -> str | None:
    """Why the node's agent refuses ``target`` because of ``held``, the item it keeps under the
    target's name (PrewarmService._plan_again): another kind, another source (a model's other
    file selection included), another sha256. None when they may be one item. A node shows a
    URL without its query, so two URLs that differ only there (a re-signed one) are taken as
    one, as the agent takes a signature."""
    request = target_request(target, "", [])
    if request is None or held.kind == UNKNOWN_KIND:
        return None
    source = kinds.for_request(request)
    if held.kind != source.kind:
        return f"{held.name} is an item of kind {held.kind} on the node, not {source.kind}"
    claim = source.claim(request)
    if claim is None:
        return None
    if _unqueried(claim.shown) != _unqueried(held.source):
        return f"{held.name} holds another source on the node ({held.source})"
    other = _other_selection(request, held)
    if other is not None:
        return other
    wanted = claim.sha256
    if wanted and (
        held.expected_sha256 not in ("", wanted) or (held.ready and held.sha256 not in ("", wanted))
    ):
        found = held.sha256 or held.expected_sha256
        return f"{held.name} is sha256 {found} on the node, not the requested {wanted}"
    return None


def _unqueried(shown: str) -> str:
    """A shown source less the marks of a query and fragment it had (agent/redact.py)."""
    return shown.removesuffix("#…").removesuffix("?…")


def _other_selection(request: SourceRequest, held: ItemStatus) -> str | None:
    """Why ``held`` is another item than the model ``request`` asks for although their repo,
    revision and endpoint agree: its file selection. The agent makes the include part of the
    item's identity (`ModelSource.target`: other globs, or none, are another source, in
    order), which its source shows only as ``#…``; the node shows the include in the item's
    options. None when they agree, or an agent that shows no options leaves it unknown."""
    if not isinstance(request, GroupRequest):
        return None
    wanted = list(request.include)
    try:
        have = json.loads(held.options["include"])
    except (KeyError, ValueError):
        have = None
    if not isinstance(have, list):
        # No include shown: the source's fragment alone says whether the item has one.
        if bool(wanted) == held.source.endswith("#…"):
            return None
        return f"{held.name} holds another file selection on the node, not {_files(wanted)}"
    if have == wanted:
        return None
    return f"{held.name} holds {_files(have)} on the node, not {_files(wanted)}"


def _files(include: list[str]) -> str:
    return f"include {', '.join(include)}" if include else "every file (no include)"
