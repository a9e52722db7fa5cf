"""The API stand-in answers what the real API server answers to a request's form, so a test
cannot pass on a request a cluster would refuse or on an event it would not send: BOOKMARK
events only on a watch that asked for them (``allowWatchBookmarks``)."""

from __future__ import annotations

import json

import pytest

from agent.kube import InClusterKubeClient
from tests.kube.fake_edge import EdgeKubeApi
from tests.kube.fixtures import NODE


def _watched(kube: InClusterKubeClient, query: dict[str, str]) -> list[str]:
    """The types of the events a one-second node watch gets."""
    response = kube.stream("/api/v1/nodes", {"watch": "1", "timeoutSeconds": "1", **query}, 10)
    try:
        return [json.loads(line)["type"] for line in response.read().splitlines()]
    finally:
        response.close()


@pytest.mark.parametrize(
    ("asked", "types"),
    [
        (None, ["MODIFIED"]),
        ("false", ["MODIFIED"]),
        ("0", ["MODIFIED"]),
        ("true", ["BOOKMARK", "MODIFIED"]),
        ("1", ["BOOKMARK", "MODIFIED"]),
    ],
)
def test_bookmarks_are_sent_only_to_a_watch_that_asked_for_them(
    kube: InClusterKubeClient,
    edge_api: tuple[EdgeKubeApi, str],
    asked: str | None,
    types: list[str],
) -> None:
    api, _ = edge_api
    since = str(api.version)
    api.bookmark("nodes")
    api.set_labels(NODE, {"pool": "a"})
    query = {"resourceVersion": since} | ({} if asked is None else {"allowWatchBookmarks": asked})
    assert _watched(kube, query) == types
