"""What a sharing or prewarm rollout record keeps as its change, built from the fleet CLI's
values: the JSON of the request each node is sent (`actions.sharing_request`,
`actions.prewarm_targets` read it back). Checked here, once, before any node is contacted, so a
bad value is one clear error and not the same refusal from every node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import json_format

from agent._proto.gpuagent.v1 import prewarm_pb2, sharing_pb2
from agent.coordinator.rollout.targets import model_violations
from agent.errors import FieldViolation
from agent.wire.sharing import requested_config

__all__ = ["STRATEGIES", "prewarm_spec", "sharing_spec", "target_violations"]

#: a sharing strategy's name, as the fleet CLI and the desired file take it -> its enum
STRATEGIES: Mapping[str, sharing_pb2.SharingStrategy] = {
    "time-slicing": sharing_pb2.SHARING_STRATEGY_TIME_SLICING,
    "mps": sharing_pb2.SHARING_STRATEGY_MPS,
}
#: a target's kind -> its message (PrewarmTarget's oneof: file, image, model)
_TARGETS: Mapping[str, Any] = {
    "file": prewarm_pb2.FileTarget,
    "image": prewarm_pb2.ImageTarget,
    "model": prewarm_pb2.ModelTarget,
}


def sharing_spec(
    config_yaml: str | None,
    strategy: str = "",
    resources: Sequence[str] = (),
    replicas: int = 0,
    rename_by_default: bool = False,
) -> dict[str, Any]:
    """A whole device-plugin file (``config_yaml``), or one ``strategy`` ("time-slicing" or
    "mps") giving each resource ``replicas``; InvalidSpec when the agent would refuse it."""
    if config_yaml is not None:
        request = sharing_pb2.SetSharingRequest(config_yaml=config_yaml)
    else:
        request = sharing_pb2.SetSharingRequest(
            spec=sharing_pb2.SharingSpec(
                strategy=STRATEGIES[strategy],
                resources=[
                    sharing_pb2.SharedResource(name=r, replicas=replicas) for r in resources
                ],
                rename_by_default=rename_by_default,
            )
        )
    requested_config(request)
    return {"request": json_format.MessageToDict(request)}


def target_violations(kind: str, fields: Mapping[str, Any]) -> list[FieldViolation]:
    """What is wrong with a target of ``kind`` before any node is asked, each at its field
    (``model.<field>`` for a model); [] when it can go."""
    if kind != "model":
        return []
    return model_violations(prewarm_pb2.ModelTarget(**fields), "model")


def prewarm_spec(kind: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """One target of ``kind`` with ``fields`` named as its message's (check them first with
    `target_violations`)."""
    target = prewarm_pb2.PrewarmTarget(**{kind: _TARGETS[kind](**fields)})
    return {"targets": [json_format.MessageToDict(target)]}
