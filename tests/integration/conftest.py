"""Fixtures the integration tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.kube import InClusterKubeClient
from tests.integration.prewarm_fixtures.origin import Origin
from tests.kube.fake_api import FakeKubeApi


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Origin]:
    """A Python HTTP origin serving the test's own ``origin/`` folder."""
    root = tmp_path / "origin"
    root.mkdir()
    with Origin(root) as o:
        yield o


@pytest.fixture
def in_cluster(
    kube_api: tuple[FakeKubeApi, str],
    kube: InClusterKubeClient,
    monkeypatch: pytest.MonkeyPatch,
) -> FakeKubeApi:
    """The agent's pod client is the test's client of the Kubernetes stand-in."""
    monkeypatch.setattr(InClusterKubeClient, "in_pod", classmethod(lambda cls: kube))
    return kube_api[0]
