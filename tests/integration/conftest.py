"""Fixtures the integration tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.prewarm_fixtures.origin import Origin


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Origin]:
    """A Python HTTP origin serving the test's own ``origin/`` folder."""
    root = tmp_path / "origin"
    root.mkdir()
    with Origin(root) as o:
        yield o
