"""The partition lock and the configurable GPU reset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.errors import Busy, InvalidSpec
from agent.mig.lock import PartitionLock
from agent.mig.reset import command_reset
from tests.unit.mig.layouts import make_layout

GPU = make_layout("A100-SXM4-40GB").gpu


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    lock = PartitionLock(tmp_path)
    with lock.hold("mig apply all-balanced"):
        assert lock.holder() == f"mig apply all-balanced (pid {os.getpid()})"
        # Another open of the file conflicts even in this process, as another process would.
        with pytest.raises(Busy) as info, PartitionLock(tmp_path).hold("mig apply other"):
            pass
        assert info.value.blockers == (f"mig apply all-balanced (pid {os.getpid()})",)
    assert lock.holder() is None
    with PartitionLock(tmp_path).hold("next"):
        pass
    assert (tmp_path / "partition.lock").stat().st_mode & 0o777 == 0o600


def test_the_lock_is_released_when_the_block_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), PartitionLock(tmp_path).hold("failing"):
        raise RuntimeError("boom")
    with PartitionLock(tmp_path).hold("after"):
        pass


def test_the_reset_command_gets_the_bus_id(tmp_path: Path) -> None:
    out = tmp_path / "reset.txt"
    command_reset(f"sh -c 'echo $0 > {out}' {{bus_id}}")(GPU)
    assert out.read_text().strip() == GPU.pci_bus_id


def test_a_failing_reset_is_busy_with_its_last_line() -> None:
    with pytest.raises(Busy, match=r"exited 3: In use by another client"):
        command_reset("sh -c 'echo In use by another client >&2; exit 3' {bus_id}")(GPU)
    with pytest.raises(Busy, match="no-such-reset-tool"):
        command_reset("no-such-reset-tool -i {bus_id}")(GPU)


def test_a_reset_command_without_the_bus_id_is_refused() -> None:
    with pytest.raises(InvalidSpec) as info:
        command_reset("nvidia-smi -r")
    assert info.value.violations[0].field == "mig.reset_command"
