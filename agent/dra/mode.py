"""The allocation mode of a node: who hands its GPUs to pods, and the evidence for it."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["DENIED", "UNANSWERED", "Allocation", "AllocationMode"]


class AllocationMode(enum.Enum):
    """Who hands this node's GPUs to pods (``gpu-agent status`` shows the value)."""

    #: not detected yet: the API server has not answered; nothing that depends on it changes
    UNKNOWN = "unknown"
    #: the NVIDIA device plugin (extended resources such as nvidia.com/gpu)
    DEVICE_PLUGIN = "device-plugin"
    #: a DRA driver publishing static devices (whole GPUs, MIG instances made beforehand)
    DRA = "dra"
    #: a DRA driver that creates and destroys MIG instances itself as claims are prepared
    DRA_DYNAMIC_MIG = "dra-dynamic-mig"
    #: nothing on the node hands out GPUs (a laptop, a node before its GPU stack is installed)
    NONE = "none"

    @property
    def is_dra(self) -> bool:
        return self in (AllocationMode.DRA, AllocationMode.DRA_DYNAMIC_MIG)


#: `Allocation.unread`
UNANSWERED, DENIED = "unanswered", "denied"


@dataclass(frozen=True, slots=True)
class Allocation:
    mode: AllocationMode
    #: what the mode was read from, or why it is unknown; shown with the mode
    evidence: str
    #: the DRA driver's name when ``mode.is_dra`` (e.g. "gpu.nvidia.com"), else ""
    driver: str = ""
    #: why the facts it is unknown for were not read: UNANSWERED (the API server down, timing
    #: out, 5xx), DENIED (401/403: the agent's RBAC); "" when they were. The doctor's fix
    #: depends on which.
    unread: str = ""

    def describe(self) -> str:
        """``dra-dynamic-mig (ResourceSlices of gpu.nvidia.com ...)``: how a refusal names it."""
        return f"{self.mode.value} ({self.evidence})"
