"""A SetSharingRequest as the device-plugin config it asks for. Pure.

The one reading of the request: the agent's SharingService applies what this returns, and the
coordinator's dry run predicts the agent's answer with it (`agent.coordinator.rollout.actions`).
Kept out of ``agent.api`` so the coordinator can use it without loading the agent's servicers.
"""

from __future__ import annotations

from agent._proto.gpuagent.v1 import sharing_pb2
from agent.errors import FieldViolation, InvalidSpec
from agent.sharing.schema import PluginConfig, parse

__all__ = ["MAX_YAML", "requested_config", "sharing_document_from"]

MAX_YAML = 1024 * 1024

_SPEC_SECTIONS = {
    sharing_pb2.SHARING_STRATEGY_TIME_SLICING: "timeSlicing",
    sharing_pb2.SHARING_STRATEGY_MPS: "mps",
}


def sharing_document_from(spec: sharing_pb2.SharingSpec) -> dict[str, object]:
    """A SharingSpec as a document in the plugin's schema, so it goes through the one parser
    and the one validator, as the CLI's flags do."""
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
        return parse(sharing_document_from(request.spec))
    if which == "config_yaml":
        if len(request.config_yaml) > MAX_YAML:
            raise InvalidSpec(
                "config_yaml is too large",
                [FieldViolation("config_yaml", f"at most {MAX_YAML} bytes")],
            )
        return parse(request.config_yaml, "config_yaml")
    raise InvalidSpec(
        "SetSharing needs a config", [FieldViolation("config", "set spec or config_yaml")]
    )
