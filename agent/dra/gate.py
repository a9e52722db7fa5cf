"""What the allocation mode lets the agent change: the one place that says no.

``dra-dynamic-mig``: NVIDIA's DRA driver creates a MIG instance when a claim is prepared and
destroys, when its kubelet plugin starts, every instance it did not create; a MIG change by the
agent would reconfigure under it (its MIG guide: do not run mig-parted beside it). ``unknown``:
the API server has not said yet which world this is, so nothing that depends on it changes.
``device-plugin``, ``dra`` and ``none`` change MIG as before (``dra`` then republishes:
agent.dra.republish).
"""

from __future__ import annotations

from agent.dra.mode import Allocation, AllocationMode
from agent.errors import ModeRefused

__all__ = ["mig_change_refusal", "refuse_mig_change"]


def mig_change_refusal(allocation: Allocation) -> str | None:
    """Why a MIG change (create or destroy instances, switch MIG mode) is refused on a node
    of this allocation mode; None when it is allowed. Said after "<what> refused: "."""
    if allocation.mode is AllocationMode.DRA_DYNAMIC_MIG:
        return (
            f"this node's allocation mode is {allocation.describe()}. The DRA driver "
            f"{allocation.driver} creates and destroys MIG instances itself as claims are "
            "prepared; the agent changes no MIG state here. Request MIG devices through "
            "ResourceClaims instead; nothing was changed"
        )
    if allocation.mode is AllocationMode.UNKNOWN:
        return (
            f"this node's allocation mode is {allocation.describe()}. A MIG change waits until "
            "the agent knows whether a DRA driver manages MIG here; retry once the API server "
            "answers, or set dra.mode in the agent config; nothing was changed"
        )
    return None


def refuse_mig_change(allocation: Allocation, what: str) -> None:
    """Raise ModeRefused when ``what`` (e.g. "mig apply") would create or destroy MIG
    instances or switch MIG mode on a node whose mode forbids it."""
    why = mig_change_refusal(allocation)
    if why is not None:
        raise ModeRefused(f"{what} refused: {why}")
