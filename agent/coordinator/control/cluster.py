"""What `coordinator serve` tells the cluster: an Event on the Node for every rollout step, and
each kind's rollout status in one ConfigMap that ``kubectl get`` shows.

- Events (core/v1, namespace ``default`` as the kubelet puts Node events, ``involvedObject``
  the Node with its name as uid, so ``kubectl describe node`` lists them): reason
  ``RolloutStarted`` when a node starts, ``MigConfigChanged`` / ``SharingChanged`` /
  ``PrewarmDone`` when it succeeds, ``RolloutUnchanged`` when it needed nothing,
  ``RolloutFailed`` (Warning) when it fails.
- ConfigMap ``gpu-agent-rollout-status`` in the coordinator's namespace, one key per kind
  (``mig``, ``share``, ``prewarm``): JSON with the rollout's state, limits, halt reason, the
  leader's identity, the count of nodes per state, and per node its state, attempt and detail
  (the failed and running nodes first, at most ``MAX_LISTED``: a ConfigMap holds 1 MiB).
  Written at the start, then at most once per ``every_s`` with the latest state while nodes
  end, and at the end (`CoalescedStatus`), with the resourceVersion just read (a 409 re-reads
  once): a rollout of N nodes is a few writes, not N writes of every node (O(N²) bytes).

Reporting never fails a rollout: an API error is logged and the rollout goes on.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
import logging
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from typing import Any

from agent.coordinator.rollout.record import RolloutRecord
from agent.errors import AgentError, Conflict, NotFound
from agent.kube import Requests

__all__ = [
    "STATUS_CONFIGMAP",
    "ClusterReport",
    "CoalescedStatus",
    "status_document",
]

log = logging.getLogger(__name__)

STATUS_CONFIGMAP = "gpu-agent-rollout-status"
EVENT_NAMESPACE = "default"
COMPONENT = "gpu-agent-coordinator"
#: A node's detail in an Event or the ConfigMap is cut to this (a ConfigMap holds 1 MiB).
MAX_DETAIL = 256
#: Nodes listed one by one in the status ConfigMap (~0.4 MB at most with full details).
MAX_LISTED = 1000
#: The failed and running nodes are listed first: they are what a reader looks for.
_LIST_FIRST = {"failed": 0, "running": 1}

_SUCCESS_REASON = {
    "mig": "MigConfigChanged",
    "power": "PowerCapsApplied",
    "share": "SharingChanged",
    "prewarm": "PrewarmDone",
}


def _time(wall: float) -> str:
    return dt.datetime.fromtimestamp(wall, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_document(record: RolloutRecord, state: str, leader: str) -> dict[str, Any]:
    """The ConfigMap value for one kind's rollout (pure), bounded in size."""
    entries = record.nodes.items()
    listed = sorted(entries, key=lambda e: (_LIST_FIRST.get(e[1].state, 2), e[0]))[:MAX_LISTED]
    return {
        "kind": record.kind,
        "state": state,
        "leader": leader,
        "max_unavailable": record.max_unavailable,
        "max_failures": record.max_failures,
        "halted": record.halted,
        "counts": dict(sorted(Counter(r.state for r in record.nodes.values()).items())),
        "nodes": {
            n: {"state": r.state, "attempt": r.attempt, "detail": r.detail[:MAX_DETAIL]}
            for n, r in sorted(listed)
        },
        "nodes_not_listed": len(record.nodes) - len(listed),
    }


