"""`StateStore`: the agent's one SQLite store, its connection and every table it holds.

Each table's reads and writes are a class of their own module over `Database` (the
connection): agent/state/operations.py and agent/state/journal.py here; the prewarm cache index
(agent/prewarm/index.py) takes the store and writes its tables through `transaction`.
"""

from __future__ import annotations

from agent.state.journal import Journal
from agent.state.operations import Operations

__all__ = ["StateStore"]


class StateStore(Operations, Journal):
    """The agent's SQLite database: operations and the journal on one connection behind a lock
    (`Database`), so one transaction can span tables."""
