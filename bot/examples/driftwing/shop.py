"""The Driftwing sample's tools, declared in its `helpdesk.yaml` as Python tools: product look-up, order look-up and
refunds. They show what an operator's own Python tools look like (`function_tool`, `ToolContext.asker`).

Orders and products here are the fictional sample store's; a real deployment calls its shop system instead (or
declares that system's MCP server or HTTP endpoints).
Refunds are recorded in Postgres with the order as idempotency key,
so a turn that is run again after a crash never refunds twice.

Orders are only ever the asker's own (`ToolContext.asker`, matched on their verified email): another
customer's order is answered exactly like one that does not exist. A refund waits for a yes from the person
who asked for it, in a later message, within `REFUND_CONFIRMATION`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import Field
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert

from agents.db.models import Refund
from agents.tools import ToolContext, function_tool

REFUND_CONFIRMATION = timedelta(minutes=30)
"""A refund question not answered with a yes within this is asked again: a "yes" much later may be an answer to
something else, and the customer may have changed their mind."""


@dataclass(frozen=True)
class Customer:
    name: str
    email: str
    """What an order belongs to: compared with the asker's verified email (a real shop looks its customer up by
    it, or by an id it linked to the platform's user)."""


@dataclass(frozen=True)
class Order:
    order_id: str
    customer: Customer
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


DEMO_CUSTOMER = Customer("Casey Customer", "casey@example.com")
"""The sample customer the playground's "Customer (Casey)" and the terminal chat write as: owns DW-1006 and
DW-1007, so refunds can be tried; every other sample order is someone else's."""
_ADA, _BEN, _CHLOE, _DEV, _ELI = (
    Customer(name, f"{name.split()[0].lower()}@example.com")
    for name in ("Ada Park", "Ben Ortiz", "Chloe Tan", "Dev Rao", "Eli Novak")
)

