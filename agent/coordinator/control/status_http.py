"""GET /fleet/status on `coordinator serve`: the fleet status sweep over its open channels.

A shell's `fleet status` dials and handshakes every agent (3.7 s of CPU for 1,000 agents over
mTLS); the coordinator keeps its channels between passes, so asking it costs only the calls
(BENCHMARKS.md). A sweep of 1,000 agents still takes ~1.8 s of CPU, so the answer is the
latest sweep when it is at most ``max_age_s`` old (each reconcile pass's sweep feeds it, and a
request past half that age refreshes it in the background for the next one), a new sweep
otherwise or with ``fresh=1``. The answer says when its sweep was (``observed_at``, ``age_s``).
Concurrent requests share one sweep.

The default answer is the summary (agent.coordinator.fleet.status: totals, profiles, the
nodes that need attention); ``nodes=1`` adds every node's record. The summary of each pass's
sweep is rendered in a thread as the sweep lands, and until it is ready a request gets the
previous sweep's: at 5,000 nodes the render takes seconds of CPU, a request should not wait.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.fleet.inventory import NodeView
from agent.coordinator.fleet.query import StatusQuery, parse_duration
from agent.coordinator.fleet.selector import Selector, parse_selector
from agent.coordinator.fleet.status import fleet_status, status_document
from agent.coordinator.flows import check_labels, select
from agent.errors import AgentError, InvalidSpec
from agent.http import Request, Response

__all__ = ["DEFAULT_IDLE_AFTER_S", "StatusEndpoint"]

_JSON = "application/json"
#: rendered answers one sweep keeps
_RENDERED_MAX = 16
#: the sweep the reconcile loop makes counts GPUs idle this long (`fleet status`'s default)
DEFAULT_IDLE_AFTER_S = 3600.0


@dataclass
class _Sweep:
    views: tuple[NodeView, ...]
    idle_after_s: float
    #: monotonic, for its age; ``observed_at`` is the wall-clock time shown
    at: float
    observed_at: float
    #: rendered answers by (selector, idle threshold, every node), the latest `_RENDERED_MAX`:
    #: the status records cost 0.5 s at 1,000 nodes, and a caller varying its query must not
    #: grow the cache without end
    rendered: dict[tuple[str, str, bool], bytes] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: the default answer being rendered off the loop (`StatusEndpoint.observe`)
    rendering: asyncio.Future[bytes] | None = None
    #: the agents swept, by node name: a selector on labels is checked against them
    targets: Mapping[str, Target] = field(default_factory=dict)

    def answer(self, key: tuple[str, str, bool]) -> bytes | None:
        with self._lock:
            return self.rendered.get(key)

    def keep(self, key: tuple[str, str, bool], body: bytes) -> None:
        with self._lock:  # kept from render threads and the loop alike
            self.rendered[key] = body
            while len(self.rendered) > _RENDERED_MAX:
                del self.rendered[next(iter(self.rendered))]


class StatusEndpoint:
    def __init__(
        self,
        fleet: Fleet,
        *,
        max_age_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``max_age_s`` 0: every request sweeps (nothing is reused). ``clock`` (monotonic)
        ages sweeps; ``wall`` only dates them."""
        self._fleet = fleet
        self._max_age_s = max_age_s
        self._clock = clock
        self._wall = wall
        self._last: _Sweep | None = None
        #: the latest sweep whose default answer is rendered (answers while a newer renders)
        self._ready: _Sweep | None = None
        #: the sweep in flight, and its idle threshold
        self._running: tuple[float, asyncio.Future[_Sweep]] | None = None
        self._refresh: asyncio.Task[None] | None = None

    def observe(
        self,
        views: Sequence[NodeView],
        idle_after_s: float,
        at: float,
        targets: Mapping[str, Target] | None = None,
    ) -> None:
        """A sweep made elsewhere (the reconcile pass, ``at`` on this endpoint's monotonic
        clock; ``targets``: its agents by node name), for the next requests."""
        observed_at = self._wall() - (self._clock() - at)
        sweep = _Sweep(tuple(views), idle_after_s, at, observed_at, targets=dict(targets or {}))
        self._last = sweep
        # The default answer is rendered now, in a thread, so that a request finds it ready
        # instead of building it on the loop: at 5,000 nodes that takes seconds of CPU, while
        # the loop also carries the next pass's calls (BENCHMARKS.md).
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a caller outside serve): the first request renders it
        sweep.rendering = asyncio.ensure_future(
            asyncio.to_thread(self._render, sweep, Selector(), StatusQuery())
        )
        sweep.rendering.add_done_callback(lambda _: self._rendered(sweep))

    def _rendered(self, sweep: _Sweep) -> None:
        ready = self._ready
        if ready is None or ready.at <= sweep.at:
            self._ready = sweep

    async def __call__(self, request: Request) -> Response:
        query = StatusQuery.from_path(request.path)
        try:
            selector = parse_selector(query.selector)
            seconds = parse_duration(query.idle_after)
        except InvalidSpec as exc:
            body = {"error": str(exc), "violations": [v.description for v in exc.violations]}
            return Response(400, json.dumps(body).encode(), _JSON)
        sweep = self._reusable(seconds, query.fresh)
        if sweep is None:
            sweep = await self._sweep(seconds)
        elif sweep is self._last and self._clock() - sweep.at > self._max_age_s / 2:
            self._refresh_later(seconds)  # no newer sweep is on its way: start one
        try:  # as `fleet status` checks a selector on labels against the agents it found
            check_labels(sweep.targets.values(), selector)
        except AgentError as exc:
            code = 400 if isinstance(exc, InvalidSpec) else 503
            return Response(code, json.dumps({"error": str(exc)}).encode(), _JSON)
        if sweep.rendering is not None and not sweep.rendering.done():
            await asyncio.shield(sweep.rendering)  # the same bytes, rendered once
        found = sweep.answer(_key(selector, query))
        if found is None:  # another query: rendered off the loop, which carries the passes
            found = await asyncio.to_thread(self._render, sweep, selector, query)
        return Response(200, self._aged(sweep, found), _JSON)

    def _reusable(self, idle_after_s: float, fresh: bool) -> _Sweep | None:
        """The sweep to answer from: the newest whose answer is rendered, else the newest
        (its render is then waited for), if young enough; None: sweep anew."""
        if fresh:
            return None
        last, ready = self._last, self._ready
        rendering = last is not None and last.rendering is not None and not last.rendering.done()
        for sweep in (ready, last) if rendering else (last,):
            if sweep is None or sweep.idle_after_s != idle_after_s:
                continue
            if self._clock() - sweep.at <= self._max_age_s:
                return sweep
        return None

    async def _sweep(self, idle_after_s: float) -> _Sweep:
        """A new sweep; a request arriving while one with its threshold runs takes that one."""
        if self._running is None or self._running[1].done() or self._running[0] != idle_after_s:
            self._running = (idle_after_s, asyncio.ensure_future(self._new_sweep(idle_after_s)))
        return await asyncio.shield(self._running[1])

    async def _new_sweep(self, idle_after_s: float) -> _Sweep:
        at, observed_at = self._clock(), self._wall()
        selection = await select(self._fleet, Selector(), idle_after_s=idle_after_s)
        self._last = _Sweep(
            selection.views, idle_after_s, at, observed_at, targets=selection.targets
        )
        return self._last

    def _refresh_later(self, idle_after_s: float) -> None:
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.create_task(self._background(idle_after_s))

    async def _background(self, idle_after_s: float) -> None:
        sweep = await self._sweep(idle_after_s)
        await asyncio.to_thread(self._render, sweep, Selector(), StatusQuery())

    def _render(self, sweep: _Sweep, selector: Selector, query: StatusQuery) -> bytes:
        key = _key(selector, query)
        found = sweep.answer(key)
        if found is None:
            views = [v for v in sweep.views if selector.matches(v)]
            status = fleet_status(views)
            document = status_document(status, query.idle_after, nodes=query.nodes)
            document["observed_at"] = sweep.observed_at
            found = json.dumps(document).encode()
            sweep.keep(key, found)
        return found

    def _aged(self, sweep: _Sweep, body: bytes) -> bytes:
        # The age is the only part that changes between requests: patched into the bytes.
        age = f'{{"age_s": {max(0.0, self._clock() - sweep.at):.1f}, '.encode()
        return age + body[1:]


def _key(selector: Selector, query: StatusQuery) -> tuple[str, str, bool]:
    return (str(selector), query.idle_after, query.nodes)
