"""What real NVML keeps in a process's memory, beside the node state: event sets and GPM samples.

The driver (driver.py) holds them per process; the symbols that make and read them are
sym_events.py and sym_gpm.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.gpu.models import GiProfileSpec
from agent.gpu.sim.state import Activity


@dataclass
class EventSet:
    """One ``nvmlEventSet_t``: the GPUs registered on it, and how far it has read."""

    #: gpu index -> (registered event mask, first event sequence number the set may see)
    registered: dict[int, tuple[int, int]] = field(default_factory=dict)
    delivered: int = 0  # sequence number of the last event handed out


@dataclass(frozen=True, slots=True)
class Sample:
    """One ``nvmlGpmSample_t`` after ``nvmlGpmSampleGet``: an entity's counters at an instant."""

    entity: tuple[str, int, int]  # (kind, gpu, serial or boot id): samples compare only within one
    per_instance: bool  # GI or MIG device sample: no GPU-level traffic
    taken: float
    counters: Activity  # copy of the entity's activity at ``taken``
    engines: GiProfileSpec  # engine counts of the sampled entity
    nvlink_links: int

    def total(self, name: str) -> float:
        c = self.counters
        return c.totals.get(name, 0.0) + c.rates.get(name, 0.0) * (self.taken - c.since)
