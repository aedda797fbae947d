"""The Tallyhouse MCP server (`fakes.mcp_server`) as a process of its own, for tests and benchmarks: over Streamable
HTTP on a port (started, waited for, killed and started again), or over stdio as the bot starts it (the pid file
says which process to kill)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from harness.bot import ROOT


async def start_http(port: int) -> asyncio.subprocess.Process:
    """The server on 127.0.0.1:`port` (`/mcp`), once it accepts connections."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fakes.mcp_server", "--transport", "http", "--port", str(port), cwd=ROOT,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await listening(process, port, what="the MCP server")
    return process


async def listening(process: asyncio.subprocess.Process, port: int, *, what: str, within_s: float = 30) -> None:
    """Once `process` accepts connections on 127.0.0.1:`port`; killed and RuntimeError if it exits or never does."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if process.returncode is not None or time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                raise RuntimeError(f"{what} did not listen on {port}") from None
            await asyncio.sleep(0.05)
        else:
            writer.close()
            await writer.wait_closed()
            return


async def stop(process: asyncio.subprocess.Process) -> None:
    """kill -9, as a crash would."""
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await process.wait()


@asynccontextmanager
async def http_server(port: int) -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """The server on `port`; the list holds each process started on it (a test restarts it by appending), all
    killed at the end."""
    started = [await start_http(port)]
    try:
        yield started
    finally:
        for process in started:
            await stop(process)


def stdio_command(pid_file: Path) -> list[str]:
    """The declaration's `command` and `args` for the server over stdio, writing its pid to `pid_file`."""
    return [sys.executable, "-m", "fakes.mcp_server", "--transport", "stdio", "--pid-file", str(pid_file)]
