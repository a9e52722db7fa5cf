"""Prewarm targets as the coordinator sends them: the name each node lists a target under,
and the checks that can be made before any node is contacted (a bad target refused once here,
not the same refusal from every node). They are the agent's own, for every registered kind:
its target schema's (agent/prewarm/target.py) and its `Source.check`. The agent checks again,
with what needs the node (its URL policy, header files, the runtime)."""

from __future__ import annotations

from agent._proto.gpuagent.v1 import prewarm_pb2
from agent.errors import FieldViolation, InvalidSpec
from agent.prewarm import kinds
from agent.prewarm.naming import check_name
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
    target's name (PrewarmService._plan_again): another kind, another source, another sha256.
    None when they may be one item. A node shows a URL without its query, so two URLs that
    differ only there (a re-signed one) are taken as one, as the agent takes a signature."""
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
