"""The agent's small HTTP server: routes, status codes, and slow clients that cannot block it."""

from __future__ import annotations

import asyncio

from agent.http import HttpServer, Request, Response


async def _get(port: int, path: str, method: str = "GET") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_routes_status_codes_and_errors() -> None:
    async def ok(_: Request) -> Response:
        return Response(200, b"fine\n")

    async def boom(_: Request) -> Response:
        raise RuntimeError("bug")

    async def main() -> None:
        server = HttpServer({"/ok": ok, "/boom": boom})
        port = await server.start("127.0.0.1", 0)
        try:
            assert await _get(port, "/ok") == (200, b"fine\n")
            assert await _get(port, "/ok?x=1") == (200, b"fine\n")
            assert (await _get(port, "/missing"))[0] == 404
            assert (await _get(port, "/ok", "POST"))[0] == 405
            assert (await _get(port, "/boom"))[0] == 500
        finally:
            await server.stop()

    asyncio.run(main())


def test_a_stalled_client_does_not_block_others() -> None:
    async def ok(_: Request) -> Response:
        return Response(200, b"fine\n")

    async def main() -> None:
        server = HttpServer({"/ok": ok})
        port = await server.start("127.0.0.1", 0)
        try:
            _, stalled = await asyncio.open_connection("127.0.0.1", port)
            stalled.write(b"GET /ok HTTP/1.1\r\n")  # never finishes its headers
            await stalled.drain()
            assert await asyncio.wait_for(_get(port, "/ok"), 2) == (200, b"fine\n")
            stalled.close()
        finally:
            await server.stop()

    asyncio.run(main())
