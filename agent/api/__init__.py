"""The gRPC control API (``gpuagent.v1``): servicers, the interceptor, the server factory.

Layering: ``api`` calls the services (``mig``, ``sharing``, ``prewarm``, ``telemetry``) and
``gpu`` only through them and the inventory snapshot; the CLI calls ``api`` over the Unix socket.
"""

from agent.api.events import EventBus
from agent.api.inventory import NodeInventory
from agent.api.operations import OperationRunner
from agent.api.server import ApiServices, Ports, create_server, set_serving

__all__ = [
    "ApiServices",
    "EventBus",
    "NodeInventory",
    "OperationRunner",
    "Ports",
    "create_server",
    "set_serving",
]
