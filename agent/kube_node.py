"""The one writer of the agent's own Node: features state their keys, `NodeOwner` writes.

Each feature that marks the Node (cache labels, health labels, condition and taint, the
reclaimable annotation) gets a `NodePart` for the keys it `Claim`s: exact keys, or every key
under a prefix. It states the whole of what it wants (``set``) as often as it likes; the owner
compares what all parts want with the Node as its watch last delivered it (`plan`, pure) and
writes only the difference, waiting ``coalesce_s`` after the first change so a burst (an
item turned ready, a health mark, a MIG state) is one write. A restated unchanged state is
no write; nothing is re-written on a timer: the watch shows the owner every change, so a
label someone removed is put back once, when it happens. Keys nobody claimed (the kubelet's,
NFD's, the GPU Operator's, a user's) are never in a patch. Features that must act on others'
keys once (the MIG protocol pausing operands, the sharing reload switching the plugin's
config label) use `NodeOwner.write_now`, diffed the same way and written at once, unless
the Node write failed and its back-off is not over (it would fail the same way: said, not
sent). A failed write is retried after a jittered back-off doubling to 30 s; one the API
server refuses for good (403: RBAC; 422: a webhook, validation) doubles to ``REFUSED_MAX_S``.

Why JSON merge patch of just the changed keys and not server-side apply: the difference has
to be computed anyway to make no request at all when nothing changed (an apply of an
unchanged intent is still a request, and on some versions a managedFields write), and a
merge patch of a few keys is one small request every supported server takes. What apply adds
is field ownership across managers; the agent keeps that itself by claims, and the taints
list (replaced whole by a merge patch) is sent with the Node's resourceVersion as a
precondition, so a concurrent writer's taint is never lost (409, then planned again from the
watch). Conditions go to the status subresource (strategic merge by ``type``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from agent import safeyaml
from agent.errors import AgentError, Conflict
from agent.kube import Requests, refused_for_good
from agent.kube_watch import BACKOFF_S, Informer, retry_wait, unexpected_error

log = logging.getLogger(__name__)

__all__ = ["Claim", "NodeOwner", "NodePart", "Writes", "plan"]

#: How long after the first change the owner waits for more before it writes.
COALESCE_S = 0.2
#: The longest wait after a Node write refused for good: sent again every 30 s from every
#: node, it changes nothing but the API server's load.
REFUSED_MAX_S = 600.0

#: The two writes of a plan, which fail apart: the status subresource, the Node itself.
STATUS, NODE = "status", "node"
_WHAT = {STATUS: "the status write", NODE: "the Node write"}


class _Failed(AgentError):
    """A write of the owner that failed, already said and recorded (`NodeOwner.error`)."""


@dataclass(frozen=True, slots=True)
class Claim:
    """The keys of the Node one feature owns."""

    name: str
    label_keys: frozenset[str] = frozenset()
    label_prefixes: tuple[str, ...] = ()
    annotation_keys: frozenset[str] = frozenset()
    #: a status condition type
    condition: str | None = None
    #: a taint key
    taint: str | None = None

    def owns_label(self, key: str) -> bool:
        return key in self.label_keys or key.startswith(self.label_prefixes or ("\0",))


@dataclass(slots=True)
class Desired:
    """What a part wants; None: not stated yet (the owner touches nothing of it)."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    #: a condition {type, status, reason, message}; absent key: not stated
    condition: dict[str, str] | None = None
    condition_stated: bool = False
    taint: dict[str, str] | None = None
    taint_stated: bool = False


@dataclass(frozen=True, slots=True)
class Writes:
    """The writes a plan needs: a merge patch of the Node, a strategic-merge patch of its
    status; None for none."""

    node: dict[str, Any] | None = None
    status: dict[str, Any] | None = None
    said: tuple[str, ...] = field(default=())


