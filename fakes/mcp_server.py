"""The Tallyhouse example's MCP server with tools for tests (echo the `_meta` it got, sleep, change its tool list,
a name providers refuse), runnable as a child process the tests can kill:

    python -m fakes.mcp_server --transport stdio [--pid-file FILE]
    python -m fakes.mcp_server --transport http --port 8931 [--pid-file FILE]
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field

from bot.examples.tallyhouse import server as tallyhouse
from bot.examples.tallyhouse.server import ASKER_META, INVOICES, NO_SUCH_INVOICE, _account

__all__ = ["ASKER_META", "NO_SUCH_INVOICE", "build_server", "main"]


def build_server() -> MCPServer:
    """The example's server, with its own record of cancellations and of whether its beta is open."""
    server = tallyhouse.build_server()

    @server.tool()
    async def echo_identity(ctx: Context) -> str:
        """The request's `_meta` as the server received it (for tests)."""
        return json.dumps(dict(ctx.request_context.meta or {}), sort_keys=True)

    @server.tool()
    async def slow(seconds: Annotated[float, Field(ge=0, le=60)]) -> str:
        """Answer after `seconds` (for timeout and concurrency tests)."""
        await asyncio.sleep(seconds)
        return f"slept {seconds:g} s"

    @server.tool(name="reports.export")
    async def export_report(ctx: Context) -> str:
        """The asker's invoices as CSV. MCP allows the dot in its name; model providers do not, so the bot leaves it
        out (for tests)."""
        account = _account(ctx)
        return "\n".join(f"{i.id},{i.amount},{i.status}" for i in INVOICES if i.account == account.id)

    async def list_invoices(ctx: Context) -> str:
        """Every invoice of the asker's account."""
        account = _account(ctx)
        return "\n".join(f"{i.id}: {i.amount}, {i.status}" for i in INVOICES if i.account == account.id)

    @server.tool()
    async def open_beta(ctx: Context) -> str:
        """Offer the beta tool list_invoices too (for tests: the server's tools change while the bot is connected)."""
        if all(tool.name != "list_invoices" for tool in await server.list_tools()):
            server.add_tool(list_invoices)
            await ctx.notify_tools_changed()
        return "list_invoices is available"

    return server


def main(argv: Sequence[str] | None = None) -> None:
    parser = tallyhouse.arguments("python -m fakes.mcp_server")
    parser.add_argument("--pid-file", help="write the process id there (tests kill the server to see the bot recover)")
    args = parser.parse_args(argv)
    if args.pid_file:
        Path(args.pid_file).write_text(str(os.getpid()))
    tallyhouse.serve(build_server(), args)


if __name__ == "__main__":
    main()
