"""The one server interceptor: authorization, fair share, malformed requests, and domain errors
-> status.

It wraps every handler by arity (unary and streaming, both directions), so no servicer method
can skip a check or leak an exception: a call without a role the method needs gets
PERMISSION_DENIED (logged with the caller's identity), the roles of an admitted call are set
for the servicer (`agent.api.auth.granted`), undecodable request bytes get INVALID_ARGUMENT, a
call past its caller's or its door's share (`agent.api.share`) gets RESOURCE_EXHAUSTED, a stream
past its lifetime ends with UNAVAILABLE, an `AgentError` gets its status from
`agent.wire.errors`, and anything else is a bug: INTERNAL, logged with a traceback under an
incident id that the client also sees.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from agent.api.share import FairShare, Refusal, Slot
from agent.config import ApiSettings
from agent.errors import AgentError
from agent.wire.errors import grpc_code, internal_status, status_of, trailing_metadata

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

    def __init__(
        self, method: str, needed: frozenset[Role], policy: Policy, share: FairShare, stream: bool
    ) -> None:
        self.method = method
        self.needed = needed
        self.policy = policy
        self.share = share
        self.stream = stream
        self.roles = " or ".join(sorted(role.value for role in needed | {Role.ADMIN}))

    async def admit(self, request: Any, context: grpc.aio.ServicerContext) -> Slot:
        """Authorize the call, check its bytes, and give it its place in the caller's share."""
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
        taken = self.share.take(caller, grants, self.stream)
        if isinstance(taken, Refusal):
            # Not logged: a flood of refusals would flood the log; the caller is told.
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, taken.message)
        assert isinstance(taken, Slot)
        return taken

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

    async def serve_unary(
        self, slot: Slot, context: grpc.aio.ServicerContext, run: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Run a handler that answers once, its slot released when it has answered."""
        try:
            return await run()
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await self.fail(context, exc)
        finally:
            slot.release()

    async def serve_stream(
        self, slot: Slot, context: grpc.aio.ServicerContext, run: Callable[[], Awaitable[None]]
    ) -> None:
        """Run a streaming handler within the slot's lifetime; past it the stream ends with
        UNAVAILABLE, which the agent's clients answer by watching again."""
        lifetime = asyncio.timeout(slot.lifetime_s)
        try:
            async with lifetime:
                await run()
        except grpc.aio.AbortError:
            raise
        except TimeoutError as exc:
            if not lifetime.expired():
                await self.fail(context, exc)
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"this stream reached its lifetime of {slot.lifetime_s:g} s "
                "(api.stream_max_s); watch again",
            )
        except Exception as exc:
            await self.fail(context, exc)
        finally:
            slot.release()

    def checked_requests(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async def iterate() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, _Malformed):
                    await self.malformed(context, request)
                yield request

        return iterate()


async def _write_all(
    inner: Callable[..., Any], first: Any, context: grpc.aio.ServicerContext
) -> None:
    """Every response of ``inner`` written with ``context.write``, so that all the stream's
    waiting (the handler's and the client's flow control) happens inside its lifetime."""
    if inspect.isasyncgenfunction(inner):
        async with contextlib.aclosing(inner(first, context)) as responses:
            async for response in responses:
                await context.write(response)
    else:  # a coroutine that writes with context.write
        await inner(first, context)


def _unary_unary(call: _Call, inner: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        slot = await call.admit(request, context)
        return await call.serve_unary(slot, context, lambda: inner(request, context))

    return handler


def _unary_stream(call: _Call, inner: Callable[..., Any]) -> Callable[..., Any]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> None:
        slot = await call.admit(request, context)
        await call.serve_stream(slot, context, lambda: _write_all(inner, request, context))

    return handler


def _stream_unary(call: _Call, inner: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    async def handler(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        slot = await call.admit(None, context)
        checked = call.checked_requests(requests, context)
        return await call.serve_unary(slot, context, lambda: inner(checked, context))

    return handler


def _stream_stream(call: _Call, inner: Callable[..., Any]) -> Callable[..., Any]:
    async def handler(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        slot = await call.admit(None, context)
        checked = call.checked_requests(requests, context)
        await call.serve_stream(slot, context, lambda: _write_all(inner, checked, context))

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
    def __init__(self, policy: Policy, share: FairShare | None = None) -> None:
        self._policy = policy
        self._share = share or FairShare(ApiSettings())
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
        stream = handler.request_streaming or handler.response_streaming
        call = _Call(method, roles_of(method), self._policy, self._share, stream)
        wrapped = _wrap(call, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped
