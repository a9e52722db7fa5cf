"""GET /fleet/status on `coordinator serve` answers from the latest sweep while it is at most
--status-max-age old (a reconcile pass's sweep feeds it), sweeps otherwise or when asked
``fresh``, says how old its sweep is, and shares one sweep between concurrent requests.
The fleet is faked at `select`, with an injected clock."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, cast

import pytest

from agent.coordinator.control import status_http
from agent.coordinator.fleet.channels import Fleet
from agent.coordinator.fleet.discovery import Target
from agent.coordinator.fleet.inventory import NodeView
from agent.coordinator.flows import Selection
from agent.http import Request


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def sweeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Each sweep's idle threshold; a sweep answers two nodes after a yield to the loop."""
    made: list[float] = []

    async def select(fleet: object, selector: object, *, idle_after_s: float) -> Selection:
        made.append(idle_after_s)
        await asyncio.sleep(0)
        views = tuple(NodeView(f"n{i}", f"10.0.0.{i}:9401") for i in (1, 2))
        return Selection(views, {v.name: Target(v.address, v.name) for v in views})

    monkeypatch.setattr(status_http, "select", select)
    return made


def get(endpoint: status_http.StatusEndpoint, query: str = "") -> dict[str, Any]:
    """The answer with every node's record (``nodes=1``): which sweep answered is told by them."""
    if "nodes=" not in query:
        query = f"{query}&nodes=1" if query else "?nodes=1"
    response = asyncio.run(
        endpoint(cast(Request, type("R", (), {"path": f"/fleet/status{query}"})))
    )
    assert response.status == 200
    return cast(dict[str, Any], json.loads(response.body))


def test_a_recent_sweep_answers_and_says_its_age(sweeps: list[float]) -> None:
    clock = Clock()
    endpoint = status_http.StatusEndpoint(
        cast(Fleet, object()), max_age_s=60, clock=clock, wall=clock
    )
    endpoint.observe((NodeView("n9", "10.0.0.9:9401"),), 3600.0, clock.now)  # a pass's sweep
    clock.now += 20
    doc = get(endpoint)
    assert [n["name"] for n in doc["nodes"]] == ["n9"] and doc["age_s"] == 20.0
    assert doc["observed_at"] == 1000.0 and sweeps == []
    assert [n["name"] for n in get(endpoint, "?selector=name%3Dn8")["nodes"]] == []
    # fresh: a new sweep, which the next requests then reuse
    assert [n["name"] for n in get(endpoint, "?fresh=1")["nodes"]] == ["n1", "n2"]
    assert sweeps == [3600.0]
    assert get(endpoint)["age_s"] == 0.0 and sweeps == [3600.0]


def test_an_old_sweep_or_another_idle_threshold_sweeps_anew(sweeps: list[float]) -> None:
    clock = Clock()
    endpoint = status_http.StatusEndpoint(cast(Fleet, object()), max_age_s=60, clock=clock)
    endpoint.observe((NodeView("n9", "10.0.0.9:9401"),), 3600.0, clock.now)
    clock.now += 61
    assert [n["name"] for n in get(endpoint)["nodes"]] == ["n1", "n2"]
    assert get(endpoint, "?idle_after=30m")["idle_after"] == "30m"
    assert sweeps == [3600.0, 1800.0]


def test_max_age_zero_sweeps_every_time(sweeps: list[float]) -> None:
    endpoint = status_http.StatusEndpoint(cast(Fleet, object()))
    get(endpoint)
    get(endpoint)
    assert sweeps == [3600.0, 3600.0]


def test_concurrent_requests_share_one_sweep(sweeps: list[float]) -> None:
    endpoint = status_http.StatusEndpoint(cast(Fleet, object()), max_age_s=60)
    request = cast(Request, type("R", (), {"path": "/fleet/status?fresh=1"}))

    async def both() -> list[Any]:
        return list(await asyncio.gather(endpoint(request), endpoint(request)))

    answers = asyncio.run(both())
    assert [a.status for a in answers] == [200, 200] and len(sweeps) == 1


