"""The marks that must outlive the agent: one small JSON file in the state dir.

A restart must not clear a failed mark before its hold-down, so the marks (state, reason,
since, action, pods, the last bad signal, the window and the changes of the last hour) are
written when they change, and at most every ``SAVE_EVERY_S`` while an ongoing condition (a lost
GPU, a pending remap) keeps refreshing them. On load, a mark that was still being refreshed
when it was saved counts its hold-down from the save, never earlier. The node's boot id is
saved beside them: an agent that finds another one was started after a reboot.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.durable import replace_file
from agent.health.machine import Mark, State

log = logging.getLogger(__name__)

__all__ = ["SAVE_EVERY_S", "MarkStore", "Target"]

FILE = "health-marks.json"
FORMAT = 1
SAVE_EVERY_S = 5.0


#: the key of a GPU lost before it was ever read (its UUID is not known): by its index alone
_BY_INDEX = "index-"


@dataclass(frozen=True, slots=True)
class Target:
    """A GPU (by UUID: indexes change across reboots) or one of its MIG GPU instances."""

    gpu_uuid: str
    gpu_instance: int | None = None

    @classmethod
    def gpu(cls, uuid: str, index: int) -> Target:
        """A GPU's mark: by UUID, or by index for one lost before it was ever read."""
        return cls(uuid or f"{_BY_INDEX}{index}")

    @property
    def known_uuid(self) -> str:
        """The GPU's UUID, or "" where only its index is known (never a made-up UUID)."""
        return "" if self.gpu_uuid.startswith(_BY_INDEX) else self.gpu_uuid

    def order(self) -> tuple[str, int]:
        """Sorts a GPU before its instances, instances by id."""
        return (self.gpu_uuid, -1 if self.gpu_instance is None else self.gpu_instance)

    def key(self) -> str:
        gi = self.gpu_instance
        return self.gpu_uuid if gi is None else f"{self.gpu_uuid}/{gi}"

    @classmethod
    def parse(cls, key: str) -> Target:
        uuid, sep, gi = key.partition("/")
        return cls(uuid, int(gi) if sep else None)


class MarkStore:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE
        #: the boot id the loaded marks were saved under (None: not known, or nothing loaded)
        self.saved_boot_id: str | None = None

    def load(self) -> dict[Target, Mark]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.error("health marks in %s are unreadable, starting from none: %s", self.path, exc)
            return {}
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            log.error("health marks in %s have an unknown format; starting from none", self.path)
            return {}
        saved_at = float(raw.get("saved_at", 0.0))
        boot_id = raw.get("boot_id")
        self.saved_boot_id = boot_id if isinstance(boot_id, str) and boot_id else None
        out = {}
        for key, item in (raw.get("marks") or {}).items():
            try:
                mark = _mark(item)
            except (KeyError, TypeError, ValueError) as exc:
                log.error("health mark %s in %s is unreadable, dropped: %s", key, self.path, exc)
                continue
            if mark.state is not State.HEALTHY and saved_at - mark.bad_at <= SAVE_EVERY_S:
                mark = replace(mark, bad_at=saved_at)  # still ongoing when saved
            out[Target.parse(key)] = mark
        return out

    def save(self, marks: Mapping[Target, Mark], now: float, boot_id: str | None = None) -> None:
        body = {
            "format": FORMAT,
            "saved_at": now,
            "boot_id": boot_id,
            "marks": {
                t.key(): _raw(m) for t, m in sorted(marks.items(), key=lambda kv: kv[0].order())
            },
        }
        # fsync'd: a power cut must not leave an empty file that forgets a failed GPU
        replace_file(self.path, json.dumps(body, sort_keys=True).encode())


def _raw(mark: Mark) -> dict[str, Any]:
    return {
        "state": mark.state.value,
        "reason": mark.reason,
        "since": mark.since,
        "action": mark.action,
        "pods": list(mark.pods),
        "bad_at": mark.bad_at,
        "recent": list(mark.recent),
        "recent_reason": mark.recent_reason,
        "changes": list(mark.changes),
        "held": mark.held,
    }


def _mark(raw: dict[str, Any]) -> Mark:
    return Mark(
        state=State(raw["state"]),
        reason=str(raw["reason"]),
        since=float(raw["since"]),
        action=str(raw["action"]),
        pods=tuple(str(p) for p in raw["pods"]),
        bad_at=float(raw["bad_at"]),
        recent=tuple(float(t) for t in raw["recent"]),
        recent_reason=str(raw["recent_reason"]),
        changes=tuple(float(t) for t in raw["changes"]),
        held=bool(raw["held"]),
    )
