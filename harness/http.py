"""A throwaway HTTP server for a test: an aiohttp app on a free port, cleaned up on exit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def serving(
    app: web.Application, host: str = "127.0.0.1", *, shutdown_timeout: float = 60.0
) -> AsyncIterator[int]:
    """`app` served on `host` at a port of its own (yielded)."""
    server = web.AppRunner(app, shutdown_timeout=shutdown_timeout)
    await server.setup()
    await web.TCPSite(server, host, 0).start()
    try:
        yield server.addresses[0][1]
    finally:
        await server.cleanup()
