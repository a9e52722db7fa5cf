"""The XID classification the health marks use: data in ``xids.tsv`` (its header says where
every row comes from), read once. Pure: no NVML, no I/O beyond the package's own file."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum

from agent.tables import packaged_rows

__all__ = ["XidClass", "XidRule", "classify", "table"]


class XidClass(Enum):
    """What an XID says about the GPU (NVIDIA's resolution bucket, grouped)."""

    #: failed until the GPU is reset (RESET_GPU, the XID 48 and NVLink workflows)
    RESET = "reset"
    #: failed until the node reboots (RESTART_BM, RESTART_VM, CHECK_MECHANICALS)
    REBOOT = "reboot"
    #: the application's fault (RESTART_APP): degrades only when repeated in a window
    APPLICATION = "application"
    #: unused or display XIDs NVIDIA says to report: degrades only when repeated in a window
    UNEXPECTED = "unexpected"
    #: informational (IGNORE): no effect on the mark
    IGNORE = "ignore"


#: what clears a mark of each class (HealthMark.action)
ACTIONS = {
    XidClass.RESET: "reset-gpu",
    XidClass.REBOOT: "reboot-node",
    XidClass.APPLICATION: "restart-application",
    XidClass.UNEXPECTED: "none",
    XidClass.IGNORE: "none",
}


@dataclass(frozen=True, slots=True)
class XidRule:
    xid: int
    cls: XidClass
    #: NVIDIA's immediate-action bucket, e.g. RESET_GPU; NAME where the agent classified it
    bucket: str

    @property
    def action(self) -> str:
        return ACTIONS[self.cls]


@functools.cache
def table() -> dict[int, XidRule]:
    rows = packaged_rows("agent.health", "xids.tsv", cells=3)
    return {int(n): XidRule(int(n), XidClass(cls), bucket) for n, cls, bucket in rows}


def classify(xid: int) -> XidRule:
    """The rule for ``xid``; one the table does not list is UNEXPECTED (report it, watch)."""
    return table().get(xid) or XidRule(xid, XidClass.UNEXPECTED, "UNLISTED")
