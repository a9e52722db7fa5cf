"""The one client package of the agent's API, used by the CLI and the coordinator.

`AgentClient` (sync, the CLI over the node's socket) and `AsyncAgentClient` (asyncio, the
coordinator over mTLS) share their channel settings and stubs (base.py) and every request,
built once (requests.py): they only send, and raise the agent's domain errors
(agent/wire/errors.py). Both answer in records (converted by agent/wire), so neither the CLI
nor the coordinator reads a message; both take domain values, and the coordinator also a
rollout record's stored requests as kept.
"""

from agent.client.aio import AsyncAgentClient
from agent.client.base import ClientTls
from agent.client.errors import Unreachable
from agent.client.sync import AgentClient

__all__ = [
    "AgentClient",
    "AsyncAgentClient",
    "ClientTls",
    "Unreachable",
]
