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
from agents.knowledge.tool import knowledge_search
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
    if name:
        return f"The customer's name is {name}; use it."
    return "Else use the first name of their chat profile (writer), if known."


@function_tool
async def record_customer_name(ctx: ToolContext, name: Annotated[str, Field(min_length=1, max_length=80)]) -> str:
    """Remember the customer's name for the conversation."""
    ctx.state["customer_name"] = name.strip()
    return f"Recorded the customer's name: {name.strip()}."


# Routing examples (agents.router): written for the router, never taken from the routing sets that measure it.
TRIAGE_EXAMPLES = (
    "hello",
    "hey there",
    "hi, anyone around?",
    "good afternoon",
    "morning all",
    "yo",
    "hi, my name is Sam",
    "this is Maria from Lisbon",
    "I'm Tom, nice to meet you",
    "thanks, that's everything",
    "thank you so much, bye",
    "cheers, have a good day",
    "ok great",
    "where is your company based?",
    "what hours are you open?",
    "do you have a physical shop I can visit?",
    "how do I contact you by phone?",
    "what can you help me with?",
    "are you a bot?",
    "what does Driftwing do?",
    "is there a newsletter I can sign up for?",
    "do you have a discount code for students?",
    "can I change the email on my account?",
    "how do I reset my password for the website?",
    "I have a question",
    "quick question",
    "can you help me?",
    "test",
)
SALES_EXAMPLES = (
    "which drone would you recommend for a beginner?",
    "what's the best drone for aerial photography under 1000?",
    "how much does the Osprey Pro 8K cost?",
    "is the Harrier X4 in stock?",
    "what's the difference between the Kestrel Mini 2 and the Harrier X4?",
    "how long does the Kestrel fly on one battery?",
    "do you sell extra batteries for the Harrier?",
    "I want to buy a racing drone",
    "does the Swift Racer FPV kit come with goggles?",
    "what camera resolution does the Osprey have?",
    "looking for a drone for filming weddings, any suggestions?",
    "which drone is lightest for travelling?",
    "do you have ND filters for the Osprey?",
    "what memory card should I get with my new drone?",
    "are propeller guards available for the Kestrel Mini 2?",
    "can you compare your two camera drones for me?",
    "what's your cheapest drone?",
    "is there a bundle with spare batteries and a case?",
    "my son is 12, which drone is good for him?",
    "how far can the Harrier fly from the controller?",
    "does the Osprey Pro shoot in 10-bit?",
    "will you have the new model back in stock soon?",
    "what's the wind resistance of the Kestrel?",
    "do you sell a carrying case?",
    "is the FPV kit good for someone who has never raced?",
    "thinking about upgrading from a Kestrel, what's next up?",
    "which charger do I need for the LB-3000 battery?",
    "what accessories do you recommend for a new pilot?",
    "price of spare propellers?",
    "I'd like to order a Harrier X4",
    "can I pay in instalments for the Osprey?",
)
SUPPORT_EXAMPLES = (
    "where is my order?",
    "my package still hasn't arrived",
    "can you check the status of order DW-1234?",
    "the tracking number doesn't work",
    "I'd like to return my drone",
    "how do I get a refund?",
    "I want my money back for order DW-2001",
    "my drone won't turn on",
    "the battery drains really fast after the update",
    "the gimbal is shaking in every video",
    "my Kestrel crashed and a propeller arm is broken, can it be repaired?",
    "the controller won't pair with the drone",
    "the app keeps disconnecting mid-flight",
    "how do I update the firmware?",
    "firmware update failed and now it's stuck",
    "is my drone still under warranty?",
    "I received the wrong item",
    "the box arrived damaged",
    "one of the parts is missing from my kit",
    "can I cancel my order?",
    "I was charged twice",
    "the camera shows error E-12",
    "the drone drifts to the left when hovering",
    "my battery is swollen, is that dangerous?",
    "how long does a repair take?",
    "I sent my drone in for repair, any update?",
    "can I change the delivery address on my order?",
    "the compass calibration keeps failing",
    "GPS won't lock",
    "motors beep but the props don't spin",
    "my refund hasn't shown up on my card yet",
    "the FPV goggles have no video signal",
)


def triage_instructions(context: Mapping[str, Any]) -> str:
    return (
        f"You are the front desk of {STORE}, an online drone store. Greet the customer, learn what they need "
        "and route them: buying advice, products, prices and availability go to sales; orders, deliveries, "
        "faults, repairs, returns and refunds go to support. When the customer tells you a name other than "
        "their profile's (writer), record it with record_customer_name. Answer simple questions about the store "
        f"yourself; do not give product or order details yourself. {_greeting(context)} {_SHARED}"
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
    examples=TRIAGE_EXAMPLES,
)
SALES = Agent(
    name="sales",
    title="Sales",
    description="Pre-sales: product advice, comparisons, prices, availability and recommendations.",
    instructions=sales_instructions,
    tools=SALES_TOOLS,
    handoffs=("support", "triage"),
    examples=SALES_EXAMPLES,
)
SUPPORT = Agent(
    name="support",
    title="Support",
    description="After-sales: orders, deliveries, faults, repairs, returns and refunds.",
    instructions=support_instructions,
    tools=SUPPORT_TOOLS,
    handoffs=("sales", "triage"),
    prefetch=order_lookups,
    examples=SUPPORT_EXAMPLES,
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
        search, retrieve = knowledge_search(knowledge, collections=collections, min_similarity=min_similarity)
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
