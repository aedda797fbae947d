"""Benchmark of human takeover's relays: the real bot as its own process (`python -m bot serve`), fed signed
Events API requests by this process, which also plays Slack's Web API and the LLM (which escalates every new
conversation with a scripted `escalate_to_human` call); see `bench.live`. Case summaries are the transcript,
so no LLM call is on any relay's path.

Set-up: N customers each ask for a person in a new thread of C_SUPPORT; the bot escalates, so N case
messages appear in C_STAFF. Then each conversation gets one staff reply (which claims the case) and one
customer message, unmeasured, so that caches, pools and the claim are out of the figures.

Figures, for both directions
    staff -> customer    a colleague's message in the case thread, from the moment its signed event leaves
                         this process to the chat.postMessage in the customer's thread (under the colleague's
                         name) as the emulator records it
    customer -> staff    a customer's message in their thread, to the chat.postMessage in the case thread

    low load    one message at a time, directions alternating, conversations in turn; the next one leaves once
                the previous one is fully handled (its relay, and the case update after a staff message or
                the removal of the working reaction after a customer's)
    burst       every conversation at once, a few messages each way: within a conversation, staff and
                customer messages alternate and each leaves as soon as the previous one is acknowledged (as
                Slack delivers one thread's messages in order); conversations do not wait for each other

Checks: every relay posted exactly once, in the right thread, and, per conversation and direction, in the
order the messages were sent; no other posts than relays, escalation notices and case messages.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

from agents.texts import Text, Texts
from bench.live import CORES_NOTE, Live, LoopLag, cpu_line, cpu_use, disturbed, live_bot, paused_gc, print_afterwards
from bench.setup import RESULTS, run_benchmark, section, summary, table
from bot.settings import Settings
from escalation.views import relay_text
from fakes.openai_server import FakeReply, RecordedRequest, reply, tool_call, tools
from harness.slack import Sent, deliver, write

SUPPORT, STAFF_CHANNEL, CUSTOMER, STAFF = "C_SUPPORT", "C_STAFF", "U_CUSTOMER", "U_STAFF"
ESCALATE = "escalate:"
"""A customer message starting with this makes the fake LLM call escalate_to_human."""
WORKING = str(Settings.model_fields["working_reaction"].default)
NOTICE = Texts().get(Text.ESCALATION_MESSAGE)
PCTS = ("p50", "p90", "p99", "max")

Direction = Literal["staff_to_customer", "customer_to_staff"]
DIRECTIONS: tuple[Direction, ...] = ("staff_to_customer", "customer_to_staff")
LABELS: dict[Direction, str] = {"staff_to_customer": "staff -> customer", "customer_to_staff": "customer -> staff"}
SPEAKER: dict[Direction, str] = {"staff_to_customer": "colleague", "customer_to_staff": "customer"}
SAYS: dict[Direction, str] = {
    "staff_to_customer": "your replacement drone ships today",
    "customer_to_staff": "thanks, when will it arrive",
}


@dataclass(frozen=True)
class Params:
    quick: bool
    conversations: int
    """Escalated conversations, each with its case thread."""
    low_load_per_direction: int
    burst_per_conversation: int
    """Burst: messages per conversation in each direction (so twice as many events per conversation)."""
    drain_timeout_s: float
    quiet_s: float
    """After everything is relayed: how long to keep watching for duplicate relays."""
    relay_timeout_s: float = 10

    @classmethod
    def of(cls, quick: bool) -> Params:
        if quick:
            return cls(True, conversations=5, low_load_per_direction=20, burst_per_conversation=4,
                       drain_timeout_s=30, quiet_s=0.5)  # fmt: skip
        return cls(False, conversations=20, low_load_per_direction=100, burst_per_conversation=5,
                   drain_timeout_s=60, quiet_s=1.0)  # fmt: skip


def answer(request: RecordedRequest) -> FakeReply:
    """The LLM: a new conversation that asks for a person is escalated; anything else (which the benchmark
    never sends once a conversation is escalated) gets an echo, so that a stray turn shows up as a post."""
    if request.last_user.startswith(ESCALATE):
        return tools(tool_call("escalate_to_human", {"reason": "customer asked for a person"}))
    return reply(f"re: {request.last_user}")


@dataclass
class Conversation:
    index: int
    thread_ts: str
    """The customer's thread in C_SUPPORT (its first message)."""
    case_ts: str = ""
    """The case message in C_STAFF, whose thread is the staff side."""
    staff_sent: int = 0
    """Staff messages sent so far: each one is followed by one update of the case message."""


