"""DRA device taints for failed GPUs and MIG instances: one ``DeviceTaintRule`` per device.

On a node where NVIDIA's DRA driver publishes ResourceSlices, the scheduler hands out devices,
not Node capacity: a Node taint is too coarse and the device plugin's "hide the device" does not
exist. Kubernetes 1.34/1.35 serve device taints as alpha (feature gate DRADeviceTaints), in
``resource.k8s.io/v1alpha3`` ``DeviceTaintRule``: cluster scoped, ``spec.deviceSelector``
{driver, pool, device} and ``spec.taint`` {key, value, effect}. For each failed mark the agent
finds its device in the node's slices (by the ``uuid`` attribute, as pod attribution does) and
keeps a rule ``gpu-agent.io/health=failed:NoSchedule`` on it; a rule whose mark cleared (or
whose device is gone) is deleted. Rules carry the label ``gpu-agent.io/node=<node>``, so the
agent lists and deletes only its own. A cluster that does not serve the API (404) is asked
again every ``UNSERVED_RETRY_S``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.errors import NotFound
from agent.health.machine import Mark, State
from agent.health.store import Target
from agent.telemetry.dra import DRIVER, slice_devices

log = logging.getLogger(__name__)

__all__ = ["RULES", "DeviceTaints", "rule_name", "wanted_rules"]

RULES = "/apis/resource.k8s.io/v1alpha3/devicetaintrules"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NODE_LABEL = "gpu-agent.io/node"
TAINT = {"key": "gpu-agent.io/health", "value": "failed", "effect": "NoSchedule"}
UNSERVED_RETRY_S = 600.0
_NOT_NAME = re.compile(r"[^a-z0-9.-]+")

Marks = Mapping[Target, tuple[int, Mark, str]]


def rule_name(node: str, pool: str, device: str) -> str:
    """A DNS subdomain naming the rule of one device (the node and pool keep it unique)."""
    raw = f"gpu-agent.{node}.{pool}.{device}".lower()
    return _NOT_NAME.sub("-", raw).strip(".-")[:253].rstrip(".-")


def wanted_rules(
    node: str,
    marks: Marks,
    uuids: Mapping[Target, tuple[str, ...]],
    devices: Mapping[tuple[str, str], str],
) -> dict[str, dict[str, Any]]:
    """Rule name -> the DeviceTaintRule for every device of a failed mark found in the
    slices (``devices``: (pool, device) -> UUID)."""
    by_uuid = {uuid: key for key, uuid in devices.items()}
    out = {}
    for target, (_, mark, reason) in marks.items():
        if mark.state is not State.FAILED:
            continue
        for uuid in uuids.get(target, ()):
            found = by_uuid.get(uuid)
            if found is None:
                continue
            pool, device = found
            name = rule_name(node, pool, device)
            out[name] = {
                "apiVersion": "resource.k8s.io/v1alpha3",
                "kind": "DeviceTaintRule",
                "metadata": {
                    "name": name,
                    "labels": {NODE_LABEL: node},
                    "annotations": {"gpu-agent.io/reason": reason[:1024]},
                },
                "spec": {
                    "deviceSelector": {"driver": DRIVER, "pool": pool, "device": device},
                    "taint": dict(TAINT),
                },
            }
    return out


class DeviceTaints:
    """One `sync` pass: list the node's slices and the agent's rules, create and delete."""

    def __init__(
        self,
        request: Callable[..., Any],
        node: str,
        marks: Callable[[], Marks],
        uuids: Callable[[], Mapping[Target, tuple[str, ...]]],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._request = request
        self._node = node
        self._marks = marks
        self._uuids = uuids
        self._clock = clock
        self._unserved_until = 0.0

    def sync(self) -> None:
        if self._clock() < self._unserved_until:
            return
        query = {"labelSelector": f"{NODE_LABEL}={self._node}"}
        try:
            listing = self._request("GET", RULES, query=query)
        except NotFound:
            self._unserved_until = self._clock() + UNSERVED_RETRY_S
            log.info(
                "the API server does not serve resource.k8s.io/v1alpha3 DeviceTaintRules "
                "(feature gate DRADeviceTaints off): no DRA device taints; asking again in %.0fs",
                UNSERVED_RETRY_S,
            )
            return
        have = {str(item["metadata"]["name"]) for item in (listing or {}).get("items") or ()}
        slices = self._request(
            "GET", SLICES, query={"fieldSelector": f"spec.nodeName={self._node}"}
        )
        items = (slices or {}).get("items") or ()
        # only devices that name their UUID: a dynamic MIG placement is no instance yet
        devices = {k: d.uuid for k, d in slice_devices(items).items() if d.uuid}
        want = wanted_rules(self._node, self._marks(), self._uuids(), devices)
        for name in sorted(set(want) - have):
            self._request("POST", RULES, body=want[name])
            log.warning("DRA device taint %s: %s", name, want[name]["spec"]["deviceSelector"])
        for name in sorted(have - set(want)):
            try:
                self._request("DELETE", f"{RULES}/{name}")
            except NotFound:
                continue
            log.info("DRA device taint %s removed", name)
