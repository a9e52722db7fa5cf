"""Fixtures of the sharing tests."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from agent.sharing.reload import PluginProcess
from agent.sharing.service import SharingService
from agent.sharing.view import Pickup, StatusRecord


@pytest.fixture
def plugin_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin that has loaded the file (started after the write), so what it advertises is
    the config's count: for the tests of that count. No plugin runs here otherwise, and the
    count is then not known
    (`test_what_the_plugin_advertises_is_not_known_until_it_loads_the_file`)."""

    def loaded(
        self: SharingService,
        sha: str | None,
        status: StatusRecord | None,
        processes: Sequence[PluginProcess],
    ) -> Pickup:
        return Pickup("loaded", "nvidia-device-plugin pid 4711 started after the write (test)")

    monkeypatch.setattr(SharingService, "_pickup", loaded)