@dataclass
class Message:
    """One message sent to the bot, and where and as what its relay should appear."""

    direction: Direction
    conversation: Conversation
    sent: Sent
    relay_channel: str
    relay_thread: str
    relay_text: str


def prepare(live: Live, conversation: Conversation, direction: Direction, text: str) -> Message:
    if direction == "staff_to_customer":
        conversation.staff_sent += 1
        sent = write(live.emulator, STAFF_CHANNEL, text, user=STAFF, thread_ts=conversation.case_ts)
        return Message(direction, conversation, sent, SUPPORT, conversation.thread_ts, relay_text(text))
    sent = write(live.emulator, SUPPORT, text, user=CUSTOMER, thread_ts=conversation.thread_ts)
    relayed = f"*Casey Customer* (customer): {text}"
    return Message(direction, conversation, sent, STAFF_CHANNEL, conversation.case_ts, relayed)


def handled(live: Live, message: Message) -> bool:
    """The relay is out, and so is what the bot does after it: the case update after a staff message, the
    removal of the working reaction from a customer's."""
    watcher, conversation = live.watcher, message.conversation
    if message.relay_text not in watcher.posts:
        return False
    if message.direction == "staff_to_customer":
        return watcher.updates[conversation.case_ts] >= conversation.staff_sent
    return ("reactions.remove", message.sent.ts, WORKING) in watcher.reactions


def say(direction: Direction, phase: str, n: int, conversation: Conversation) -> str:
    """A unique text (relays are matched to messages by text)."""
    return f"{phase} message {n} from the {SPEAKER[direction]} in conversation {conversation.index}: {SAYS[direction]}"


# ------------------------------------------------------------------------------------------------ set-up


async def escalate_all(live: Live, params: Params) -> tuple[list[Conversation], dict[str, Any]]:
    """N customers ask for a person at once; each gets a case message in the staff channel. The case is found
    by the permalink to the customer's thread that its blocks carry."""
    started = time.monotonic()
    text = "{} conversation {}, I want to talk to a person"
    sent = [write(live.emulator, SUPPORT, text.format(ESCALATE, i)) for i in range(params.conversations)]
    conversations = [Conversation(i, s.ts) for i, s in enumerate(sent)]
    await asyncio.gather(*(deliver(live.emulator, s) for s in sent))
    if bad := [(s.status, s.error) for s in sent if s.status != 200]:
        raise RuntimeError(f"{len(bad)} escalation events not acknowledged with 200: {bad[:3]}")

    def all_done() -> bool:
        # Handed to a person: the 👀 comes off (no ✅, which marks an answer).
        return all(("reactions.remove", c.thread_ts, WORKING) in live.watcher.reactions for c in conversations)

    if not await live.until(all_done, 30, "every escalation to be handled", poll_s=0.01):
        raise RuntimeError(f"not every escalation was handled; the bot posted {list(live.watcher.posts)[-3:]}")
    posted: dict[str, float] = {}  # customer thread -> when its case message was posted
    for call in live.emulator.calls_to("chat.postMessage"):
        if call.params.get("channel") == STAFF_CHANNEL and not call.params.get("thread_ts"):
            blocks = json.dumps(call.params.get("blocks"))
            posted |= {c.thread_ts: call.at for c in conversations if f"/p{c.thread_ts.replace('.', '')}" in blocks}
    for case in live.emulator.posts(STAFF_CHANNEL):
        for c in conversations:
            if case.thread_ts is None and f"/p{c.thread_ts.replace('.', '')}" in json.dumps(case.blocks):
                c.case_ts = case.ts
    if missing := [c.index for c in conversations if not c.case_ts or c.thread_ts not in posted]:
        raise RuntimeError(f"no case message found for conversations {missing}")
    return conversations, {
        "conversations": len(conversations),
        "seconds": round(time.monotonic() - started, 2),
        "event_to_case_message_ms": summary([(posted[s.ts] - s.sent) * 1000 for s in sent]),
    }


