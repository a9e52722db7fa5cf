"""The one client package of the agent's API, used by the CLI and the coordinator.

`AgentClient` (sync, the CLI over the node's socket) and `AsyncAgentClient` (asyncio, the
coordinator over mTLS) share their channel settings and stubs (base.py), method names and
requests, and one decoder of the agent's errors (errors.py).
"""

from agent.client.aio import AsyncAgentClient
from agent.client.base import ClientTls
from agent.client.errors import Unreachable, domain_error, operation_failure
from agent.client.sync import AgentClient

__all__ = [
    "AgentClient",
    "AsyncAgentClient",
    "ClientTls",
    "Unreachable",
    "domain_error",
    "operation_failure",
]
