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
from agent.wire.prewarm import at, message_values

__all__ = ["target_name", "target_violations"]


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
