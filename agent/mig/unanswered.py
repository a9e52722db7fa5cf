"""The GPUs a MIG read or change cannot reach: lost ones, and unread ones (not lost, but a read
of their identity fails: RESET_REQUIRED, UNKNOWN, TIMEOUT, often a GPU that needs a reset).

One such GPU must not stop MIG on the others: both are left out of the layouts, and what the
config selects of them (or may) is never "applied": it is named with why, the unread one with
its failing call (agent.gpu.nvml ``GpuScan``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from agent.errors import AgentError, DeviceLost, DriverUnavailable, NotFound
from agent.gpu.nvml import GpuDriver, GpuScan, NvmlError
from agent.gpu.types import GpuInfo, GpuLayout, LostGpu, UnreadGpu
from agent.mig.node_plan import gone_said, lost_selected
from agent.mig.outcomes import GpuOutcome
from agent.mig.spec import MigConfigEntry

__all__ = ["Unanswered", "answering", "read_node", "selected_outcomes"]


@dataclass(frozen=True, slots=True)
class Unanswered:
    """What is known of each GPU that does not answer (``gpus``, lost and unread alike: only
    its index when it never answered), and why each unread one is (index -> call and error)."""

    gpus: tuple[GpuInfo, ...] = ()
    unread: dict[int, str] = field(default_factory=dict)
    #: the scan it was read from (the lost ones' details)
    scan: GpuScan = field(default_factory=lambda: GpuScan(()))

    @classmethod
    def of(cls, scan: GpuScan) -> Unanswered:
        return cls(
            tuple([g.info for g in scan.lost] + [g.info for g in scan.unread]),
            {g.index: g.detail for g in scan.unread},
            scan,
        )


def answering(driver: GpuDriver, uuid: str, index: int = -1) -> tuple[GpuInfo | None, str]:
    """The GPU now, or None and why it does not answer: lost, or unread (its identity or MIG
    mode read fails, naming the call). NVML gives no UUID for a GPU that did not answer since
    this process started: the one at ``index`` (journalled) is named then. The driver gone
    raises: no GPU answers (MIG recovery waits for it to attach again)."""
    try:
        return driver.gpu(uuid), ""
    except NotFound:
        scan = driver.scan()
        for g in (*scan.lost, *scan.unread):
            if g.index == index and g.last_known is None:
                said = "is lost" if isinstance(g, LostGpu) else "cannot be read"
                return None, f"GPU {index} {said}: {g.detail}"
        return None, ""
    except (DeviceLost, NvmlError) as exc:
        return None, str(exc)


def read_node(driver: GpuDriver) -> tuple[tuple[GpuLayout, ...], Unanswered]:
    """The layout of each GPU that can be read, and the GPUs that cannot: lost or unread at the
    scan, or whose layout read fails (its process list: what runs on it is unknown, so it can
    be neither planned nor changed). One such GPU leaves MIG on the others as it is."""
    scan = driver.scan()
    layouts: list[GpuLayout] = []
    failed: list[UnreadGpu] = []
    for gpu in scan.gpus:
        try:
            layouts.append(driver.layout(gpu.uuid))
        except DriverUnavailable:
            raise  # the driver went away: no GPU answers
        except AgentError as exc:
            failed.append(UnreadGpu(gpu.index, gpu, str(exc)))
    return tuple(layouts), Unanswered.of(replace(scan, unread=(*scan.unread, *failed)))


def selected_outcomes(
    entries: Sequence[MigConfigEntry], gone: Unanswered
) -> tuple[GpuOutcome, ...]:
    """The lost and unread GPUs the entries select, or may (only an index known): not applied,
    and said so with why; the others are applied all the same."""
    chosen = set(lost_selected(entries, gone.gpus))  # the rule assert uses
    scan, unread = gone.scan, gone.unread
    out = [
        GpuOutcome(
            g.index, g.uuid, "lost", message=f"GPU {g.index} is lost ({g.detail}): not applied"
        )
        for g in scan.lost
        if g.index in chosen
    ]
    out += [
        GpuOutcome(g.index, g.uuid, "unread", message=f"{gone_said(g.index, unread)}: not applied")
        for g in scan.unread
        if g.index in chosen
    ]
    return tuple(sorted(out, key=lambda o: o.gpu))
