"""DRA device taints for failed GPUs and MIG instances: one ``DeviceTaintRule`` per device.

On a node where NVIDIA's DRA driver publishes ResourceSlices, the scheduler hands out devices,
not Node capacity: a Node taint is too coarse and the device plugin's "hide the device" does not
exist. Kubernetes 1.33-1.35 serve device taints as alpha (feature gate DRADeviceTaints) in
``resource.k8s.io/v1alpha3``, 1.36 as beta in ``v1beta2``; the agent uses the version discovery
finds (agent/kube_discovery.py). ``DeviceTaintRule`` is cluster scoped, ``spec.deviceSelector``
{driver, pool, device} and ``spec.taint`` {key, value, effect}. For each failed mark the agent
finds its device in the node's slices (by the ``uuid`` attribute, as pod attribution does) and
keeps a rule ``gpu-agent.io/health=failed:NoSchedule`` on it; a rule whose mark cleared (or
whose device is gone) is deleted. Rules carry the label ``gpu-agent.io/node=<node>``, so the
agent lists (once) and deletes only its own. A cluster that serves no version of the API is
said once and asked again hourly (agent/kube_discovery.py); one whose discovery lists it but
answers 404 is asked again every ``UNSERVED_RETRY_S``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent.errors import AgentError, NotFound
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
    """One `sync` pass: the rules the marks want on the devices of the node's slices (from the
    shared ResourceSlice informer), created and deleted against the rules the agent knows it
    has (listed once, then kept from its own writes: it is their only writer)."""

    def __init__(
        self,
        request: Callable[..., Any],
        node: str,
        marks: Callable[[], Marks],
        uuids: Callable[[], Mapping[Target, tuple[str, ...]]],
        *,
        clock: Callable[[], float] = time.monotonic,
        slices: Callable[[], list[Any] | None] | None = None,
        rules: Callable[[], str | None] | None = None,
    ) -> None:
        """``slices``: the node's ResourceSlices as cached, None before the cache is first
        listed (else listed each pass); ``rules``:
        the DeviceTaintRule collection at the version discovery chose, None when unserved
        (agent/kube_discovery.py; else v1alpha3)."""
        self._request = request
        self._node = node
        self._marks = marks
        self._uuids = uuids
        self._clock = clock
        self._slices = slices
        self._rules = rules or (lambda: RULES)
        self._unserved_until = 0.0
        #: the agent's rules as last listed and since written; None: list them
        self._have: set[str] | None = None

    def sync(self) -> None:
        if self._clock() < self._unserved_until:
            return
        path = self._rules()
        if path is None:
            return  # not served: discovery said so once
        devices = self._devices()
        if devices is None:
            return  # slices not listed yet: unknown devices are not "no device" (no delete)
        have = self._listed(path)
        if have is None:
            return
        want = wanted_rules(self._node, self._marks(), self._uuids(), devices)
        version = path.split("/")[3]
        try:
            for name in sorted(set(want) - have):
                body = dict(want[name], apiVersion=f"resource.k8s.io/{version}")
                self._request("POST", path, body=body)
                have.add(name)
                log.warning("DRA device taint %s: %s", name, want[name]["spec"]["deviceSelector"])
            for name in sorted(have - set(want)):
                with contextlib.suppress(NotFound):
                    self._request("DELETE", f"{path}/{name}")
                have.discard(name)
                log.info("DRA device taint %s removed", name)
        except AgentError:
            self._have = None  # listed again next pass: what got through is not guessed
            raise

    def _listed(self, path: str) -> set[str] | None:
        if self._have is not None:
            return self._have
        query = {"labelSelector": f"{NODE_LABEL}={self._node}"}
        try:
            listing = self._request("GET", path, query=query)
        except NotFound:
            self._unserved_until = self._clock() + UNSERVED_RETRY_S
            log.info(
                "the API server does not serve %s (feature gate DRADeviceTaints off): no DRA "
                "device taints; asking again in %.0fs",
                path,
                UNSERVED_RETRY_S,
            )
            return None
        self._have = {str(i["metadata"]["name"]) for i in (listing or {}).get("items") or ()}
        return self._have

    def _devices(self) -> dict[tuple[str, str], str] | None:
        if self._slices is not None:
            items: Any = self._slices()
            if items is None:
                return None
        else:
            query = {"fieldSelector": f"spec.nodeName={self._node}"}
            items = (self._request("GET", SLICES, query=query) or {}).get("items") or ()
        # only devices that name their UUID: a dynamic MIG placement is no instance yet
        return {k: d.uuid for k, d in slice_devices(items).items() if d.uuid}
