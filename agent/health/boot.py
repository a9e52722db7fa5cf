"""The node's boot id (``/proc/sys/kernel/random/boot_id``, the host's even in a container):
health marks saved under another one predate a reboot, and a reboot is their action."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["BOOT_ID", "boot_id_reader"]

#: below a /proc root
BOOT_ID = Path("sys/kernel/random/boot_id")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def boot_id_reader(proc_root: Path) -> Callable[[], str | None]:
    """Reads the boot id under ``proc_root``; None (no evidence of a reboot either way) when it
    cannot be read or is not a UUID."""

    def read() -> str | None:
        path = proc_root / BOOT_ID
        try:
            with path.open("rb") as f:
                text = f.read(64).decode("ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("the boot id in %s cannot be read, reboots are not seen: %s", path, exc)
            return None
        if not _UUID.fullmatch(text):
            log.warning("%s holds no boot id (not a UUID); reboots are not seen", path)
            return None
        return text

    return read
