"""The node's boot id (agent/health/boot.py): read under a /proc root, refused unless it is a
UUID, so a file that is missing, huge or not a boot id is no evidence of a reboot."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.health.boot import BOOT_ID, boot_id_reader

UUID = "414d74fb-37f7-4c22-abb8-56c81ae8fd7a"


@pytest.mark.parametrize(
    ("content", "read"),
    [
        (f"{UUID}\n".encode(), UUID),
        (None, None),  # no file
        (b"not-a-boot-id\n", None),
        (UUID.encode() + b"0" * 10_000_000, None),  # only 64 bytes are read, then refused
        (b"\xff\xfe" + UUID.encode(), None),
    ],
)
def test_the_boot_id_is_a_uuid_or_none(
    tmp_path: Path, content: bytes | None, read: str | None
) -> None:
    if content is not None:
        (tmp_path / BOOT_ID).parent.mkdir(parents=True)
        (tmp_path / BOOT_ID).write_bytes(content)
    assert boot_id_reader(tmp_path)() == read


def test_the_simulated_node_has_a_boot_id_that_a_reboot_changes_and_a_driver_reload_keeps(
    tmp_path: Path,
) -> None:
    from agent.gpu.sim import SimControl, open_simulator

    open_simulator(tmp_path, "dgx-h100")
    control = SimControl(tmp_path)
    read = boot_id_reader(control.proc_root)
    first = read()
    assert first is not None
    control.driver_absent()
    control.driver_present()
    assert read() == first
    control.reboot()
    assert read() not in (None, first)
