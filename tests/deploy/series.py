"""Which series the deploy assets query, and which the agent exports (for the name checks)."""

from __future__ import annotations

import re
from functools import cache

from tests.deploy.conftest import REPO

#: gpu_agent_* families the assets use ahead of the module that exports them, with that module.
#: The name test fails once the name shows up in the agent's code, so the entry gets removed.
PENDING: dict[str, str] = {}

_USED = re.compile(r"\b(DCGM_FI_[A-Z0-9_]+|gpu_agent_[a-z0-9_]+)\b")
_LITERAL = re.compile(r"""["'](gpu_agent_[a-z0-9_]+)["']""")
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created", "_info")


def used_series(expr: str) -> set[str]:
    """DCGM_FI_* and gpu_agent_* series names in a PromQL expression (recording-rule names,
    which contain colons, are not series the agent exports and are not matched)."""
    return set(_USED.findall(expr))


@cache
def agent_literals() -> frozenset[str]:
    """Every "gpu_agent_..." string literal in the agent's source."""
    names: set[str] = set()
    for path in (REPO / "agent").rglob("*.py"):
        if "_proto" not in path.parts:
            names.update(_LITERAL.findall(path.read_text(encoding="utf-8")))
    return frozenset(names)


@cache
def default_dcgm_fields() -> frozenset[str]:
    """DCGM field names the agent exports by default (dcgm/default-counters.csv)."""
    from dcgm.counters import load_counters

    counters = load_counters()
    return frozenset(c.field.name for c in counters.values)


@cache
def coordinator_series() -> frozenset[str]:
    """Every family and sample name a fresh coordinator's /metrics shows (its collector builds
    the names from a prefix, so they are not string literals)."""
    from pathlib import Path
    from typing import cast

    from agent.coordinator.control.reconcile import Reconciler
    from agent.coordinator.fleet.channels import Fleet

    reconciler = Reconciler(cast(Fleet, object()), Path("/nonexistent/desired.yaml"))
    reconciler.stats.last_pass = 0.0  # a pass ran: its timestamp is exported too
    names: set[str] = set()
    for family in reconciler.registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return frozenset(names)


def exported(name: str) -> bool:
    """The agent or the coordinator exports ``name`` by default (a DCGM field of the default
    counters, a gpu_agent_* family or sample name the agent's code spells out, or a series of
    the coordinator's /metrics)."""
    if name.startswith("DCGM_FI_"):
        return name in default_dcgm_fields()
    if name.startswith("gpu_agent_coordinator_"):
        return name in coordinator_series()
    literals = agent_literals()
    if name in literals:
        return True
    return any(name.endswith(s) and name.removesuffix(s) in literals for s in _SUFFIXES)


def unknown_series(names: set[str]) -> tuple[list[str], list[str]]:
    """(names neither exported nor pending, pending names that are now exported)."""
    unknown = sorted(n for n in names if not exported(n) and n not in PENDING)
    landed = sorted(n for n in names if n in PENDING and exported(n))
    return unknown, landed
