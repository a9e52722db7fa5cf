"""Cache labels on the Node, published by a running agent (agent/node.py) to the API stand-in:
an item that turns ready is labelled at once, not on the next pass of the 10 s republish timer
(bench/cold_start.py found a model ready before the driver whose label came after it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.kube import InClusterKubeClient
from agent.prewarm.model import FileRequest, ItemState
from tests.integration.prewarm_fixtures.origin import Origin
from tests.kube.fake_api import FakeKubeApi
from tests.kube.fixtures import NODE
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
