"""The drone store's tools: product look-up, order look-up and refunds.

Orders and products here are the fictional sample store's; a real deployment replaces `ORDERS` and
`PRODUCTS` with calls to its shop system. Refunds are recorded in Postgres with the order as idempotency key,
so a turn that is run again after a crash never refunds twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert

from agents.tools import Tool, ToolContext, function_tool
from db.models import Refund


@dataclass(frozen=True)
class Order:
    order_id: str
    customer: str
    item: str
    price_cents: int
    status: str
    placed: str


@dataclass(frozen=True)
class Product:
    code: str
    name: str
    price_cents: int
    summary: str


ORDERS = {
    o.order_id: o
    for o in (
        Order("DW-1001", "Ada Park", "Kestrel Mini 2 drone", 34900, "delivered", "2026-10-02"),
        Order("DW-1002", "Ben Ortiz", "Harrier X4 drone", 129900, "shipped", "2026-11-12"),
        Order("DW-1003", "Chloe Tan", "Spare battery pack LB-3000", 5900, "processing", "2026-11-19"),
        Order("DW-1004", "Dev Rao", "Osprey Pro 8K drone", 219900, "delivered", "2026-09-21"),
        Order("DW-1005", "Eli Novak", "Propeller guard set PG-20", 2400, "returned", "2026-10-30"),
    )
}

PRODUCTS = {
    p.code: p
    for p in (
        Product("KM-2", "Kestrel Mini 2", 34900, "249 g beginner drone, 4K/30 camera, 31 min flight, 10 km range."),
        Product("HX-4", "Harrier X4", 129900, "Mid-range photo drone, 1-inch sensor, 45 min flight, obstacle sensing."),
        Product("OP-8", "Osprey Pro 8K", 219900, "Pro cinema drone, 8K camera, 3-axis gimbal, 42 min flight."),
        Product("SW-R", "Swift Racer FPV", 44900, "FPV racing kit with goggles, 140 km/h, 8 min flight."),
        Product("LB-3000", "Spare battery LB-3000", 5900, "3000 mAh intelligent battery for Kestrel Mini 2."),
        Product("PG-20", "Propeller guard set PG-20", 2400, "Snap-on guards for Kestrel and Harrier drones."),
    )
}


def _money(cents: int) -> str:
    return f"${cents / 100:,.2f}"


@function_tool
async def find_product(query: Annotated[str, Field(description="A product code or words from its name")]) -> str:
    """Look up products in the catalogue by code or name; returns price and key specifications."""
    words = query.lower().split()
    hits = [
        p
        for p in PRODUCTS.values()
        if p.code.lower() == query.lower() or all(w in f"{p.name} {p.summary}".lower() for w in words)
    ]
    if not hits:
        return f"No product matches {query!r}. Codes: {', '.join(PRODUCTS)}."
    return "\n".join(f"{p.code}: {p.name}, {_money(p.price_cents)}. {p.summary}" for p in hits)


@function_tool
async def lookup_order(order_id: Annotated[str, Field(description="The order number, like DW-1001")]) -> str:
    """Look up an order's item, price, status and date."""
    order = ORDERS.get(order_id.strip().upper())
    if order is None:
        return f"No order {order_id!r} found. Ask the customer to check the number (it looks like DW-1234)."
    return (
        f"Order {order.order_id} for {order.customer}: {order.item}, {_money(order.price_cents)}, "
        f"placed {order.placed}, status {order.status}."
    )


@function_tool
async def issue_refund(
    ctx: ToolContext,
    order_id: Annotated[str, Field(description="The order to refund in full")],
    confirmed: Annotated[
        bool, Field(description="True only after the customer explicitly said yes to this exact refund")
    ] = False,
) -> str:
    """Refund an order in full. First call without `confirmed` to get the confirmation question for the customer;
    call again with confirmed=true only after the customer has said yes in a later message."""
    order = ORDERS.get(order_id.strip().upper())
    if order is None:
        return f"No order {order_id!r} found; nothing refunded."
    if order.status not in ("delivered", "shipped"):
        return f"Order {order.order_id} is {order.status}; it cannot be refunded. Offer a human if they insist."
    if ctx.db is None:
        raise RuntimeError("refunds need the database")
    async with ctx.db() as session:
        existing = await session.scalar(select(Refund).where(Refund.order_id == order.order_id))
    if existing is not None:
        return f"Order {order.order_id} was already refunded ({_money(existing.amount_cents)}, refund R-{existing.id})."
    pending = ctx.state.get("pending_refund")
    # The customer must have seen the question in an earlier message: a model cannot confirm on their behalf
    # by calling twice in one turn.
    asked_before = (
        isinstance(pending, dict)
        and pending.get("order_id") == order.order_id
        and pending.get("asked_in") != ctx.inbound_id
    )
    if not confirmed or not asked_before:
        ctx.state["pending_refund"] = {"order_id": order.order_id, "asked_in": ctx.inbound_id}
        return (
            f"Not refunded yet. Ask the customer: 'Shall I refund {_money(order.price_cents)} for order "
            f"{order.order_id} ({order.item}) to the original payment method?' and call again with "
            "confirmed=true once they say yes."
        )
    async with ctx.db() as session, session.begin():
        await session.execute(
            insert(Refund)
            .values(order_id=order.order_id, amount_cents=order.price_cents, conversation_id=ctx.conversation_id)
            .on_conflict_do_nothing(index_elements=["order_id"])
        )
        refund = await session.scalar(select(Refund).where(Refund.order_id == order.order_id))
    ctx.state.pop("pending_refund", None)
    assert refund is not None
    return (
        f"Refunded {_money(refund.amount_cents)} for order {order.order_id} (refund R-{refund.id}); "
        "it reaches the customer's account in 3-5 business days."
    )


SALES_TOOLS: tuple[Tool, ...] = (find_product,)
SUPPORT_TOOLS: tuple[Tool, ...] = (lookup_order, issue_refund)
