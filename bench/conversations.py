"""The benchmark's customers and its stand-in for the LLM.

`SCRIPTS` are multi-message customer conversations for the LLM-cost figure: handoffs in every direction,
topic switches, follow-ups, a refund with confirmation, customers giving their names and one escalation.
Each message carries the agent expected to be active afterwards, so the benchmark can check that the
conversations went the way they are described here.

`policy` plays the model: a deterministic function of the request that reads the active agent from the
system prompt, the customer's newest message and the tool results of the current turn, and then transfers,
calls a tool or replies much as a sensible model would. It sees only what a real model would see.

`LOAD_CYCLE` is the uniform workload of the overhead and throughput figures (every message: one handoff and
one reply, so two LLM calls), and `growth_messages` the long support thread of the growth figure.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agents.identity import Author
from agents.knowledge.tool import PASSAGES, passages_in
from agents.summary import PROMPT as SUMMARY_PROMPT
from bot.examples.driftwing.shop import ORDERS, Customer
from fakes.openai_server import FakeReply, RecordedRequest, reply, tool_call, tools

AgentName = Literal["triage", "sales", "support"]
Kind = Literal["reply", "escalated", "human"]


@dataclass(frozen=True)
class Say:
    """One customer message and what should come of it."""

    text: str
    agent: AgentName
    """The agent expected to be active after the message."""
    kind: Kind = "reply"


@dataclass(frozen=True)
class Script:
    name: str
    about: str
    messages: tuple[Say, ...]
    customer: Customer | None = None
    """Who writes: the owner of the orders the script names (the tools show a customer only their own)."""

    @property
    def author(self) -> Author | None:
        return writer(self.name, self.customer)


def writer(user: str, customer: Customer | None) -> Author | None:
    """A benchmark customer as the edge would store them."""
    return Author("bench", None, user, customer.name, customer.email) if customer else None


SCRIPTS: tuple[Script, ...] = (
    Script(
        "first-drone",
        "name recorded; triage -> sales; product look-ups and follow-ups; sales -> triage",
        (
            Say("Hi there, my name is Maya.", "triage"),
            Say("I'm looking for my first drone, something easy to fly for a beginner.", "sales"),
            Say("How long does it fly on one charge?", "sales"),
            Say("Do you also sell spare batteries for it?", "sales"),
            Say("Great. What are your opening hours, in case I want to call?", "triage"),
            Say("Thanks, that's all for now!", "triage"),
        ),
    ),
    Script(
        "late-delivery",
        "triage -> support without an order number; order look-up; support -> sales for an accessory",
        (
            Say("Hello, my delivery still hasn't arrived.", "support"),
            Say("It's DW-1002.", "support"),
            Say("When will it get here, roughly?", "support"),
            Say("OK. Also, do you sell propeller guards for the Harrier?", "sales"),
            Say("Thanks, bye.", "sales"),
        ),
        ORDERS["DW-1002"].customer,
    ),
    Script(
        "refund",
        "name; refund asked, confirmed in a later message, then a topic switch to sales",
        (
            Say("Hi, I'm Dev Rao.", "triage"),
            Say("I want a refund for order DW-1004, the gimbal shakes in every video.", "support"),
            Say("Yes, please go ahead.", "support"),
            Say("How long until I see the money?", "support"),
            Say("Thanks. Could you also recommend a beginner drone for my son?", "sales"),
        ),
        ORDERS["DW-1004"].customer,
    ),
    Script(
        "sales-to-support",
        "prices from sales, then a fault on an existing order moves to support",
        (
            Say("What does the Osprey Pro 8K cost?", "sales"),
            Say("And is the Harrier X4 cheaper?", "sales"),
            Say("Actually my Kestrel from order DW-1001 makes a grinding noise when it takes off.", "support"),
            Say("Can it be repaired under warranty?", "support"),
            Say("OK, please arrange the repair.", "support"),
        ),
        ORDERS["DW-1001"].customer,
    ),
    Script(
        "topic-hopper",
        "triage answers itself, then sales, support (order and refund refused) and back to triage",
        (
            Say("Hello! Do you ship to Canada?", "triage"),
            Say("Great. Which drone is best for racing?", "sales"),
            Say("How fast does it go?", "sales"),
            Say("Where is my order DW-1003? It's been a week.", "support"),
            Say("Can I still cancel it and get a refund?", "support"),
            Say("OK, then I'll wait. What are your opening hours?", "triage"),
        ),
        ORDERS["DW-1003"].customer,
    ),
    Script(
        "escalation",
        "name; order look-up; the customer asks for a person; the next message waits for the human",
        (
            Say("Hi, this is Ben.", "triage"),
            Say("My Harrier order DW-1002 says shipped but the tracking hasn't moved for 10 days.", "support"),
            Say("This is ridiculous, I want to speak to a real person.", "support", "escalated"),
            Say("Hello? Is anyone there?", "support", "human"),
        ),
        ORDERS["DW-1002"].customer,
    ),
    Script(
        "comparison-shopper",
        "two products looked up in parallel; follow-ups; stock question; store question goes to triage",
        (
            Say("Hi, I'm choosing between the Kestrel Mini 2 and the Harrier X4 for travel photos.", "sales"),
            Say("Which one is lighter?", "sales"),
            Say("What about the flight time on the Kestrel?", "sales"),
            Say("Do you have the Swift Racer in stock too?", "sales"),
            Say("I'll take the first one. How do I pay?", "sales"),
            Say("Do you offer gift wrapping?", "triage"),
            Say("Lovely, thank you.", "triage"),
        ),
    ),
    Script(
        "returned-item",
        "name and an order in one message (two tools, then a handoff); refund refused; support -> sales",
        (
            Say("My name is Eli Novak and I returned propeller guards, order DW-1005.", "support"),
            Say("Has my refund gone through?", "support"),
            Say("Fine. I want to buy a spare battery for my Kestrel instead.", "sales"),
            Say("How much is the Osprey Pro, out of interest?", "sales"),
            Say("Thanks, that's everything. Can you tell me your opening hours?", "triage"),
        ),
        ORDERS["DW-1005"].customer,
    ),
    Script(
        "wrong-number",
        "an unknown order number, corrected; an accessory from sales; a long goodbye with triage",
        (
            Say("Hi, where is my order DW-9999?", "support"),
            Say("Sorry, my mistake, it's DW-1003.", "support"),
            Say("Can I add a propeller guard set to it?", "sales"),
            Say("Perfect, thanks.", "sales"),
            Say("One more thing: is your store open on Sundays?", "triage"),
            Say("Good to know. Have a nice day!", "triage"),
        ),
        ORDERS["DW-1003"].customer,
    ),
)

LOAD_CYCLE: tuple[str, ...] = (
    "Hi! I'd like some buying advice, can you help?",
    "Before that: a delivery of mine never arrived. Who can help with that?",
    "Thanks, I'll find the number. Meanwhile, what would you recommend to buy?",
    "Sorry, one more thing about the delivery: can the courier leave it with a neighbour?",
    "Thanks. What are your opening hours?",
    "I'd like some advice on which model to buy, please.",
)
"""Six messages that each move the conversation to another agent: one handoff and one reply per message."""


_OPENERS = (
    "Thanks for getting back to me so quickly, I really appreciate the detailed answer.",
    "I tried what you suggested last time and wanted to report back on how it went.",
    "Sorry to bother you again, I've been testing the drone in the garden this afternoon.",
    "Quick update from me: I charged everything fully overnight before trying again.",
    "Hello again, I had a chance to look at it more closely with a friend who flies too.",
)
_DETAILS = (
    "The gimbal still drifts to the left after about two minutes of hovering and the horizon tilts.",
    "The app now shows a compass warning right after take-off, even far away from metal objects.",
    "One of the rear motors gets much hotter than the others and makes a faint clicking sound.",
    "The video feed drops out for a second or two whenever I fly more than a hundred metres away.",
    "The status light blinks yellow twice and the motors refuse to arm until I restart everything.",
    "I recalibrated the IMU on a flat table as the manual says, but the result looks the same.",
    "The propellers look fine, with no chips or cracks, and I swapped two of them just in case.",
)
_QUESTIONS = (
    "Is this something the warranty covers, or would a repair be charged?",
    "Should I send it in for repair, and if so, how do I pack it safely?",
    "Could this be a fault in the firmware rather than the hardware itself?",
    "How long does a warranty repair usually take at the moment?",
    "Is it safe to keep flying it until the repair, or should I ground it?",
    "Do you need any logs or videos from me to assess the fault?",
)


GROWTH_CUSTOMER = ORDERS["DW-1004"].customer
"""Writes the growth thread, about their order."""


def growth_messages(count: int = 50) -> list[str]:
    """A long support thread about one faulty drone, 300-400 characters a message; every seventh message
    names the order again, so support looks it up (the thread's occasional tool calls)."""
    out = [
        "Hi, my Osprey Pro 8K from order DW-1004 has developed a fault: the gimbal drifts and the horizon "
        "tilts in every clip, and the app keeps warning about the compass. I only bought it in September "
        "and have flown it maybe ten times, always carefully. Can you help me get it repaired?"
    ]
    for i in range(1, count):
        details = f"{_DETAILS[i % len(_DETAILS)]} {_DETAILS[(i + 3) % len(_DETAILS)]}"
        text = f"{_OPENERS[i % len(_OPENERS)]} {details} {_QUESTIONS[i % len(_QUESTIONS)]}"
        if i % 7 == 0:
            text += " The order is DW-1004."
        out.append(text)
    return out[:count]


# --------------------------------------------------------------------------------------------- the policy

ORDER_ID = re.compile(r"\bDW-\d{4}\b", re.IGNORECASE)
NAME = re.compile(r"\b(?:[Mm]y name is|[Tt]his is|I'm|I am)\s+([A-Z][a-z]+(?: [A-Z][a-z]+)?)")
HUMAN = re.compile(r"\b(real person|a person|human|manager)\b")
CONFIRM = re.compile(r"^\s*(yes|yeah|yep|sure|please do|go ahead)\b")
REFUND = re.compile(r"\b(refund\w*|money back|cancel\w*)\b")
SUPPORT = re.compile(
    r"\b(orders?|deliver\w*|arriv\w*|shipped|tracking|return\w*|broken|fault\w*|repair\w*|warranty|noise"
    r"|crash\w*|damaged|courier|gimbal)\b"
)
SALES = re.compile(
    r"\b(buy\w*|recommend\w*|advice|price\w*|cost\w*|cheap\w*|sell|stock|drones?|beginner|camera|racing|racer"
    r"|fpv|batter(?:y|ies)|guards?|kestrel|harrier|osprey|swift|photo\w*|compare|choos\w*)\b"
)
GENERAL = re.compile(r"(opening hours|\bhours\b|ship to|\bgift\w*|\bstore\b|\bsundays?\b|\blocated\b)")

ACCESSORIES = (("batter", "battery"), ("guard", "guard"))
PRODUCTS = (("kestrel", "Kestrel"), ("harrier", "Harrier"), ("osprey", "Osprey"), ("swift", "Swift"))
CATEGORIES = (("beginner", "beginner"), ("racing", "FPV"), ("fpv", "FPV"), ("photo", "camera"))

Topic = Literal["human", "confirm", "refund", "support", "sales", "general", "other"]


def agent_of(system: str) -> AgentName:
    if system.startswith("You are the front desk"):
        return "triage"
    if "You are Sales" in system:
        return "sales"
    if "You are Support (after-sales)" in system:
        return "support"
    raise ValueError(f"unknown agent in system prompt: {system[:60]!r}")


def context_of(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The shared context the engine shows the model as a second system message."""
    prefix = "Known about this conversation: "
    for message in messages:
        content = message.get("content")
        if message.get("role") == "system" and isinstance(content, str) and content.startswith(prefix):
            parsed = json.loads(content[len(prefix) :])
            return parsed if isinstance(parsed, dict) else {}
    return {}


def topic_of(text: str, context: dict[str, Any]) -> Topic:
    lower = text.lower()
    if HUMAN.search(lower):
        return "human"
    if CONFIRM.search(lower) and isinstance(context.get("pending_refund"), dict):
        return "confirm"
    if REFUND.search(lower):
        return "refund"
    if ORDER_ID.search(text) or SUPPORT.search(lower):
        return "support"
    if SALES.search(lower):
        return "sales"
    if GENERAL.search(lower):
        return "general"
    return "other"


def product_queries(text: str) -> list[str]:
    """What a model would search the catalogue for: an accessory, else every product named, else a category."""
    lower = text.lower()
    for word, query in ACCESSORIES:
        if word in lower:
            return [query]
    named = [query for word, query in PRODUCTS if word in lower]
    if named:
        return named
    return [query for word, query in CATEGORIES if word in lower][:1]


@dataclass(frozen=True)
class Turn:
    """What the model can read off one request."""

    agent: AgentName
    user: str
    topic: Topic
    context: dict[str, Any]
    called: tuple[str, ...]
    """Tools called since the customer's message, in order."""
    results: tuple[tuple[str, str], ...]
    """(tool, output) of those calls."""
    window_results: tuple[tuple[str, str], ...]
    """(tool, output) of every tool result in the window, oldest first."""
    window_users: tuple[str, ...]
    available: frozenset[str] = frozenset()
    """The tools the request offers."""

    @property
    def passages(self) -> str | None:
        """The knowledge found for this message, by the model's search or before its first call."""
        found = self.result_of("search_knowledge")
        return found if found is not None and found.startswith(PASSAGES) else None

    @property
    def name(self) -> str | None:
        """The name recorded, else the first name of the writer's chat profile (as the instructions say)."""
        value = self.context.get("customer_name")
        profile = self.context.get("writer")
        if isinstance(value, str):
            return value
        return profile.split()[0] if isinstance(profile, str) and profile.strip() else None

    def knows(self, name: str) -> bool:
        """The name the customer gives is the one already known (recorded, or their profile's)."""
        known = [self.context.get("customer_name"), self.context.get("writer")]
        return any(isinstance(k, str) and name.lower() in k.lower() for k in known)

    def result_of(self, tool: str) -> str | None:
        return next((out for name, out in reversed(self.results) if name == tool), None)

    def last_window_result(self, tool: str) -> str | None:
        return next((out for name, out in reversed(self.window_results) if name == tool), None)


def read(request: RecordedRequest) -> Turn:
    messages = request.messages
    last_user = max((i for i, msg in enumerate(messages) if msg.get("role") == "user"), default=-1)
    names: dict[str, str] = {}
    results: list[tuple[int, str, str]] = []
    for i, msg in enumerate(messages):
        for call in msg.get("tool_calls") or ():
            names[str(call["id"])] = str(call["function"]["name"])
        if msg.get("role") == "tool":
            results.append((i, names.get(str(msg.get("tool_call_id")), "?"), str(msg.get("content") or "")))
    called = tuple(
        str(call["function"]["name"]) for msg in messages[last_user + 1 :] for call in msg.get("tool_calls") or ()
    )
    context = context_of(messages)
    return Turn(
        agent=agent_of(request.system),
        user=request.last_user,
        topic=topic_of(request.last_user, context),
        context=context,
        called=called,
        results=tuple((name, out) for i, name, out in results if i > last_user),
        window_results=tuple((name, out) for _, name, out in results),
        window_users=tuple(str(m.get("content") or "") for m in messages if m.get("role") == "user"),
        available=frozenset(str(t["function"]["name"]) for t in request.tools or ()),
    )


def policy(request: RecordedRequest) -> FakeReply:
    """The fake model: one deterministic decision per request."""
    if request.system == SUMMARY_PROMPT:
        return reply(summary_of(request.last_user))
    turn = read(request)
    if turn.topic == "human":
        return tools(tool_call("escalate_to_human", {"reason": "The customer asked for a person."}))
    match turn.agent:
        case "triage":
            return _triage(turn)
        case "sales":
            return _sales(turn)
        case "support":
            return _support(turn)


def summary_of(asked: str) -> str:
    """A running summary as a model would write it, short and deterministic: the previous one's facts and the
    new turns' (the customer's name, the orders named, how many messages, the last question)."""
    previous = re.search(r"^Previous summary: (.*)$", asked, re.MULTILINE)
    names = re.findall(r"^Customer \(([^)]+)\):", asked, re.MULTILINE)
    said = re.findall(r"^Customer(?: \([^)]*\))?: (.*)$", asked, re.MULTILINE)
    known = previous.group(1) if previous else ""
    earlier = re.search(r"(\d+) customer messages", known)
    count = len(said) + (int(earlier.group(1)) if earlier else 0)
    orders = sorted({o.upper() for o in ORDER_ID.findall(asked)})
    name = names[-1] if names else next(iter(re.findall(r"The customer is ([^.]+)\.", known)), "")
    facts = [f"The customer is {name}." if name else "The customer did not give a name."]
    facts.append(f"Orders named: {', '.join(orders)}." if orders else "No order named yet.")
    facts.append(f"{count} customer messages so far; the last one: {said[-1][:160] if said else ''}")
    return " ".join(facts)


def _transfer(target: AgentName, why: str) -> FakeReply:
    return tools(tool_call(f"transfer_to_{target}", {"reason": why}))


def _hello(turn: Turn) -> str:
    return f", {turn.name}" if turn.name else ""


def _pick(options: Sequence[str], key: str) -> str:
    return options[zlib.crc32(key.encode()) % len(options)]


def _triage(turn: Turn) -> FakeReply:
    given = NAME.search(turn.user)
    if given and "record_customer_name" not in turn.called and not turn.knows(given.group(1)):
        return tools(tool_call("record_customer_name", {"name": given.group(1)}))
    if turn.topic in ("sales",):
        return _transfer("sales", "buying advice")
    if turn.topic in ("support", "refund", "confirm"):
        return _transfer("support", "an existing order")
    if turn.topic == "general":
        return reply(
            "We're open Monday to Saturday, 9:00-18:00 CET, by chat and phone; on Sundays the shop is closed, "
            "but you can still leave a message here. We ship tracked to the EU, UK, US and Canada, and gift "
            f"wrapping is available at checkout for $4. Anything else I can help you with{_hello(turn)}?"
        )
    if "record_customer_name" in turn.called or given:
        return reply(
            f"Nice to meet you{_hello(turn)}! I'm the front desk at Driftwing Drones. I can help with buying "
            "advice, orders, deliveries, repairs and refunds. What can I do for you today?"
        )
    return reply(
        f"Happy to help{_hello(turn)}! Could you tell me a bit more: are you looking for buying advice, or is "
        "it about an order you already placed?"
        if "?" in turn.user
        else f"You're welcome{_hello(turn)}! If anything else comes up, about a new drone or an order you "
        "already have, just write here and we'll pick it up."
    )


def _sales(turn: Turn) -> FakeReply:
    if turn.topic in ("support", "refund", "confirm"):
        return _transfer("support", "question about an existing order")
    if turn.topic == "general":
        return _transfer("triage", "general store question")
    queries = product_queries(turn.user) if turn.topic == "sales" else []
    if queries and "find_product" not in turn.called:
        grounded = _grounded(turn, queries)
        if grounded is not None:
            return grounded
        return tools(*(tool_call("find_product", {"query": q}) for q in queries))
    found = [out for name, out in turn.results if name == "find_product"]
    if found:
        return reply(
            f"Here's what our catalogue says{_hello(turn)}:\n"
            + "\n".join(f"- {line}" for out in found for line in out.splitlines())
            + "\nWould you like me to compare it with another model, or check accessories such as spare "
            "batteries and propeller guards?"
        )
    if turn.topic == "sales":
        return reply(
            f"Happy to help you choose{_hello(turn)}! What will you mainly use the drone for (first flights, "
            "travel photos, racing or professional film), what's your budget, and how much flight time do "
            "you need? Then I can recommend a model from our catalogue."
        )
    if "?" not in turn.user:
        return reply(
            f"You're welcome{_hello(turn)}! Enjoy flying, and if you have more questions before you buy, just "
            "write here."
        )
    earlier = turn.last_window_result("find_product")
    basis = f" From the catalogue entry we looked at: {earlier.splitlines()[0]}" if earlier else ""
    return reply(
        f"Good question{_hello(turn)}.{basis} You can order directly in our web shop and pay by card, PayPal "
        "or bank transfer; everything in stock ships within one business day. Let me know if you'd like me "
        "to look up anything else."
    )


def _grounded(turn: Turn, about: Sequence[str]) -> FakeReply | None:
    """With a knowledge base, as the instructions ask: search first (unless the passages are already at hand),
    then answer from a passage that is about the question (names one of `about`, any when empty) and cite it.
    None when there is no knowledge base or nothing found fits: the model goes on as without one."""
    if "search_knowledge" not in turn.available:
        return None
    found = turn.passages
    if found is None:
        return None if "search_knowledge" in turn.called else tools(tool_call("search_knowledge", {"query": turn.user}))
    for head, body in passages_in(found):
        if not about or any(word.lower() in f"{head}\n{body}".lower() for word in about):
            sentence = re.split(r"(?<=[.!?])\s", body.strip().replace("**", ""), maxsplit=1)[0]
            return reply(f"Here's what I found{_hello(turn)}: {sentence}\n\nSource: {head}")
    return None


def _known_order(turn: Turn) -> str | None:
    pending = turn.context.get("pending_refund")
    for text in reversed(turn.window_users):
        found = ORDER_ID.search(text)
        if found:
            return found.group(0).upper()
    if isinstance(pending, dict) and isinstance(pending.get("order_id"), str):
        return str(pending["order_id"])
    return None


_TROUBLESHOOTING = (
    "Thanks for the detailed report{hello}, that helps a lot. What you describe sounds like a calibration or "
    "hardware fault rather than anything you did wrong. Before we send it in, please try this once more:\n"
    "1. Update the firmware of the drone and the remote in the app (Settings > Device > Firmware).\n"
    "2. Restart both, then recalibrate the compass outdoors, at least 10 m from cars, fences and rebar.\n"
    "3. Recalibrate the gimbal on a level surface with the drone switched on for five minutes first.\n"
    "If the problem comes back, it is covered by the two-year warranty: I'll send you a prepaid label, and "
    "repairs currently take 7-10 business days from the day the parcel reaches our workshop. Please include "
    "the charger and batteries, and pack the drone in its original case if you still have it.",
    "I'm sorry it's still not right{hello}. From what you write, the safest course is to stop flying it for "
    "now, so that a small fault doesn't turn into a crash. It is well within the warranty period, so the "
    "repair is free of charge, shipping both ways included. To speed things up:\n"
    "- export the flight logs from the app (Settings > Flight records > Export) and attach them here;\n"
    "- add a short video that shows the problem, filmed from the ground if you can;\n"
    "- note roughly when it started and whether it happens on every flight.\n"
    "Our technicians look at those first, and it often saves a few days. Once you're ready, reply here and "
    "I'll open the repair case and email you the shipping label with packing instructions.",
    "Good question{hello}. Our workshop checks the gimbal, motors, compass, radio and firmware on every "
    "repair, so you don't need to pinpoint the exact cause yourself, and you won't be charged for anything "
    "the warranty covers. If a part can't be repaired we replace it, or the whole drone if needed, and we "
    "test-fly it before it goes back to you. You'll get an email at each step: received, diagnosed, "
    "repaired, shipped. If we find damage from a crash, which the warranty doesn't cover, we always ask "
    "before doing any paid work, and you can have it sent back unrepaired at no cost. Is there anything "
    "else about the fault you noticed, such as sounds, smells or error codes in the app?",
)


_AFTER_LOOKUP = {
    "shipped": "Tracked parcels usually arrive within 3-5 business days of shipping; I'll keep an eye on it, "
    "and you can ask me here any time.",
    "processing": "It hasn't shipped yet; orders usually leave our warehouse within two business days, and "
    "you'll get the tracking link by email.",
    "delivered": "Let me know what's wrong with it and I'll sort it out with you: a repair under warranty, a "
    "replacement or a refund, whichever fits.",
    "returned": "We have received the return; if you have a question about it, tell me and I'll check.",
}


def _support(turn: Turn) -> FakeReply:
    if turn.topic == "sales":
        return _transfer("sales", "buying advice")
    if turn.topic == "general":
        return _transfer("triage", "general store question")
    order = _known_order(turn)
    named = ORDER_ID.search(turn.user)
    if turn.topic == "confirm" and "issue_refund" not in turn.called and order:
        return tools(tool_call("issue_refund", {"order_id": order, "confirmed": True}))
    if turn.topic == "refund" and "issue_refund" not in turn.called and order:
        return tools(tool_call("issue_refund", {"order_id": order}))
    if named and turn.topic == "support" and "lookup_order" not in turn.called:
        return tools(tool_call("lookup_order", {"order_id": named.group(0).upper()}))

    refund = turn.result_of("issue_refund")
    if refund is not None:
        question = re.search(r"Ask the customer: '([^']+)'", refund)
        if question:
            return reply(f"I can do that{_hello(turn)}. {question.group(1)}")
        if refund.startswith("Refunded"):
            return reply(f"Done{_hello(turn)}! {refund} Is there anything else I can do for you?")
        refused = refund.replace(" Offer a human if they insist.", "")
        return reply(
            f"I've checked{_hello(turn)}: {refused} I'm sorry I can't do more myself; if you'd like, I can "
            "ask a colleague to look at it personally."
        )
    looked_up = turn.result_of("lookup_order")
    if looked_up is not None:
        status = re.search(r"status (\w+)", looked_up)
        if looked_up.startswith("No order"):
            return reply(
                f"I couldn't find that order{_hello(turn)}. Could you check the number in your confirmation "
                "email? It looks like DW-1234."
            )
        return reply(
            f"Thanks{_hello(turn)}, I've looked it up: {looked_up} "
            + _AFTER_LOOKUP.get(status.group(1) if status else "", _AFTER_LOOKUP["delivered"])
        )
    if turn.topic in ("support", "refund") and order is None:
        return reply(
            f"I'm sorry to hear that{_hello(turn)}. Could you give me your order number? It looks like "
            "DW-1234 and is in your confirmation email."
        )
    if turn.topic == "support":
        return _grounded(turn, ()) or reply(_pick(_TROUBLESHOOTING, turn.user).format(hello=_hello(turn)))
    if "?" in turn.user:
        return reply(
            f"Refunds reach your account 3-5 business days after we issue them{_hello(turn)}, and tracked "
            "parcels arrive 3-5 business days after shipping; you get the tracking link by email the moment "
            "it ships. Anything else I can check for you?"
        )
    return reply(
        f"Glad I could help{_hello(turn)}. If anything changes with your order, just write here and we'll "
        "pick it up straight away."
    )