def plan(
    node: Mapping[str, Any],
    parts: Sequence[tuple[Claim, Desired]],
    once: Mapping[str, str | None] | None = None,
    now: str = "",
) -> Writes:
    """The difference between the Node and what the parts want (and the one-shot ``once``
    labels), touching only claimed keys. ``now``: the RFC 3339 time a condition is stamped."""
    meta = node.get("metadata") or {}
    labels: dict[str, str | None] = {}
    annotations: dict[str, str | None] = {}
    for claim, want in parts:
        if want.labels is not None:
            labels |= _diff(meta.get("labels") or {}, want.labels, claim.owns_label)
        if want.annotations is not None:
            owned = claim.annotation_keys.__contains__
            annotations |= _diff(meta.get("annotations") or {}, want.annotations, owned)
    current = meta.get("labels") or {}
    for key, value in (once or {}).items():
        if current.get(key) != value and not (value is None and key not in current):
            labels[key] = value
    body: dict[str, Any] = {}
    if labels or annotations:
        body["metadata"] = {
            k: v for k, v in (("labels", labels), ("annotations", annotations)) if v
        }
    taints = _taints(node, parts)
    if taints is not None:
        body.setdefault("metadata", {})["resourceVersion"] = meta.get("resourceVersion")
        body["spec"] = {"taints": taints}
    conditions = _conditions(node, parts, now)
    said = tuple(sorted(labels) + sorted(annotations)) + (("taints",) if taints is not None else ())
    return Writes(
        node=body or None,
        status={"status": {"conditions": conditions}} if conditions else None,
        said=said + tuple(c["type"] for c in conditions),
    )


def _diff(
    current: Mapping[str, str], want: Mapping[str, str], owns: Callable[[str], bool]
) -> dict[str, str | None]:
    changes: dict[str, str | None] = {k: v for k, v in want.items() if current.get(k) != v}
    changes |= {k: None for k in current if owns(k) and k not in want}
    return changes


def _taints(node: Mapping[str, Any], parts: Sequence[tuple[Claim, Desired]]) -> list[Any] | None:
    current = list((node.get("spec") or {}).get("taints") or [])
    stated = [(c.taint, d.taint) for c, d in parts if c.taint and d.taint_stated]
    if not stated:
        return None
    keys = {key for key, _ in stated}
    wanted = [dict(t) for _, t in stated if t is not None]
    ours = [t for t in current if t.get("key") in keys]
    same = len(ours) == len(wanted) and all(
        any({k: t.get(k) for k in w} == w for t in ours) for w in wanted
    )
    if same:
        return None
    return [t for t in current if t.get("key") not in keys] + wanted


def _conditions(
    node: Mapping[str, Any], parts: Sequence[tuple[Claim, Desired]], now: str
) -> list[dict[str, str]]:
    current = {c.get("type"): c for c in (node.get("status") or {}).get("conditions") or [] if c}
    out = []
    for claim, want in parts:
        if not (claim.condition and want.condition_stated and want.condition is not None):
            continue
        cond = dict(want.condition, type=claim.condition)
        have = current.get(claim.condition) or {}
        if all(have.get(k) == cond.get(k) for k in ("status", "reason", "message")):
            continue
        same_status = have.get("status") == cond["status"] and have.get("lastTransitionTime")
        cond["lastTransitionTime"] = str(have["lastTransitionTime"]) if same_status else now
        cond["lastHeartbeatTime"] = now
        out.append(cond)
    return out


def _version(node: object) -> object:
    meta = node.get("metadata") if isinstance(node, dict) else None
    return meta.get("resourceVersion") if isinstance(meta, dict) else None


class NodePart:
    """One feature's keys on the Node; ``set`` states them whole (a key under a claimed
    prefix that is not stated is removed)."""

    def __init__(self, owner: NodeOwner, claim: Claim) -> None:
        self.claim = claim
        self._owner = owner
        self.desired = Desired()

    _UNSET: Any = object()

    def set(
        self,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        condition: Mapping[str, str] | None = _UNSET,
        taint: Mapping[str, str] | None = _UNSET,
    ) -> None:
        for key in labels or {}:
            if not self.claim.owns_label(key):
                raise ValueError(f"{self.claim.name} does not own the label {key}")
        with self._owner.lock:
            before = replace(self.desired)  # a copy: the owner wakes only for a change
            if labels is not None:
                self.desired.labels = dict(labels)
            if annotations is not None:
                self.desired.annotations = dict(annotations)
            if condition is not self._UNSET:
                self.desired.condition = dict(condition) if condition else None
                self.desired.condition_stated = True
            if taint is not self._UNSET:
                self.desired.taint = dict(taint) if taint else None
                self.desired.taint_stated = True
            changed = self.desired != before
        if changed:
            self._owner.wake()


def _without(writes: Writes, parts: Collection[str]) -> Writes:
    """``writes`` less the ``parts`` (STATUS, NODE) held back, and less what they would say."""
    conditions = {c["type"] for c in (writes.status or {}).get("status", {}).get("conditions", [])}
    said = [k for k in writes.said if (STATUS if k in conditions else NODE) not in parts]
    return Writes(
        node=None if NODE in parts else writes.node,
        status=None if STATUS in parts else writes.status,
        said=tuple(said),
    )


