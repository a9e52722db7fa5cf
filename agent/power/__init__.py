"""Declarative power caps: a spec of limits per GPU, applied, journaled and kept (docs/power.md).

The package's face is its records and pure parts, all a client needs; the service, which
needs the driver, is imported from ``agent.power.service``."""

from agent.power.plan import Change, GpuPower, LostTarget, PowerResult, PowerView
from agent.power.spec import PowerSpec, parse

__all__ = ["Change", "GpuPower", "LostTarget", "PowerResult", "PowerSpec", "PowerView", "parse"]
