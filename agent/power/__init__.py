"""Declarative power caps: a spec of limits per GPU, applied, journaled and kept (docs/power.md)."""

from agent.power.plan import GpuPower
from agent.power.service import Change, PowerService, PowerView
from agent.power.spec import PowerSpec, parse

__all__ = ["Change", "GpuPower", "PowerService", "PowerSpec", "PowerView", "parse"]