ORDERS = {
    o.order_id: o
    for o in (
        Order("DW-1001", _ADA, "Kestrel Mini 2 drone", 34900, "delivered", "2026-10-02"),
        Order("DW-1002", _BEN, "Harrier X4 drone", 129900, "shipped", "2026-11-12"),
        Order("DW-1003", _CHLOE, "Spare battery pack LB-3000", 5900, "processing", "2026-11-19"),
        Order("DW-1004", _DEV, "Osprey Pro 8K drone", 219900, "delivered", "2026-09-21"),
        Order("DW-1005", _ELI, "Propeller guard set PG-20", 2400, "returned", "2026-10-30"),
        Order("DW-1006", DEMO_CUSTOMER, "Kestrel Mini 2 drone", 34900, "delivered", "2026-11-03"),
        Order("DW-1007", DEMO_CUSTOMER, "Swift Racer FPV kit", 44900, "shipped", "2026-11-18"),
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
async def find_product(query: Annotated[str, Field(description="A product code or words of its name")]) -> str:
    """Find catalogue products: price and specifications."""
    words = query.lower().split()
    hits = [
        p
        for p in PRODUCTS.values()
        if p.code.lower() == query.lower() or all(w in f"{p.name} {p.summary}".lower() for w in words)
    ]
    if not hits:
        return f"No product matches {query!r}. Codes: {', '.join(PRODUCTS)}."
    return "\n".join(f"{p.code}: {p.name}, {_money(p.price_cents)}. {p.summary}" for p in hits)


def _asker_order(ctx: ToolContext, order_id: str) -> Order | None:
    """The order, when it belongs to the person asking. None when it does not exist or is someone else's: the two
    are answered alike, so that nobody can probe order numbers."""
    order = ORDERS.get(order_id.strip().upper())
    email = ctx.asker.email if ctx.asker else None
    if order is None or email is None or order.customer.email.casefold() != email.casefold():
        return None
    return order


def _not_found(ctx: ToolContext, order_id: str) -> str:
    unknown = "" if ctx.asker and ctx.asker.email else " (no verified email is known for them, so no order can be)"
    return (
        f"No order {order_id!r} on the account of the person asking{unknown}. Tell them \"I can't find that order "
        'on your account" and ask them to check the number (it looks like DW-1234); say nothing else about it.'
    )


@function_tool
async def lookup_order(ctx: ToolContext, order_id: Annotated[str, Field(description="Like DW-1001")]) -> str:
    """The customer's order: item, price, status, date."""
    order = _asker_order(ctx, order_id)
    if order is None:
        return _not_found(ctx, order_id)
    return (
        f"Order {order.order_id} for {order.customer.name}: {order.item}, {_money(order.price_cents)}, "
        f"placed {order.placed}, status {order.status}."
    )


@dataclass(frozen=True)
class _Question:
    """The refund the customer was asked to confirm: kept in the conversation's context between messages."""

    order_id: str
    asked_in: int | None
    """The message it answered: a yes must come in a later one."""
    asker: str
    """`Author.key` of the person asked: only their yes counts."""
    asked_by: str
    asked_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "order_id": self.order_id,
            "asked_in": self.asked_in,
            "asker": self.asker,
            "asked_by": self.asked_by,
            "asked_at": self.asked_at.isoformat(),
        }

    @classmethod
    def of(cls, raw: object) -> _Question | None:
        if not isinstance(raw, Mapping):
            return None
        try:
            asked_at = datetime.fromisoformat(str(raw["asked_at"]))
            return cls(str(raw["order_id"]), raw.get("asked_in"), str(raw["asker"]), str(raw["asked_by"]), asked_at)
        except (KeyError, ValueError):  # a question from before confirmations were tied to people: ask again
            return None


@function_tool
async def issue_refund(
    ctx: ToolContext,
    order_id: str,
    confirmed: Annotated[bool, Field(description="Only after the customer said yes")] = False,
) -> str:
    """Refund the customer's order in full; without confirmed, gives the question to ask."""
    asked = _Question.of(ctx.state.get("pending_refund"))
    if (
        confirmed
        and asked
        and ctx.asker
        and asked.order_id == order_id.strip().upper()
        and asked.asker != ctx.asker.key
    ):
        # Asked in this very conversation, so naming who asked tells nobody anything new.
        return (
            f"Not refunded: {asked.asked_by} asked for this refund and only they can confirm it; this message is "
            f"from {ctx.asker.label}. Ask {asked.asked_by} to confirm."
        )
    order = _asker_order(ctx, order_id)
    if order is None or ctx.asker is None:
        return _not_found(ctx, order_id) + " Nothing was refunded."
    if order.status not in ("delivered", "shipped"):
        return f"Order {order.order_id} is {order.status}; it cannot be refunded. Offer a human if they insist."
    if ctx.db is None:
        raise RuntimeError("refunds need the database")
    async with ctx.db() as session:
        existing = await session.scalar(select(Refund).where(Refund.order_id == order.order_id))
    if existing is not None:
        return f"Order {order.order_id} was already refunded ({_money(existing.amount_cents)}, refund R-{existing.id})."
    now = datetime.now(UTC)
    # The customer must have seen the question in an earlier message (a model cannot confirm on their behalf by
    # calling twice in one turn), be the one who was asked, and say yes while the question stands.
    standing = (
        asked
        if asked is not None
        and asked.order_id == order.order_id
        and asked.asked_in != ctx.inbound_id
        and asked.asker == ctx.asker.key
        else None
    )
    expired = standing is not None and now - standing.asked_at > REFUND_CONFIRMATION
    if not confirmed or standing is None or expired:
        question = _Question(order.order_id, ctx.inbound_id, ctx.asker.key, ctx.asker.label, now)
        ctx.state["pending_refund"] = question.to_json()
        minutes = int(REFUND_CONFIRMATION.total_seconds() // 60)
        lead = (
            f"The earlier question expired (a yes counts within {minutes} minutes). " if confirmed and expired else ""
        )
        return lead + (
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