class ClusterReport:
    """Blocking calls: the reconciler runs them in a thread."""

    def __init__(
        self,
        kube: Requests,
        namespace: str,
        identity: str,
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._identity = identity
        self._wall = wall
        self._seq = 0

    def node_step(self, kind: str, node: str, state: str, detail: str) -> None:
        """The Event for a node starting or ending (``state`` a NodeState value)."""
        if state == "running":
            reason, kind_of = "RolloutStarted", "Normal"
            message = f"{kind} rollout: changing this node"
        elif state == "succeeded":
            reason, kind_of = _SUCCESS_REASON.get(kind, "RolloutSucceeded"), "Normal"
            message = f"{kind} rollout: {detail or 'done'}"
        elif state == "unchanged":
            reason, kind_of, message = "RolloutUnchanged", "Normal", f"{kind}: already as desired"
        else:
            reason, kind_of = "RolloutFailed", "Warning"
            message = f"{kind} rollout failed: {detail}"
        self.event(node, reason, message[:MAX_DETAIL], kind_of)

    def event(self, node: str, reason: str, message: str, kind_of: str = "Normal") -> None:
        now = _time(self._wall())
        self._seq += 1
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{node}.gpu-agent.{int(self._wall() * 1e6):x}.{self._seq}"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "reason": reason,
            "message": message,
            "type": kind_of,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._identity,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._kube.request("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body=body)
        except AgentError as exc:
            log.warning("cannot post the %s event on node %s: %s", reason, node, exc)

    def status(self, record: RolloutRecord, state: str) -> None:
        """Write this kind's key of the status ConfigMap (other kinds' keys are kept)."""
        value = json.dumps(status_document(record, state, self._identity), sort_keys=True)
        for _ in range(2):  # a 409 (someone wrote between our read and write) reads again
            try:
                self._put(record.kind, value)
                return
            except Conflict:
                continue
            except AgentError as exc:
                log.warning("cannot write the rollout status ConfigMap: %s", exc)
                return
        log.warning("the rollout status ConfigMap kept changing under us; skipped this update")

    def _put(self, key: str, value: str) -> None:
        ns = urllib.parse.quote(self._namespace, safe="")
        base = f"/api/v1/namespaces/{ns}/configmaps"
        try:
            current = self._kube.request("GET", f"{base}/{STATUS_CONFIGMAP}")
        except NotFound:
            obj = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": STATUS_CONFIGMAP, "namespace": self._namespace},
                "data": {key: value},
            }
            self._kube.request("POST", base, body=obj)
            return
        data = dict(current.get("data") or {}) if isinstance(current, dict) else {}
        data[key] = value
        obj = dict(current, data=data)
        self._kube.request("PUT", f"{base}/{STATUS_CONFIGMAP}", body=obj)


class CoalescedStatus:
    """Each kind's rollout status, written at most once per ``every_s`` with its latest state,
    and at once when the rollout starts or ends. Runs on the event loop that changes the
    records; ``send`` hands a write to the reports' worker thread."""

    def __init__(
        self,
        report: ClusterReport,
        send: Callable[..., None],
        *,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._report = report
        self._send = send
        self.every_s = every_s
        self._clock = clock
        #: kind -> the record as it changes (copied when written) and its state
        self._latest: dict[str, tuple[RolloutRecord, str]] = {}
        self._written_at: dict[str, float] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def update(self, record: RolloutRecord, state: str, *, now: bool = False) -> None:
        """The kind's status changed; ``now`` writes it at once (a start or an end)."""
        kind = record.kind
        self._latest[kind] = (record, state)
        if now:
            self._flush(kind)
            return
        if kind in self._timers:
            return  # a write is due already and will carry this state
        wait = self._written_at.get(kind, -self.every_s) + self.every_s - self._clock()
        if wait <= 0:
            self._flush(kind)
        else:
            loop = asyncio.get_running_loop()
            self._timers[kind] = loop.call_later(wait, self._flush, kind)

    def _flush(self, kind: str) -> None:
        timer = self._timers.pop(kind, None)
        if timer is not None:
            timer.cancel()
        latest = self._latest.pop(kind, None)
        if latest is None:
            return
        record, state = latest
        self._written_at[kind] = self._clock()
        # Copied here, at most once per interval, not at every node's end.
        self._send(self._report.status, copy.deepcopy(record), state)