async def warm_up(live: Live, conversations: list[Conversation]) -> list[Message]:
    """One staff reply (it claims the case) and one customer message per conversation, not measured."""
    messages: list[Message] = []
    for conversation in conversations:
        for direction in DIRECTIONS:
            text = f"warm-up from the {SPEAKER[direction]} in conversation {conversation.index}"
            messages.append(message := prepare(live, conversation, direction, text))
            if (await deliver(live.emulator, message.sent)).status != 200:
                raise RuntimeError(f"warm-up event answered {message.sent.status} {message.sent.error or ''}")
            if not await live.until(partial(handled, live, message), 15, "a warm-up relay"):
                raise RuntimeError(f"no relay {message.relay_text!r}; the bot posted {list(live.watcher.posts)[-3:]}")
    return messages


# ------------------------------------------------------------------------------------------------ figures


async def low_load(
    live: Live, params: Params, conversations: list[Conversation]
) -> tuple[list[Message], dict[str, Any]]:
    """One message at a time, directions alternating, conversations in turn; each waits until the previous
    one is fully handled."""
    messages: list[Message] = []
    lost = 0
    before = live.cpu()
    with LoopLag() as lag:
        for k in range(2 * params.low_load_per_direction):
            direction, conversation = DIRECTIONS[k % 2], conversations[(k // 2) % len(conversations)]
            messages.append(
                message := prepare(live, conversation, direction, say(direction, "low-load", k // 2, conversation))
            )
            live.watcher.expect(post=message.relay_text)
            await deliver(live.emulator, message.sent)
            lost += not await live.until(partial(handled, live, message), params.relay_timeout_s, f"message {k}")
    return messages, {
        "not_handled_within_timeout": lost,
        "cpu": cpu_use(before, live.cpu()),
        "bench_loop_lag_ms": lag.figures(),
    }


async def burst(live: Live, params: Params, conversations: list[Conversation]) -> tuple[list[Message], dict[str, Any]]:
    """Every conversation at once; within one, staff and customer messages alternate, each sent as soon as
    the previous one is acknowledged."""
    watcher = live.watcher
    messages: list[Message] = []

    async def talk(conversation: Conversation) -> None:
        for j in range(params.burst_per_conversation):
            for direction in DIRECTIONS:
                messages.append(
                    message := prepare(live, conversation, direction, say(direction, "burst", j, conversation))
                )
                watcher.expect(post=message.relay_text)
                await deliver(live.emulator, message.sent)

    with LoopLag() as lag:
        cpu_start = live.cpu()
        await asyncio.gather(*(talk(c) for c in conversations))
        cpu_sent = live.cpu()
        relayed = await live.until(lambda: not watcher.awaited_posts, params.drain_timeout_s, "every relay", 0.002)
        all_handled = relayed and await live.until(
            lambda: all(handled(live, m) for m in messages), 10, "every case update and reaction", 0.01
        )
        cpu_done = live.cpu()
    await asyncio.sleep(params.quiet_s)  # room for a duplicate to show up, if one were coming
    watcher.scan()
    first_sent, last_sent = min(m.sent.sent for m in messages), max(m.sent.sent for m in messages)
    relay_ats = [at for m in messages if (at := watcher.posted_at(m.relay_text)) is not None]
    last_relay = max(relay_ats, default=float("nan"))
    return messages, {
        "events": len(messages),
        "send_s": round(last_sent - first_sent, 3),
        "events_per_s": round((len(messages) - 1) / (last_sent - first_sent), 1) if last_sent > first_sent else None,
        "all_relayed": relayed,
        "all_handled": all_handled,
        "drain_s": round(last_relay - last_sent, 3) if relayed else None,
        "relays_per_s": round(len(relay_ats) / (last_relay - first_sent), 1) if relay_ats else None,
        "cpu_sending": cpu_use(cpu_start, cpu_sent),
        "cpu_draining": cpu_use(cpu_sent, cpu_done),
        "bench_loop_lag_ms": lag.figures(),
    }


def direction_figures(live: Live, messages: Sequence[Message]) -> dict[str, Any]:
    """Latency, ack, exactly-once and order of one direction's messages (in the order sent)."""
    posts = live.watcher.posts
    latencies: list[float] = []
    missing = duplicates = wrong_place = 0
    for message in messages:
        if not (relays := posts.get(message.relay_text, [])):
            missing += 1
            continue
        duplicates += len(relays) - 1
        latencies.append((relays[0].at - message.sent.sent) * 1000)
        for post in relays:
            misplaced = (post.channel, post.thread_ts) != (message.relay_channel, message.relay_thread)
            # Relays to the customer go out under the colleague's name; relays to staff under the bot's.
            wrong_place += misplaced or (post.username is not None) != (message.direction == "staff_to_customer")
    by_conversation: dict[int, list[Message]] = {}
    for message in messages:
        by_conversation.setdefault(message.conversation.index, []).append(message)
    out_of_order = 0
    for sent in by_conversation.values():
        relayed = [m for m in sent if m.relay_text in posts]
        order = sorted(relayed, key=lambda m: posts[m.relay_text][0].n)
        out_of_order += any(a is not b for a, b in zip(relayed, order, strict=True))
    return {
        "messages": len(messages),
        "relayed": len(messages) - missing,
        "latency_ms": summary(latencies),
        "ack_ms": summary([m.sent.ack_ms for m in messages if m.sent.error is None]),
        "non_200_acks": sum(1 for m in messages if m.sent.status != 200),
        "missing": missing,
        "duplicates": duplicates,
        "in_wrong_thread_or_name": wrong_place,
        "exactly_once": missing == 0 and duplicates == 0 and wrong_place == 0,
        "conversations": len(by_conversation),
        "conversations_out_of_order": out_of_order,
        "order_preserved": out_of_order == 0,
    }


def by_direction(live: Live, messages: Sequence[Message]) -> dict[str, Any]:
    return {d: direction_figures(live, [m for m in messages if m.direction == d]) for d in DIRECTIONS}


def stray_posts(live: Live, expected: set[str], conversations: int) -> dict[str, int]:
    """Posts the bot made that are neither a relay of ours, nor an escalation's notice or case message: a
    relay of something never sent, or a bot answer in a conversation a human has."""
    strays: Counter[str] = Counter()
    for text, posts in live.watcher.posts.items():
        for post in posts:
            notice = post.channel == SUPPORT and text == NOTICE
            case = post.channel == STAFF_CHANNEL and post.thread_ts is None and text.startswith("Case #")
            if text not in expected and not notice and not case:
                strays[f"{post.channel} {'thread' if post.thread_ts else 'top-level'}: {text[:60]}"] += 1
    if (notices := len(live.watcher.posts.get(NOTICE, []))) != conversations:
        strays[f"escalation notices: {notices} for {conversations} escalations"] += 1
    return dict(strays)


# ------------------------------------------------------------------------------------------------ report


def print_figures(figures: dict[str, Any], params: Params) -> None:
    section("Relay latency: from sending the event to the relayed post, ms")
    rows: list[Sequence[object]] = []
    for phase in ("low_load", "burst"):
        for d in DIRECTIONS:
            f = figures[phase][d]
            latency = (f["latency_ms"][k] for k in PCTS)
            rows.append(
                (f"{phase.replace('_', ' ')}, {LABELS[d]}", f["messages"], f["relayed"], *latency, f["ack_ms"]["p50"])
            )
    print(table(("load, direction", "sent", "relayed", *PCTS, "ack p50"), rows))
    low, burst = figures["low_load"], figures["burst"]
    print(
        f"low load: {2 * params.low_load_per_direction} messages one at a time over {params.conversations} "
        f"conversations; {low['not_handled_within_timeout']} not handled within {params.relay_timeout_s:g} s"
    )
    print("  " + cpu_line(low["cpu"], low["bench_loop_lag_ms"]))
    print(
        f"burst: {burst['events']} events ({params.burst_per_conversation} each way in each of "
        f"{params.conversations} conversations) sent in {burst['send_s']:.2f} s = {burst['events_per_s']} events/s; "
        + (
            f"the last relay came {burst['drain_s']:.2f} s after the last event; {burst['relays_per_s']} relays/s"
            if burst["all_relayed"]
            else f"WARNING: not every message was relayed within {params.drain_timeout_s:g} s"
        )
    )
    print("  while sending:  " + cpu_line(burst["cpu_sending"]))
    print("  while draining: " + cpu_line(burst["cpu_draining"], burst["bench_loop_lag_ms"]))


def print_checks(report: dict[str, Any]) -> None:
    section("Checks")
    for phase in ("warm_up", "low_load", "burst"):
        for direction in DIRECTIONS:
            f = report["figures"][phase][direction]
            print(
                f"{phase.replace('_', ' ')}, {LABELS[direction]}: exactly once {'yes' if f['exactly_once'] else 'NO'} "
                f"({f['relayed']} of {f['messages']} relayed, {f['missing']} missing, {f['duplicates']} duplicates, "
                f"{f['in_wrong_thread_or_name']} in a wrong thread or under a wrong name); order kept "
                f"{'yes' if f['order_preserved'] else 'NO'} ({f['conversations_out_of_order']} of "
                f"{f['conversations']} conversations out of order); {f['non_200_acks']} acks not 200"
            )
    strays = report["stray_posts"] or "none"
    print(f"other posts by the bot (relays of nothing sent, answers in a human's conversation): {strays}")
    print_afterwards(report)


# ------------------------------------------------------------------------------------------------ entry


async def run(server_url: str, params: Params) -> dict[str, Any]:
    async with live_bot(server_url, answer, {}) as live:
        conversations, setup = await escalate_all(live, params)
        print(
            f"{setup['conversations']} conversations escalated in {setup['seconds']} s (event to case message "
            f"p50 {setup['event_to_case_message_ms']['p50']} ms)",
            flush=True,
        )
        warm_messages = await warm_up(live, conversations)
        with paused_gc():
            low_messages, low_figures = await low_load(live, params, conversations)
        with paused_gc():
            burst_messages, burst_figures = await burst(live, params, conversations)
    figures = {
        "setup": setup,
        "warm_up": by_direction(live, warm_messages),
        "low_load": by_direction(live, low_messages) | low_figures,
        "burst": by_direction(live, burst_messages) | burst_figures,
    }
    cpu = {"low_load": low_figures["cpu"], "burst_sending": burst_figures["cpu_sending"]}
    expected = {m.relay_text for m in (*warm_messages, *low_messages, *burst_messages)}
    report: dict[str, Any] = {
        "note": CORES_NOTE.format(cores=os.cpu_count()),
        "parameters": asdict(params) | {"burst_per_direction": params.conversations * params.burst_per_conversation},
        "figures": figures,
        "disturbed_by_other_processes": disturbed(cpu | {"burst_draining": burst_figures["cpu_draining"]}),
        "stray_posts": stray_posts(live, expected, len(conversations)),
        **live.afterwards,
    }
    print_figures(figures, params)
    print_checks(report)
    return report


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Run the relay benchmark, print its figures and write `results/relay.json`."""
    params = Params.of(quick)
    return run_benchmark("relay", quick, results, lambda url: run(url, params))
