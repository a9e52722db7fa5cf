"""Exact MIG state of one GPU: what a snapshot records and what a restore or an apply reaches.

Like mig-parted's checkpoint (reference/mig.md §3.2) it is keyed by GPU UUID and records each GI's
profile id and placement and each CI's width, placement and profile id, never NVML's instance ids:
those are reassigned when an instance is recreated, so a restored layout has new ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agent.gpu.types import GpuInstance, GpuLayout, Placement


@dataclass(frozen=True, slots=True, order=True)
class CiState:
    """A compute instance: ``slices`` wide; ``start``/``profile_id`` None = the driver's choice."""

    slices: int
    start: int | None = None
    profile_id: int | None = None

    def satisfied_by(self, actual: CiState) -> bool:
        return (
            self.slices == actual.slices
            and self.start in (None, actual.start)
            and self.profile_id in (None, actual.profile_id)
        )


@dataclass(frozen=True, slots=True)
class GiState:
    profile_id: int
    profile_name: str
    placement: Placement
    cis: tuple[CiState, ...]

    @property
    def label(self) -> str:
        """``3g.20gb@4:4``: profile at start:size, as people and the plan output read it."""
        return f"{self.profile_name}@{self.placement}"

    def satisfied_by(self, actual: GiState) -> bool:
        """Same profile and placement, and each wanted CI matched by its own actual CI."""
        if (self.profile_id, self.placement) != (actual.profile_id, actual.placement):
            return False
        if len(self.cis) != len(actual.cis):
            return False
        left = list(actual.cis)
        # Exact CIs first, so a wildcard never takes the one an exact CI needs.
        for want in sorted(self.cis, key=lambda c: (c.start is None, c.profile_id is None)):
            match = next((a for a in left if want.satisfied_by(a)), None)
            if match is None:
                return False
            left.remove(match)
        return True


@dataclass(frozen=True, slots=True)
class GpuMigState:
    """One GPU: MIG mode (current, not pending) and its instances, sorted by placement."""

    uuid: str
    mig_enabled: bool
    instances: tuple[GiState, ...] = ()

    def satisfied_by(self, actual: GpuMigState) -> bool:
        if self.mig_enabled != actual.mig_enabled or len(self.instances) != len(actual.instances):
            return False
        by_placement = {gi.placement: gi for gi in actual.instances}
        return all(
            gi.placement in by_placement and gi.satisfied_by(by_placement[gi.placement])
            for gi in self.instances
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "mig_enabled": self.mig_enabled,
            "instances": [
                {
                    "profile_id": gi.profile_id,
                    "profile_name": gi.profile_name,
                    "placement": [gi.placement.start, gi.placement.size],
                    "cis": [[c.slices, c.start, c.profile_id] for c in gi.cis],
                }
                for gi in self.instances
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuMigState:
        return cls(
            uuid=data["uuid"],
            mig_enabled=bool(data["mig_enabled"]),
            instances=_sorted(
                GiState(
                    profile_id=int(gi["profile_id"]),
                    profile_name=str(gi["profile_name"]),
                    placement=Placement(*gi["placement"]),
                    cis=tuple(CiState(*c) for c in gi["cis"]),
                )
                for gi in data["instances"]
            ),
        )


def gi_state(gi: GpuInstance) -> GiState:
    return GiState(
        gi.profile_id,
        gi.profile_name,
        gi.placement,
        tuple(
            sorted(
                CiState(c.placement.size, c.placement.start, c.profile_id)
                for c in gi.compute_instances
            )
        ),
    )


def fetch(layout: GpuLayout) -> GpuMigState:
    """The exact state of a GPU as read (mig-parted's ``Fetch``)."""
    mode = layout.gpu.mig_mode
    enabled = mode is not None and mode.current
    return GpuMigState(layout.gpu.uuid, enabled, _sorted(gi_state(gi) for gi in layout.instances))


def _sorted(instances: Iterable[GiState]) -> tuple[GiState, ...]:
    return tuple(sorted(instances, key=lambda gi: gi.placement))
