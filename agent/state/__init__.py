"""The agent's one SQLite store: operations, the MIG journal, the prewarm cache index.

One module per reason to change: schema.py (tables, migrations, durability per table),
database.py (the connection, transactions, a damaged or read-only database), operations.py
and journal.py (a table each), store.py (`StateStore`, all of them on one connection).
Importers use the names re-exported here; the `Operation` record the operations table keeps
is in agent/operation.py, so that clients read it without SQLite.
"""

from agent.state.database import LOST_WITH_DATABASE
from agent.state.schema import MIGRATIONS, TABLE_DURABILITY, Durability
from agent.state.store import StateStore

__all__ = [
    "LOST_WITH_DATABASE",
    "MIGRATIONS",
    "TABLE_DURABILITY",
    "Durability",
    "StateStore",
]
