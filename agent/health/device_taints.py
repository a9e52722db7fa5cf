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

A rule write the API server refuses (403: no RBAC for it; 422: an admission webhook; 429; 5xx)
is held back per rule, 30 s doubling to 10 min, jittered, at least a 429's Retry-After, and
said once in the log and for as long as it lasts in `DeviceTaints.refused` (GetNode's
"kubernetes" component): the rule was re-sent with a list of them every health pass (10 s).
A create that got through unseen (a 5xx after it) is not guessed at: its retry's 409 says it
is there.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from agent.backoff import Backoff, BackoffPolicy, Key
from agent.errors import AgentError, Conflict, NotFound
from agent.health.machine import Mark, State
from agent.health.store import Target
from agent.kube_watch import retry_after_s
from agent.telemetry.dra import DRIVER, slice_devices

log = logging.getLogger(__name__)

__all__ = ["RULES", "DeviceTaints", "rule_name", "wanted_rules"]

RULES = "/apis/resource.k8s.io/v1alpha3/devicetaintrules"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NODE_LABEL = "gpu-agent.io/node"
TAINT = {"key": "gpu-agent.io/health", "value": "failed", "effect": "NoSchedule"}
UNSERVED_RETRY_S = 600.0
#: The wait after a refused write or list, per rule: doubling, each shortened by up to half at
#: random so that nodes refused together spread out.
RETRY = BackoffPolicy(base_s=30.0, max_s=600.0, jitter=0.5)
LIST = ("list", "")
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
        #: ("create" / "delete", rule name) or LIST -> refused, held back until
        self._retry = Backoff(RETRY)

    def sync(self) -> None:
        now = self._clock()
        if now < self._unserved_until:
            return
        path = self._rules()
        if path is None:
            return  # not served: discovery said so once
        devices = self._devices()
        if devices is None:
            return  # slices not listed yet: unknown devices are not "no device" (no delete)
        have = self._listed(path, now)
        if have is None:
            return
        want = wanted_rules(self._node, self._marks(), self._uuids(), devices)
        version = path.split("/")[3]
        for name in sorted(set(want) - have):
            body = dict(want[name], apiVersion=f"resource.k8s.io/{version}")
            if self._sent(("create", name), now, partial(self._create, path, body)):
                have.add(name)
                log.warning("DRA device taint %s: %s", name, want[name]["spec"]["deviceSelector"])
        for name in sorted(have - set(want)):
            if self._sent(("delete", name), now, partial(self._delete, f"{path}/{name}")):
                have.discard(name)
                log.info("DRA device taint %s removed", name)
        # a rule no longer to be written (its mark cleared, or written) is not held back
        self._retry.retain(lambda key: key == LIST or key[1] in (set(want) ^ have))

    def refused(self) -> str:
        """What the API server refuses now ("" when nothing): each rule held back, and why."""
        return "; ".join(
            f"DeviceTaintRule {'list' if key == LIST else f'{key[0]} {key[1]}'} refused "
            f"{held.failures} time(s), again in {max(0.0, held.retry_at - self._clock()):.0f}s: "
            f"{held.detail}"
            for key, held in sorted(self._retry.held().items())
        )

    def _sent(self, key: Key, now: float, send: Callable[[], object]) -> bool:
        """Whether ``send`` got through; a refusal is held back and said once."""
        if self._retry.waiting(key, now):
            return False
        try:
            send()
        except AgentError as exc:
            self._refused(key, now, exc)
            return False
        self._retry.succeeded(key)
        return True

    def _refused(self, key: Key, now: float, exc: AgentError) -> None:
        wait = retry_after_s(exc) or 0.0  # a 429's Retry-After, when longer than the back-off
        held = self._retry.failed(key, now, detail=str(exc), at_least_s=wait)
        said = log.warning if held.failures == 1 else log.debug
        said("DRA device taints: %s; again in %.0fs", exc, held.retry_at - now)

    def _create(self, path: str, body: dict[str, Any]) -> None:
        try:
            self._request("POST", path, body=body)
        except Conflict:
            return  # there already: an earlier create got through unseen

    def _delete(self, path: str) -> None:
        try:
            self._request("DELETE", path)
        except NotFound:
            return  # gone already

    def _listed(self, path: str, now: float) -> set[str] | None:
        if self._have is not None:
            return self._have
        if self._retry.waiting(LIST, now):
            return None
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
        except AgentError as exc:
            self._refused(LIST, now, exc)
            return None
        self._retry.succeeded(LIST)
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
