"""Prewarm targets as the coordinator sends them: the name each node lists a target under,
and the checks that can be made before any node is contacted (a bad target refused once here,
not the same refusal from every node). The agent checks again, with its own URL policy."""

from __future__ import annotations

from collections.abc import Callable

from agent._proto.gpuagent.v1 import prewarm_pb2
from agent.errors import FieldViolation, InvalidSpec
from agent.prewarm.group import check_include, check_repo
from agent.prewarm.headers import check_header_name
from agent.prewarm.naming import check_name

__all__ = ["model_violations", "target_name"]

#: The agent's checks name the repo "model" (the manifest's key); a ModelTarget calls it repo.
_MODEL_FIELDS = {"model": "repo"}


def target_name(target: prewarm_pb2.PrewarmTarget) -> str:
    """The item name a target asks for ("" when the node derives one)."""
    which = target.WhichOneof("target")
    return str(getattr(target, which).name) if which else ""


def model_violations(model: prewarm_pb2.ModelTarget, where: str) -> list[FieldViolation]:
    """What is wrong with ``model``, each violation at ``<where>.<field>``; [] when it can go."""
    if not model.repo:
        return [FieldViolation(f"{where}.repo", "required: a repo id such as org/name")]
    bad: list[FieldViolation] = []
    _collect(bad, where, check_repo, model.repo, model.revision or "main")
    _collect(bad, where, check_include, list(model.include))
    if model.name:
        _collect(bad, where, check_name, model.name)
    if model.endpoint and not model.endpoint.startswith(("https://", "http://")):
        bad.append(FieldViolation(f"{where}.endpoint", "an https:// (or http://) base URL"))
    for header, path in model.header_files.items():
        _collect(bad, where, check_header_name, header)
        if not path.startswith("/"):
            bad.append(
                FieldViolation(f"{where}.header_files[{header}]", "an absolute path on the node")
            )
    return bad


def _collect(
    bad: list[FieldViolation], where: str, check: Callable[..., object], *args: object
) -> None:
    """Run one of the agent's checks; its violations go to ``bad`` under ``where``."""
    try:
        check(*args)
    except InvalidSpec as exc:
        bad += [
            FieldViolation(f"{where}.{_MODEL_FIELDS.get(v.field, v.field)}", v.description)
            for v in exc.violations
        ]
