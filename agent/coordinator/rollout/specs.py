"""What a sharing or prewarm rollout record keeps as its change, built from the fleet CLI's
values: the JSON of the request each node is sent (`actions.sharing_request`,
`actions.prewarm_targets` read it back). Checked here, once, before any node is contacted, so a
bad value is one clear error and not the same refusal from every node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import json_format

from agent._proto.gpuagent.v1 import sharing_pb2
from agent.coordinator.rollout.targets import target_violations
from agent.dra.mode import Allocation, AllocationMode
from agent.errors import FieldViolation, InvalidSpec
from agent.gpu.types import GpuInfo, GpuLayout
from agent.prewarm.target import TargetSchema
from agent.sharing import dra
from agent.sharing.schema import PluginConfig
from agent.sharing.validate import violations
from agent.wire.prewarm import target_pb
from agent.wire.sharing import requested_config

__all__ = ["STRATEGIES", "prewarm_spec", "refused_everywhere", "sharing_spec"]

#: a sharing strategy's name, as the fleet CLI and the desired file take it -> its enum
STRATEGIES: Mapping[str, sharing_pb2.SharingStrategy] = {
    "time-slicing": sharing_pb2.SHARING_STRATEGY_TIME_SLICING,
    "mps": sharing_pb2.SHARING_STRATEGY_MPS,
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
    bad = refused_everywhere(requested_config(request))
    if bad:
        raise InvalidSpec(
            f"every node would refuse this sharing config: {bad[0]}",
            bad,
        )
    return {"request": json_format.MessageToDict(request)}


#: the node that limits a sharing config least under the device plugin: one full GPU (MIG off,
#: its compute capability unknown: the newer GPUs' MPS client limit)
_ANY_GPU = (GpuLayout(GpuInfo(0, "", "", "", 0, 0, 0, None), (), (), ()),)
#: and under a DRA driver: static devices (MPS allowed), the driver not named
_ANY_DRA = Allocation(AllocationMode.DRA, "any node")


def refused_everywhere(config: PluginConfig) -> list[FieldViolation]:
    """The fields of ``config`` every node's agent refuses, by the agents' own checks: those
    both the device plugin's rules (`agent.sharing.validate`) and the DRA driver's
    (`agent.sharing.dra.plan`) refuse on the node that limits least. A field one of them takes
    (MPS on a MIG device under DRA, a device-plugin flag) is left to the nodes, which check
    it against their GPUs. Each is said in the device plugin's words, then the DRA driver's."""
    plugin = {v.field: v.description for v in violations(config, _ANY_GPU)}
    if not plugin:
        return []
    try:
        dra.plan(config, _ANY_DRA)
    except InvalidSpec as exc:
        driver = {v.field: v.description for v in reversed(exc.violations)}
        return [
            FieldViolation(field, f"{why} (with a DRA driver: {driver[field]})")
            for field, why in plugin.items()
            if field in driver
        ]
    return []


def prewarm_spec(schema: TargetSchema, values: Mapping[str, Any]) -> dict[str, Any]:
    """One target of ``schema``'s kind from ``values`` by API name, as the record keeps it;
    InvalidSpec naming each field (by API name) when every agent would refuse it."""
    target = target_pb(schema, values)
    bad = target_violations(schema, getattr(target, schema.kind), "")
    if bad:
        raise InvalidSpec(str(bad[0]), bad)
    return {"targets": [json_format.MessageToDict(target)]}
