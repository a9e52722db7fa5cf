"""GET /fleet/status on `coordinator serve`: the fleet status sweep over its open channels.

A shell's `fleet status` dials and handshakes every agent (3.7 s of CPU for 1,000 agents over
mTLS); the coordinator keeps its channels between passes, so asking it costs only the calls
(BENCHMARKS.md). It answers what `fleet status -o json` prints; nothing is cached.
"""

from __future__ import annotations

import json

from agent.coordinator.fleet import Fleet
from agent.coordinator.flows import select
from agent.coordinator.query import StatusQuery, parse_duration
from agent.coordinator.selector import parse_selector
from agent.coordinator.status import fleet_status, status_document
from agent.errors import InvalidSpec
from agent.http import Request, Response

__all__ = ["StatusEndpoint"]

_JSON = "application/json"


class StatusEndpoint:
    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    async def __call__(self, request: Request) -> Response:
        query = StatusQuery.from_path(request.path)
        try:
            selector = parse_selector(query.selector)
            seconds = parse_duration(query.idle_after)
        except InvalidSpec as exc:
            body = {"error": str(exc), "violations": [v.description for v in exc.violations]}
            return Response(400, json.dumps(body).encode(), _JSON)
        selection = await select(self._fleet, selector, idle_after_s=seconds)
        document = status_document(fleet_status(selection.views), query.idle_after)
        return Response(200, json.dumps(document).encode(), _JSON)