class NodeOwner:
    """Writes this agent's parts of its Node, from its shared Node informer's cache."""

    def __init__(
        self,
        kube: Requests,
        node: str,
        informer: Informer,
        *,
        coalesce_s: float = COALESCE_S,
        backoff: tuple[float, float] = BACKOFF_S,
        refused_max_s: float = REFUSED_MAX_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._kube = kube
        self.node = node
        self.informer = informer
        self._coalesce_s = coalesce_s
        self._backoff = backoff
        self._refused_max_s = refused_max_s
        self._clock = clock
        self.lock = threading.RLock()
        self._parts: list[NodePart] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: writes made (PATCHes of the Node and of its status), for tests and the benchmark
        self.writes = 0
        #: STATUS / NODE -> why that PATCH last failed
        self._errors: dict[str, str] = {}
        self._traced = False
        #: STATUS / NODE -> the next back-off and when that write may be tried again: the two
        #: fail apart (a refused status must not hold the health labels back, nor the reverse)
        self._delay = {STATUS: backoff[0], NODE: backoff[0]}
        self._not_before = {STATUS: 0.0, NODE: 0.0}

    def part(self, claim: Claim) -> NodePart:
        with self.lock:
            for found in self._parts:
                if found.claim.name == claim.name:
                    return found
            part = NodePart(self, claim)
            self._parts.append(part)
            return part

    def node_object(self) -> dict[str, Any] | None:
        """The Node as last delivered by the watch (or returned by a write of ours)."""
        if not self.informer.synced.is_set():
            return None
        return next((o for o in self.informer.objects() if isinstance(o, dict)), None)

    def labels(self) -> dict[str, str]:
        """The cached labels; AgentError while the Node was never listed."""
        node = self.node_object()
        if node is None:
            raise AgentError(f"the Node {self.node} is not listed yet: {self.informer.error}")
        found = (node.get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in found.items()}

    def start(self) -> None:
        self.informer.add_handler(self.wake)
        self.informer.start()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="node owner", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def sync(self) -> bool:
        """Write what differs now; True when something was written. AgentError when the Node
        patch failed (a refused status write: `error`)."""
        return self.write_now({})

    def write_now(self, once: Mapping[str, str | None]) -> bool:
        """Write the parts' difference and the one-shot ``once`` labels (None removes) at
        once; a label already as asked is not written. The status (conditions) and the Node
        (labels, annotations, taints) are two PATCHes sent, failed and backed off
        independently: a refused status write (no nodes/status verb, a webhook) must not keep
        the health labels, the taint, the reclaim mark or the sharing reload's label off the
        Node, nor a refused label the GPUHealthy condition. A part in the back-off of its
        failure is not sent (the owner's thread tries it when that ends). AgentError when the
        Node patch failed, or ``once`` labels are held back; a refused status and the parts'
        own changes held back are only recorded (`error`, GetNode): the owner writes them."""
        with self.lock:
            node = self.node_object()
            if node is None:
                if once:
                    raise AgentError(f"the Node {self.node} is not listed yet")
                return False
            held = self._held()  # not sent while their back-off runs; their failures stand
            parts = [(p.claim, p.desired) for p in self._parts]
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._clock()))
            planned = plan(node, parts, once, now)
            writes = _without(planned, held)
            failed = self._send(writes)
            self._settle(writes, failed, frozenset(held))
            if NODE in failed:  # a refused status is the owner's to retry, not the caller's
                raise _Failed(self.error) from failed[NODE]
            if NODE in held and once and planned.node is not None:  # the caller's, not sent
                raise _Failed(f"{self.error}; held back, again in {held[NODE]:.0f}s")
            return bool(writes.node or writes.status)

    def _held(self) -> dict[str, float]:
        """The parts in the back-off of their last failure, with the seconds left of it."""
        now = time.monotonic()
        return {
            part: self._not_before[part] - now
            for part in (STATUS, NODE)
            if part in self._errors and self._not_before[part] > now
        }

    def _send(self, writes: Writes) -> dict[str, Exception]:
        """PATCH the status, then the Node; what failed, by part."""
        path = f"/api/v1/nodes/{urllib.parse.quote(self.node, safe='')}"
        failed: dict[str, Exception] = {}
        # The condition first: a reader that sees the labels or taint sees it too.
        if writes.status is not None:
            strategic = "application/strategic-merge-patch+json"
            try:
                answer = self._write(f"{path}/status", writes.status, strategic)
            except Exception as exc:  # said and retried; the Node patch still goes
                failed[STATUS] = exc
            else:
                if writes.node is not None and "resourceVersion" in writes.node["metadata"]:
                    # The taints' precondition is the Node as the status write left it
                    # (when it failed: as the watch delivered it, set by `plan`).
                    writes.node["metadata"]["resourceVersion"] = _version(answer)
        if writes.node is not None:
            try:
                self._write(path, writes.node, "application/merge-patch+json")
            except Exception as exc:
                failed[NODE] = exc
        return failed

    def _settle(
        self, writes: Writes, failed: Mapping[str, Exception], held: frozenset[str] = frozenset()
    ) -> None:
        """Say what was written, record each part's failure (or clear it: written, or nothing
        left to write) and when the owner's thread may try the failed part again; ``held``:
        the parts not tried (in their back-off), whose failures stand."""
        conditions = {
            c["type"] for c in (writes.status or {}).get("status", {}).get("conditions", [])
        }
        said = [k for k in writes.said if (STATUS if k in conditions else NODE) not in failed]
        if said:
            log.info("Node %s: wrote %s", self.node, ", ".join(said))
        written = {STATUS: writes.status is not None, NODE: writes.node is not None}
        for part in (STATUS, NODE):
            if part not in failed and part not in held:
                self._errors.pop(part, None)  # written, or nothing left to write
                if written[part]:  # a write that went through starts the back-off over
                    self._delay[part], self._not_before[part] = self._backoff[0], 0.0
        if not self._errors:
            self._traced = False
        if not failed:
            return
        trace: BaseException | None = None
        for part, exc in failed.items():
            if isinstance(exc, AgentError):
                why = str(exc)
            else:  # a bug of ours, an answer no check foresaw: traced once until a success
                why = unexpected_error(exc)
                trace = None if self._traced else exc
                self._traced = True
            keys = [k for k in writes.said if (k in conditions) == (part == STATUS)]
            what = f" ({safeyaml.some(keys, 3)})" if keys else ""
            self._errors[part] = f"{_WHAT[part]}{what} failed: {why}"
            self._back_off(part, exc)
        wait = min(self._not_before[part] for part in failed) - time.monotonic()
        log.warning(
            "writing Node %s failed (%s); again in %.1fs",
            self.node,
            self.error,
            wait,
            exc_info=trace,
        )
        self._wake.set()

    def _back_off(self, part: str, exc: Exception) -> None:
        wait = retry_wait(exc, self._delay[part])  # a 429's Retry-After, else jittered
        self._not_before[part] = time.monotonic() + wait
        longest = self._backoff[1]
        if refused_for_good(exc):
            longest = max(longest, self._refused_max_s)  # the same write is refused again
        self._delay[part] = min(longest, self._delay[part] * 2)

    @property
    def held_until(self) -> float:
        """When (time.monotonic) the Node patch may be sent again after a failure; past when
        none (a failed status write has its own back-off)."""
        return self._not_before[NODE]

    def _next_retry_s(self) -> float | None:
        """Seconds until a failed write's back-off ends (the owner's thread wakes then for
        it); None when no write failed, or the Node is not listed (its watch wakes it)."""
        if self.node_object() is None:
            return None
        with self.lock:  # a caller's write_now changes the errors meanwhile
            due = [self._not_before[part] for part in self._errors]
        return max(0.0, min(due) - time.monotonic()) if due else None

    @property
    def error(self) -> str:
        """What of the Node's last write failed and why; "" when all was written."""
        errors = dict(self._errors)  # read by GetNode while a write changes them
        return "; ".join(errors[p] for p in (STATUS, NODE) if p in errors)

    def _write(self, path: str, body: dict[str, Any], content_type: str) -> object:
        try:
            answer = self._kube.request("PATCH", path, body=body, content_type=content_type)
        except Conflict as exc:  # the taints changed meanwhile: planned again from the watch
            raise AgentError(f"the Node changed while it was written: {exc}") from exc
        self.writes += 1
        if isinstance(answer, dict):
            self.informer.assume(answer)
        return answer

    def _run(self) -> None:
        while not self._stop.is_set():
            # A change wakes it, and so does the end of a failed write's back-off (a part in
            # its back-off is not sent meanwhile: `write_now`).
            self._wake.wait(self._next_retry_s())
            if self._stop.wait(self._coalesce_s):  # a burst of changes is one write
                return
            self._wake.clear()
            try:
                with contextlib.suppress(_Failed):  # recorded, said and rescheduled by _settle
                    self.sync()
            except Exception as exc:  # planning failed (a bug, a cached answer no check
                # foresaw): a failed write, said and retried; the thread must not end
                with self.lock:  # nothing was sent: the status's state stands as it was
                    self._settle(Writes(), {NODE: exc}, frozenset({STATUS}))
