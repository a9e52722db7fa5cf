"""The one server interceptor: authorization, malformed requests, and domain errors -> status.

It wraps every handler by arity (unary and streaming, both directions), so no servicer method
can skip a check or leak an exception: a call without a role the method needs gets
PERMISSION_DENIED (logged with the caller's identity), the roles of an admitted call are set
for the servicer (`agent.api.auth.granted`), undecodable request bytes get INVALID_ARGUMENT, an
`AgentError` gets its status from `agent.api.errors`, and anything else is a bug: INTERNAL,
logged with a traceback under an incident id that the client also sees.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError
from google.rpc import status_pb2

from agent.api.auth import Policy, Role, allows, caller_of, grant, roles_of
from agent.api.errors import grpc_code, internal_status, status_of, trailing_metadata
from agent.errors import AgentError

log = logging.getLogger(__name__)

__all__ = ["ApiInterceptor"]


@dataclass(frozen=True, slots=True)
class _Malformed:
    """Stands in for a request whose bytes did not decode (a deserializer cannot abort)."""

    type_name: str


def _safe(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except (DecodeError, ValueError, TypeError, RecursionError):
            owner = getattr(deserializer, "__self__", None)
            return _Malformed(getattr(owner, "__name__", "request"))

    return decode


async def _abort(context: grpc.aio.ServicerContext, status: status_pb2.Status) -> NoReturn:
    await context.abort(grpc_code(status), status.message, trailing_metadata(status))
    raise AssertionError("unreachable: abort raises")


class _Call:
    """One method's checks; built once per method and reused for every call."""

    def __init__(self, method: str, needed: frozenset[Role], policy: Policy) -> None:
        self.method = method
        self.needed = needed
        self.policy = policy
        self.roles = " or ".join(sorted(role.value for role in needed | {Role.ADMIN}))

    async def admit(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        caller = caller_of(context)
        grants = self.policy.grants(caller)
        if not allows(grants, self.needed):
            log.warning("denied %s to %s", self.method, caller)
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{caller} may not call {self.method}: it needs the role {self.roles} "
                "(the agent's roles settings map client certificate identities to roles)",
            )
        grant(grants)
        if isinstance(request, _Malformed):
            await self.malformed(context, request)

    async def malformed(self, context: grpc.aio.ServicerContext, request: _Malformed) -> NoReturn:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the request bytes are not a valid {request.type_name} message",
        )
        raise AssertionError("unreachable: abort raises")

    async def fail(self, context: grpc.aio.ServicerContext, exc: Exception) -> NoReturn:
        if isinstance(exc, AgentError):
            await _abort(context, status_of(exc))
        incident = uuid.uuid4().hex[:12]
        log.error("bug in %s (incident %s)", self.method, incident, exc_info=exc)
        await _abort(context, internal_status(incident))

    def checked_requests(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async def iterate() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, _Malformed):
                    await self.malformed(context, request)
                yield request

        return iterate()


def _unary_unary(call: _Call, inner: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await call.admit(request, context)
        try:
            return await inner(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await call.fail(context, exc)

    return handler


def _unary_stream(call: _Call, inner: Callable[..., Any]) -> Callable[..., Any]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await call.admit(request, context)
        try:
            if inspect.isasyncgenfunction(inner):
                async for response in inner(request, context):
                    yield response
            else:  # a coroutine that writes with context.write
                await inner(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await call.fail(context, exc)

    return handler


def _stream_unary(call: _Call, inner: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    async def handler(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        await call.admit(None, context)
        try:
            return await inner(call.checked_requests(requests, context), context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await call.fail(context, exc)

    return handler


def _stream_stream(call: _Call, inner: Callable[..., Any]) -> Callable[..., Any]:
    async def handler(
        requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        await call.admit(None, context)
        try:
            checked = call.checked_requests(requests, context)
            if inspect.isasyncgenfunction(inner):
                async for response in inner(checked, context):
                    yield response
            else:
                await inner(checked, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await call.fail(context, exc)

    return handler


def _wrap(call: _Call, h: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    decode = _safe(h.request_deserializer)
    encode = h.response_serializer
    if h.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            _unary_unary(call, h.unary_unary), decode, encode
        )
    if h.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            _unary_stream(call, h.unary_stream), decode, encode
        )
    if h.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            _stream_unary(call, h.stream_unary), decode, encode
        )
    assert h.stream_stream is not None
    return grpc.stream_stream_rpc_method_handler(
        _stream_stream(call, h.stream_stream), decode, encode
    )


class ApiInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        # method -> (the servicer's handler, our wrapper): wrapping once keeps calls cheap.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: grpc answers UNIMPLEMENTED
            return handler
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _wrap(_Call(method, roles_of(method), self._policy), handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped
