"""Cache labels on the Node, published by a running agent (agent/node.py) to the API stand-in:
an item that turns ready is labelled at once, not on the next pass of the 10 s republish timer
(bench/cold_start.py found a model ready before the driver whose label came after it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.kube import InClusterKubeClient
from agent.prewarm.labels import CacheLabels
from agent.prewarm.model import CacheItem, FileRequest, ItemKind, ItemState
from agent.prewarm.naming import LABEL_PREFIX
from tests.integration.prewarm_fixtures.origin import Origin
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE, started_owner
from tests.unit.api.support import InProcessAgent, agent_config, wait_for

LABEL = "gpu-agent.io/cache.model"


def test_an_item_that_turns_ready_is_on_the_node_within_a_second(
    tmp_path: Path,
    kube_api: tuple[FakeKubeApi, str],
    kube: InClusterKubeClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api, _ = kube_api
    api.nodes[NODE]["gpu-agent.io/cache.gone"] = "ready"  # no such item: the first pass drops it
    monkeypatch.setattr(InClusterKubeClient, "in_pod", classmethod(lambda cls: kube))
    (tmp_path / "origin").mkdir()
    root = tmp_path / "agent"
    with (
        Origin(tmp_path / "origin") as origin,
        InProcessAgent(root, agent_config(root, node_name=NODE)) as agent,
    ):
        # The first pass has run (it dropped the stale label): the timer's next is 10 s away.
        wait_for(lambda: "gpu-agent.io/cache.gone" not in api.nodes[NODE], "the first pass", 5)
        origin.add("model.bin", b"weights" * 1000)
        prewarm = agent.node.services.prewarm
        item = prewarm.run(prewarm.submit(FileRequest(origin.url("model.bin"), name="model")).id)
        assert item.state is ItemState.READY, item.error
        wait_for(lambda: api.nodes[NODE].get(LABEL) == "ready", "the label on the Node", 1.5)

        prewarm.delete("model")
        wait_for(lambda: LABEL not in api.nodes[NODE], "the label gone from the Node", 1.5)


def test_a_large_cache_labels_the_node_up_to_its_cap_pinned_first(
    kube_api: tuple[FakeKubeApi, str], kube: InClusterKubeClient
) -> None:
    """A cache of 200 ready files puts `prewarm.max_node_labels` (here 5) labels on the Node,
    pinned items first and then by name, and says how many it withheld; the Node's other labels
    stay, and a cache under the cap labels every ready item."""
    api, _ = kube_api
    api.nodes[NODE]["team"] = "vision"
    items = [_ready(f"m{n:03}") for n in range(200)] + [_ready("z-pinned", pinned=True)]
    items.append(CacheItem("f-x", ItemKind.FILE.value, "a-fetching", "u", ItemState.FETCHING))
    with started_owner(kube, 0.05) as owner:
        labels = CacheLabels(owner, lambda: items, limit=5)
        labels.sync()
        wanted = {f"{LABEL_PREFIX}{n}" for n in ("z-pinned", "m000", "m001", "m002", "m003")}
        wait_for(lambda: set(_cache_labels(api)) == wanted, "five cache labels", 5)
        assert api.nodes[NODE]["team"] == "vision"
        assert _gauge(labels) == {"published": 5, "withheld": 196}

        del items[3:200]  # m003 .. m199 evicted: three ready files and the pinned one
        labels.sync()
        wanted.discard(f"{LABEL_PREFIX}m003")
        wait_for(lambda: set(_cache_labels(api)) == wanted, "every ready item's label", 5)
        assert _gauge(labels) == {"published": 4, "withheld": 0}


def _ready(name: str, pinned: bool = False) -> CacheItem:
    return CacheItem(
        f"f-{name}", ItemKind.FILE.value, name, "u", ItemState.READY, pinned=pinned, size=1
    )


def _cache_labels(api: FakeKubeApi) -> dict[str, str]:
    return {k: v for k, v in api.nodes[NODE].items() if k.startswith(LABEL_PREFIX)}


def _gauge(labels: CacheLabels) -> dict[str, float]:
    [family] = labels.collect()
    return {s.labels["state"]: s.value for s in family.samples}
