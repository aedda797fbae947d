"""Tallyhouse's billing system as an MCP server: the second example's tools (subscriptions, invoices, cancellation),
written with the official MCP SDK's server API, as an operator's own server would be.

The example's helpdesk.yaml runs it over stdio; it also serves Streamable HTTP:

    python -m bot.examples.tallyhouse.server --transport stdio
    python -m bot.examples.tallyhouse.server --transport http --port 8931    # http://127.0.0.1:8931/mcp

Like any operator's system, it trusts only the asker the bot vouches for in the request's `_meta` (`ASKER_META`),
never a name or an email in the model's arguments: `get_subscription` takes none, and `get_invoice` answers only for
an invoice of the asker's own account, with the same words whether the invoice belongs to someone else or does not
exist (so the answer does not confirm that it exists).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

ASKER_META = "io.helpdesk/asker"
"""The `_meta` key the bot puts the asker's verified claims under (`agents.identity.asker_claims`)."""


@dataclass(frozen=True)
class Account:
    id: str
    company: str
    email: str
    """The owner's email: how the bot's asker is matched to an account."""
    plan: str
    price: str


@dataclass(frozen=True)
class Invoice:
    id: str
    account: str
    amount: str
    status: str


ACCOUNTS = (
    Account("TH-100", "Casey's Coffee Cart", "casey@example.com", "Growth", "$49/month"),
    Account("TH-200", "Ada's Analytics", "ada@example.com", "Starter", "$19/month"),
    Account("TH-300", "Grace Hopper Bakery", "grace@example.com", "Pro", "$99/month"),
)
INVOICES = (
    Invoice("INV-1001", "TH-100", "$49.00", "paid"),
    Invoice("INV-1002", "TH-100", "$49.00", "due 2026-07-01"),
    Invoice("INV-2001", "TH-200", "$19.00", "paid"),
    Invoice("INV-3001", "TH-300", "$99.00", "paid"),
)
NO_SUCH_INVOICE = "No such invoice on your account."


def build_server() -> MCPServer:
    """A fresh Tallyhouse server, with its own record of cancellations. (The SDK's
    server calls `logging.basicConfig` when built: nothing changes for a host that configured its logging first.)"""
    server = MCPServer(
        "tallyhouse", log_level="WARNING", instructions="Tallyhouse billing: subscriptions and invoices of the asker."
    )
    cancelled: dict[str, str] = {}

    @server.tool()
    async def get_subscription(ctx: Context) -> str:
        """The plan of the asker's Tallyhouse account, and whether it is being cancelled."""
        account = _account(ctx)
        note = f"; cancellation requested ({cancelled[account.id]})" if account.id in cancelled else ""
        return f"{account.company} ({account.id}) is on the {account.plan} plan at {account.price}{note}."

    @server.tool()
    async def get_invoice(
        ctx: Context,
        invoice_id: Annotated[str, Field(description="The invoice number, like INV-1001", pattern=r"^INV-\d{4}$")],
    ) -> str:
        """One invoice of the asker's account: amount and status."""
        account = _account(ctx)
        invoice = next((i for i in INVOICES if i.id == invoice_id and i.account == account.id), None)
        if invoice is None:
            return NO_SUCH_INVOICE
        return f"{invoice.id}: {invoice.amount}, {invoice.status}."

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, read_only_hint=False))
    async def cancel_subscription(ctx: Context, reason: str = "") -> str:
        """Cancel the asker's subscription at the end of the current period."""
        account = _account(ctx)
        cancelled[account.id] = reason or "no reason given"
        return f"The {account.plan} plan of {account.company} ends at the end of the current period."

    return server


def _account(ctx: Context) -> Account:
    """The asker's account, from the claims the bot vouched for; a tool error (the model reads it) otherwise."""
    meta: Mapping[str, Any] = ctx.request_context.meta or {}
    asker = meta.get(ASKER_META)
    email = asker.get("email") if isinstance(asker, Mapping) else None
    if not isinstance(email, str) or not email:
        raise ToolError("the bot did not say who is asking (no verified email), so no account can be looked up")
    account = next((a for a in ACCOUNTS if a.email.lower() == email.lower()), None)
    if account is None:
        raise ToolError(f"no Tallyhouse account belongs to {email}")
    return account


def arguments(prog: str = "python -m bot.examples.tallyhouse.server") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Tallyhouse's billing system as an MCP server.")
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8931)
    return parser


def serve(server: MCPServer, args: argparse.Namespace) -> None:
    """Over stdio (the bot's child process), or Streamable HTTP at http://HOST:PORT/mcp."""
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.port)


def main(argv: Sequence[str] | None = None) -> None:
    serve(build_server(), arguments().parse_args(argv))


if __name__ == "__main__":
    main()