def test_a_clock_step_neither_ages_a_sweep_nor_keeps_an_old_one(sweeps: list[float]) -> None:
    """Sweeps age on the monotonic clock: the wall clock stepped an hour either way, a 20 s old
    sweep still answers as 20 s old (dated by the wall clock it was taken at)."""
    mono, wall = Clock(), Clock()
    endpoint = status_http.StatusEndpoint(
        cast(Fleet, object()), max_age_s=60, clock=mono, wall=wall
    )
    endpoint.observe((NodeView("n9", "10.0.0.9:9401"),), 3600.0, mono.now)
    for step in (3600.0, -7200.0):
        wall.now += step
        doc = get(endpoint)
        assert [n["name"] for n in doc["nodes"]] == ["n9"] and doc["age_s"] == 0.0
        assert doc["observed_at"] == 1000.0 and sweeps == []
    mono.now += 61
    assert [n["name"] for n in get(endpoint)["nodes"]] == ["n1", "n2"]


def test_a_pass_sweep_is_rendered_off_the_loop_before_a_request_asks(
    sweeps: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 5,000 nodes the answer takes seconds to build: observe() renders it in a thread, so a
    request neither builds it on the loop (where the Lease is renewed) nor builds it again."""
    import threading

    built: list[str] = []
    document = status_http.status_document

    def counted(*args: Any, **kw: Any) -> dict[str, Any]:
        built.append(threading.current_thread().name)
        return document(*args, **kw)

    monkeypatch.setattr(status_http, "status_document", counted)
    endpoint = status_http.StatusEndpoint(cast(Fleet, object()), max_age_s=60)
    request = cast(Request, type("R", (), {"path": "/fleet/status"}))

    async def pass_then_request() -> Any:
        endpoint.observe((NodeView("n9", "10.0.0.9:9401"),), 3600.0, time.monotonic())
        return await endpoint(request)  # asked while the render may still run: waits for it

    response = asyncio.run(pass_then_request())
    answer = json.loads(response.body)
    assert answer["totals"]["nodes"] == 1 and "nodes" not in answer  # the summary
    assert len(built) == 1 and built[0] != threading.main_thread().name
    assert sweeps == []


def test_the_default_answer_is_the_summary_with_the_nodes_that_need_attention(
    sweeps: list[float],
) -> None:
    endpoint = status_http.StatusEndpoint(cast(Fleet, object()), max_age_s=60)
    views = [NodeView(f"n{i}", f"10.0.0.{i}:9401") for i in range(1, 200)]
    views[5] = NodeView("n6", "10.0.0.6:9401", error="connection refused")
    endpoint.observe(views, 3600.0, time.monotonic())
    doc = get(endpoint, "?nodes=0")
    assert "nodes" not in doc and [n["name"] for n in doc["attention"]] == ["n6"]
    assert doc["totals"]["node_health"] == {"ok": 198, "unhealthy": 0, "unreachable": 1}
    assert len(get(endpoint)["nodes"]) == 199


def test_while_a_new_sweep_renders_the_previous_one_answers(
    sweeps: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request does not wait for the render of the sweep that just landed (seconds at
    5,000 nodes): the one before answers, then the new one once it is ready."""
    import threading

    release = threading.Event()
    document = status_http.status_document

    def slow(status: Any, *args: Any, **kw: Any) -> dict[str, Any]:
        if status.nodes and status.nodes[0].name == "new":
            assert release.wait(10)
        return document(status, *args, **kw)

    monkeypatch.setattr(status_http, "status_document", slow)
    endpoint = status_http.StatusEndpoint(cast(Fleet, object()), max_age_s=60)
    request = cast(Request, type("R", (), {"path": "/fleet/status?nodes=1"}))

    async def main() -> tuple[list[str], list[str]]:
        endpoint.observe((NodeView("old", "10.0.0.1:9401"),), 3600.0, time.monotonic())
        await endpoint(request)  # the old sweep, rendered
        endpoint.observe((NodeView("new", "10.0.0.2:9401"),), 3600.0, time.monotonic())
        during = await asyncio.wait_for(endpoint(request), 5)
        release.set()
        await asyncio.sleep(0.2)
        after = await endpoint(request)
        return (
            [n["name"] for n in json.loads(during.body)["nodes"]],
            [n["name"] for n in json.loads(after.body)["nodes"]],
        )

    assert asyncio.run(main()) == (["old"], ["new"])


def test_a_too_old_previous_sweep_waits_for_the_new_render_rather_than_sweeping(
    sweeps: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rendered sweep is past --status-max-age and the newest is still rendering: the
    request waits for that render (seconds), not for a sweep of its own (one GetNode per
    agent: at 5,000 nodes, 36 s)."""
    import threading

    release = threading.Event()
    document = status_http.status_document

    def slow(status: Any, *args: Any, **kw: Any) -> dict[str, Any]:
        if status.nodes and status.nodes[0].name == "new":
            assert release.wait(10)
        return document(status, *args, **kw)

    monkeypatch.setattr(status_http, "status_document", slow)
    clock = Clock()
    endpoint = status_http.StatusEndpoint(cast(Fleet, object()), max_age_s=60, clock=clock)
    request = cast(Request, type("R", (), {"path": "/fleet/status?nodes=1"}))

    async def main() -> list[str]:
        endpoint.observe((NodeView("old", "10.0.0.1:9401"),), 3600.0, clock.now)
        await endpoint(request)
        clock.now += 70  # the old sweep is now too old to answer
        endpoint.observe((NodeView("new", "10.0.0.2:9401"),), 3600.0, clock.now - 30)
        asyncio.get_running_loop().call_later(0.2, release.set)
        answer = await asyncio.wait_for(endpoint(request), 5)
        return [n["name"] for n in json.loads(answer.body)["nodes"]]

    assert asyncio.run(main()) == ["new"] and sweeps == []


def _answer(endpoint: status_http.StatusEndpoint, query: str) -> tuple[int, dict[str, Any]]:
    request = cast(Request, type("R", (), {"path": f"/fleet/status{query}&nodes=1"}))
    response = asyncio.run(endpoint(request))
    return response.status, cast(dict[str, Any], json.loads(response.body))


def test_a_label_selector_is_refused_as_fleet_status_refuses_it_when_labels_are_unread() -> None:
    """`fleet status --coordinator URL -l pool=x` answered 0 nodes when the coordinator found
    its agents by --agents (no labels) and during a Kubernetes API outage (labels unknown),
    where `fleet status -l pool=x` against the agents refuses: the same refusals, 400 and 503
    with the reason; a label it read still selects."""
    clock = Clock()
    endpoint = status_http.StatusEndpoint(
        cast(Fleet, object()), max_age_s=60, clock=clock, wall=clock
    )
    views = (NodeView("n1", "10.0.0.1:9401", labels={"pool": "x"}),)
    static = {"n1": Target("10.0.0.1:9401")}
    endpoint.observe(views, 3600.0, clock.now, static)
    status, body = _answer(endpoint, "?selector=pool%3Dx")
    assert status == 400 and "--kubernetes" in body["error"], body
    assert _answer(endpoint, "?selector=name%3Dn1")[0] == 200  # no label: answered

    unread = {"n1": Target("10.0.0.1:9401", "n1", pod="agent-1", labels_known=False)}
    endpoint.observe(views, 3600.0, clock.now, unread)
    status, body = _answer(endpoint, "?selector=pool%3Dx")
    assert status == 503 and "could not be read" in body["error"], body

    read = {"n1": Target("10.0.0.1:9401", "n1", {"pool": "x"}, pod="agent-1")}
    endpoint.observe(views, 3600.0, clock.now, read)
    status, body = _answer(endpoint, "?selector=pool%3Dx")
    assert status == 200 and [n["name"] for n in body["nodes"]] == ["n1"], body


def test_queries_an_anonymous_caller_varies_cost_the_loop_and_memory_little(
    sweeps: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`GET /fleet/status` needs no credential: a caller spelling its query a hundred ways
    leaves one sweep's latest 16 answers in memory, each rendered off the loop (which carries
    the reconcile passes and the Lease), and a selector past 1,024 characters or 32 terms is a
    400 naming the field before any glob is compiled."""
    import threading

    threads: list[str] = []
    document = status_http.status_document

    def counted(*args: Any, **kw: Any) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        return document(*args, **kw)

    monkeypatch.setattr(status_http, "status_document", counted)
    clock = Clock()
    endpoint = status_http.StatusEndpoint(
        cast(Fleet, object()), max_age_s=60, clock=clock, wall=clock
    )
    endpoint.observe((NodeView("n1", "10.0.0.1:9401"),), 3600.0, clock.now)
    for n in range(100):
        status, body = _answer(endpoint, f"?selector=name%3Dn{n}*")
        assert status == 200, body
    assert threading.main_thread().name not in threads and len(threads) == 100
    sweep = endpoint._last  # what the sweep holds is the point
    assert sweep is not None and len(sweep.rendered) == 16

    for selector in ("name%3D" + "a" * 1100, "%2C".join(["name%3Dn*"] * 40)):
        status, body = _answer(endpoint, f"?selector={selector}")
        assert status == 400 and "at most 32 terms in 1024 characters" in body["violations"]
    assert len(threads) == 100 and sweeps == []
