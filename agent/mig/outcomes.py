"""What a MIG apply, restore or recovery did, GPU by GPU: the records MigService answers with
and the API and the CLI read (agent/wire/mig.py)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ApplyResult", "GpuOutcome", "RecoveryOutcome"]


@dataclass(frozen=True, slots=True)
class GpuOutcome:
    gpu: int
    uuid: str
    status: str  # "unchanged" | "applied" | "pending" | "lost" (selected, not answering)
    kept: int = 0
    destroyed: int = 0
    created: int = 0
    message: str = ""
    #: pending until this (passthrough) VM reboots, not until a GPU reset
    reboot: bool = False


@dataclass(frozen=True, slots=True)
class RecoveryOutcome:
    """What ``recover`` did to one GPU an interrupted apply had started to change."""

    gpu: int
    uuid: str
    action: str  # "rolled-back" | "untouched" | "completed" | "failed"
    detail: str


@dataclass(frozen=True, slots=True)
class ApplyResult:
    config: str
    gpus: tuple[GpuOutcome, ...]
    mutations: int
    recovered: tuple[RecoveryOutcome, ...] = ()
    #: what was done so the device plugin advertises the new layout, or why not ("": no GPU
    #: changed, or no device plugin serves the node)
    device_plugin: str = ""
    #: when the config selected no GPU (nothing applied): why its assert fails, one line each
    assert_mismatches: tuple[str, ...] = ()

    @property
    def pending(self) -> tuple[GpuOutcome, ...]:
        return tuple(g for g in self.gpus if g.status == "pending")

    @property
    def lost(self) -> tuple[GpuOutcome, ...]:
        """GPUs the config selects (or may) that do not answer: not applied."""
        return tuple(g for g in self.gpus if g.status == "lost")
