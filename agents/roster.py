"""The shipped roster: the front desk, sales and support of Driftwing Drones, a fictional online drone store.

This module is the one place agents are declared. It is Python rather than YAML because instructions may be
functions of the shared context and tools are typed functions: both are checked by mypy and by
`Roster.of`, which refuses unknown handoff targets at start-up instead of mid-conversation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Any

from pydantic import Field

from agents.agent import Agent, Roster
from agents.knowledge.store import KnowledgeBase
from agents.knowledge.tool import knowledge_retriever, search_knowledge_tool
from agents.shop import SALES_TOOLS, SUPPORT_TOOLS, order_lookups
from agents.tools import ToolContext, function_tool

STORE = "Driftwing Drones"

_SHARED = (
    "Be warm, brief and concrete; write for Slack (short paragraphs, lists where they help). "
    "Never invent prices, specifications, order details or policies: use your tools, or say you don't know. "
    "If the customer asks for a person, or is upset, call escalate_to_human. "
    "If the request belongs to a colleague, transfer without announcing it; they answer in this same turn."
)


def _greeting(context: Mapping[str, Any]) -> str:
    name = context.get("customer_name")
    return f"The customer's name is {name}; use it." if name else "You don't know the customer's name yet."


@function_tool
async def record_customer_name(ctx: ToolContext, name: Annotated[str, Field(min_length=1, max_length=80)]) -> str:
    """Remember the customer's name for the conversation."""
    ctx.state["customer_name"] = name.strip()
    return f"Recorded the customer's name: {name.strip()}."


def triage_instructions(context: Mapping[str, Any]) -> str:
    return (
        f"You are the front desk of {STORE}, an online drone store. Greet the customer, learn what they need "
        "and route them: buying advice, products, prices and availability go to sales; orders, deliveries, "
        "faults, repairs, returns and refunds go to support. When the customer tells you their name, record it "
        "with record_customer_name. Answer simple questions about the store yourself; do not give product or "
        f"order details yourself. {_greeting(context)} {_SHARED}"
    )


def sales_instructions(context: Mapping[str, Any]) -> str:
    return (
        f"You are Sales at {STORE}. Help the customer choose drones and accessories: ask about their use "
        "(beginner, photography, racing, professional film), budget and flight time, and recommend from the "
        "catalogue with find_product. Quote prices only from tools. For orders, deliveries, faults, returns or "
        "refunds, transfer to support; if the customer is done with buying, or wants something else, transfer "
        f"back to triage. {_greeting(context)} {_SHARED}"
    )


def support_instructions(context: Mapping[str, Any]) -> str:
    return (
        f"You are Support (after-sales) at {STORE}: order status, deliveries, faults, repairs, returns and "
        "refunds. Look orders up with lookup_order before answering about them. For a refund, call "
        "issue_refund without confirmed first, ask the customer the question it gives you, and only after the "
        "customer says yes in a later message call it again with confirmed=true. For buying advice transfer to "
        f"sales; for anything else transfer back to triage. {_greeting(context)} {_SHARED}"
    )


TRIAGE = Agent(
    name="triage",
    title="the front desk",
    description="Greets customers, records their name and routes them to the right colleague.",
    instructions=triage_instructions,
    tools=(record_customer_name,),
    handoffs=("sales", "support"),
)
SALES = Agent(
    name="sales",
    title="Sales",
    description="Pre-sales: product advice, comparisons, prices, availability and recommendations.",
    instructions=sales_instructions,
    tools=SALES_TOOLS,
    handoffs=("support", "triage"),
)
SUPPORT = Agent(
    name="support",
    title="Support",
    description="After-sales: orders, deliveries, faults, repairs, returns and refunds.",
    instructions=support_instructions,
    tools=SUPPORT_TOOLS,
    handoffs=("sales", "triage"),
    prefetch=order_lookups,
)


KNOWLEDGE_OF: dict[str, tuple[str, ...]] = {"sales": ("catalogue",), "support": ("support",)}
"""The knowledge base collections each agent searches."""


def default_roster(knowledge: KnowledgeBase | None = None, *, min_similarity: float = 0.35) -> Roster:
    """The three agents; with a knowledge base, sales searches the catalogue and support the after-sales
    documents (`search_knowledge`), and their instructions say to cite sources."""
    if knowledge is None:
        return Roster.of((TRIAGE, SALES, SUPPORT), entry="triage")
    cite = (
        " For product facts and policies, use search_knowledge first and cite the passages you use as "
        "[n] Title; if it finds nothing, say so and offer a colleague."
    )

    def grounded(agent: Agent, collections: tuple[str, ...]) -> Agent:
        search = search_knowledge_tool(knowledge, collections=collections, min_similarity=min_similarity)
        retrieve = knowledge_retriever(search, knowledge, collections=collections, min_similarity=min_similarity)
        base = agent.instructions
        return replace(
            agent,
            tools=(*agent.tools, search),
            retrieve=retrieve,
            instructions=lambda context: (base(context) if callable(base) else base) + cite,
        )

    return Roster.of(
        (TRIAGE, grounded(SALES, KNOWLEDGE_OF["sales"]), grounded(SUPPORT, KNOWLEDGE_OF["support"])), entry="triage"
    )
