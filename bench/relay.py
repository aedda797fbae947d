"""Benchmark of human takeover's relays: the real bot as its own process (`python -m bot serve`, as in
`bench.slack`), fed signed Events API requests by this process, which also plays Slack's Web API
(`fakes.slack_api.SlackEmulator`) and the LLM (`FakeOpenAI`, which escalates every new conversation with a
scripted `escalate_to_human` call). Postgres is real: the embedded Postgres, or the server in
BENCH_DATABASE_URL, with a fresh database built by the migrations. Case summaries are the transcript
(CASE_SUMMARY=transcript), so no LLM call is on any relay's path.

Set-up: N customers each ask for a person in a new thread of C_SUPPORT; the bot escalates, so N case
messages appear in C_STAFF. Then each conversation gets one staff reply (which claims the case) and one
customer message, unmeasured, so that caches, pools and the claim are out of the figures.

Figures, for both directions
    staff -> customer    a colleague's message in the case thread (U_STAFF in C_STAFF), from the moment its
                         signed event leaves this process to the chat.postMessage in the customer's thread
                         (posted under the colleague's name) as the emulator records it
    customer -> staff    a customer's message in their thread, to the chat.postMessage in the case thread
                         ("*Casey Customer* (customer): ...")

    low load    one message at a time, directions alternating, conversations in turn; the next one leaves once
                the previous one is fully handled (its relay, and the case update after a staff message or
                the removal of the :eyes: reaction after a customer's)
    burst       every conversation at once, a few messages each way: within a conversation, staff and
                customer messages alternate and each leaves as soon as the previous one is acknowledged (as
                Slack delivers one thread's messages in order); conversations do not wait for each other

Where the time went: after the run, the bot's own timestamps (Postgres's now() in the rows it wrote) split
each relay into waiting for a turn, the turn and the relay's place in its conversation's outbox, and the post.

Checks: every relay posted exactly once, in the right thread, and, per conversation and direction, in the
order the messages were sent. Also reported: the CPU each process used, this process's loop lag, what the
run left in the database, the bot's /metrics and the WARNING lines of its log.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import aiohttp
import slack_bolt
from slack_sdk.signature import SignatureVerifier
from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from bench.setup import (
    RESULTS,
    admin,
    machine,
    postgres_server,
    quiet,
    section,
    summary,
    table,
    throwaway_database,
    write_report,
)
from bench.slack import (
    BOT_TOKEN,
    CORES_NOTE,
    DEFAULTS,
    DONE,
    OTHERS_WARNING,
    SIGNING_SECRET,
    WORKING,
    BotProcess,
    CpuSample,
    LoopLag,
    _cpu_line,
    _lag_line,
    bot_log_summary,
    bot_metrics,
    bot_process,
    cpu_use,
    database_state,
    echo_figures,
    find_postmaster,
    paused_gc,
    poll_until,
    source_version,
)
from bot.mrkdwn import to_mrkdwn
from db import models as m
from db.deliveries import RelayToCustomer, RelayToStaff
from db.url import async_url
from fakes.openai_server import FakeOpenAI, FakeReply, RecordedRequest, reply, tool_call, tools
from fakes.slack_api import BOT_USER_ID, TEAM_ID, SlackEmulator

SUPPORT = "C_SUPPORT"
STAFF_CHANNEL = "C_STAFF"
CUSTOMER = "U_CUSTOMER"
STAFF = "U_STAFF"
ESCALATE = "escalate:"
"""A customer message starting with this makes the fake LLM call escalate_to_human."""

PG_SETTINGS = ("fsync", "synchronous_commit", "wal_sync_method", "shared_buffers")
"""Every commit waits for its WAL flush (with these defaults): what each of the bot's commits costs."""

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
    relay_timeout_s: float
    drain_timeout_s: float
    quiet_s: float
    """After everything is relayed: how long to keep watching for duplicate relays."""
    bot_max_turns: int = int(DEFAULTS["max_concurrent_turns"].default)
    bot_db_pool_size: int = int(DEFAULTS["db_pool_size"].default)
    bot_ack_pool_size: int = int(DEFAULTS["ack_pool_size"].default)

    @classmethod
    def of(cls, quick: bool) -> Params:
        if quick:
            return cls(
                quick=True,
                conversations=5,
                low_load_per_direction=20,
                burst_per_conversation=4,
                relay_timeout_s=10,
                drain_timeout_s=30,
                quiet_s=0.5,
            )
        return cls(
            quick=False,
            conversations=20,
            low_load_per_direction=100,
            burst_per_conversation=5,
            relay_timeout_s=10,
            drain_timeout_s=60,
            quiet_s=1.0,
        )

    @property
    def burst_per_direction(self) -> int:
        return self.conversations * self.burst_per_conversation


def answer(request: RecordedRequest) -> FakeReply:
    """The LLM: a new conversation that asks for a person is escalated; anything else (which the benchmark
    never sends once a conversation is escalated) gets an echo, so that a stray turn shows up as a post."""
    if request.last_user.startswith(ESCALATE):
        return tools(tool_call("escalate_to_human", {"reason": "customer asked for a person"}))
    return reply(f"re: {request.last_user}")


# ------------------------------------------------------------------------------------------------ the bot


# ------------------------------------------------------------------------------------------------ load


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
    conversation: int
    text: str
    ts: str
    relay_channel: str
    relay_thread: str
    relay_text: str
    sent: float = 0.0
    acked: float = 0.0
    status: int = 0
    error: str | None = None

    @property
    def ack_ms(self) -> float:
        return (self.acked - self.sent) * 1000


@dataclass(frozen=True)
class Post:
    """A chat.postMessage the emulator recorded: the n-th call, at `at` (time.monotonic() of this process)."""

    n: int
    at: float
    channel: str
    thread_ts: str | None
    username: str | None
    text: str


def customer_relay_text(text: str) -> str:
    return f"*Casey Customer* (customer): {text}"


class Slack:
    """Plays Slack's users: a message is stored in the emulator (so the bot can read the thread), then its
    signed `message` event is POSTed to the bot over a client session of our own."""

    def __init__(self, emulator: SlackEmulator, session: aiohttp.ClientSession, events_url: str) -> None:
        self.emulator = emulator
        self.session = session
        self.events_url = events_url
        self.verifier = SignatureVerifier(SIGNING_SECRET)

    def event(self, channel: str, user: str, text: str, thread_ts: str | None, parent: str) -> tuple[str, bytes]:
        msg = self.emulator.add_message(channel, text, user=user, thread_ts=thread_ts)
        event: dict[str, Any] = {
            "type": "message",
            "channel": channel,
            "user": user,
            "text": text,
            "ts": msg.ts,
            "team": TEAM_ID,
            "event_ts": msg.ts,
            "channel_type": "channel",
        }
        if thread_ts is not None:
            event |= {"thread_ts": thread_ts, "parent_user_id": parent}
        return msg.ts, json.dumps(self.emulator.event_envelope(event)).encode()

    def prepare(self, conversation: Conversation, direction: Direction, text: str) -> tuple[Message, bytes]:
        if direction == "staff_to_customer":
            ts, body = self.event(STAFF_CHANNEL, STAFF, text, conversation.case_ts, BOT_USER_ID)
            where, relayed = (SUPPORT, conversation.thread_ts), to_mrkdwn(text)
            conversation.staff_sent += 1
        else:
            ts, body = self.event(SUPPORT, CUSTOMER, text, conversation.thread_ts, CUSTOMER)
            where, relayed = (STAFF_CHANNEL, conversation.case_ts), customer_relay_text(text)
        return Message(direction, conversation.index, text, ts, *where, relayed), body

    async def post(self, body: bytes) -> tuple[float, float, int, str | None]:
        """(sent, acked, HTTP status or 0, error): the times are time.monotonic() around the request."""
        stamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": self.verifier.generate_signature(timestamp=stamp, body=body) or "",
        }
        status, error = 0, None
        sent = time.monotonic()
        try:
            async with self.session.post(self.events_url, data=body, headers=headers) as response:
                await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = repr(exc)
        return sent, time.monotonic(), status, error

    async def send(self, message: Message, body: bytes) -> Message:
        message.sent, message.acked, message.status, message.error = await self.post(body)
        return message


@dataclass
class Watcher:
    """Follows the emulator's record of Web API calls (a list that only grows) without re-reading it."""

    emulator: SlackEmulator
    seen: int = 0
    posts: dict[str, list[Post]] = field(default_factory=dict)
    """By text: every post's text is unique in this benchmark, so a second post of one text is a duplicate."""
    updates: Counter[str] = field(default_factory=Counter)
    """chat.update calls by the ts of the message updated (the case messages)."""
    reactions: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """(method, ts, name) -> when first recorded."""
    failed: Counter[str] = field(default_factory=Counter)
    awaited: set[str] = field(default_factory=set)
    """Relay texts not posted yet (see `expect`), so that waiting for many relays costs nothing per poll."""

    def expect(self, message: Message) -> None:
        self.awaited.add(message.relay_text)

    def scan(self) -> None:
        calls = self.emulator.calls
        for n in range(self.seen, len(calls)):
            call = calls[n]
            params = call.params
            if call.failed:
                self.failed[f"{call.method}: {call.error}"] += 1
            elif call.method == "chat.postMessage":
                text = str(params.get("text"))
                thread = params.get("thread_ts")
                username = params.get("username")
                post = Post(
                    n,
                    call.at,
                    str(params.get("channel")),
                    None if thread is None else str(thread),
                    None if username is None else str(username),
                    text,
                )
                self.posts.setdefault(text, []).append(post)
                self.awaited.discard(text)
            elif call.method == "chat.update":
                self.updates[str(params.get("ts"))] += 1
            elif call.method in ("reactions.add", "reactions.remove"):
                key = (call.method, str(params.get("timestamp")), str(params.get("name")))
                self.reactions.setdefault(key, call.at)
        self.seen = len(calls)

    def relayed(self, message: Message) -> bool:
        return message.relay_text in self.posts

    def handled(self, message: Message, conversation: Conversation) -> bool:
        """The relay is out, and so is what the bot does after it: the case update after a staff message, the
        removal of the :eyes: reaction from a customer's."""
        if not self.relayed(message):
            return False
        if message.direction == "staff_to_customer":
            return self.updates[conversation.case_ts] >= conversation.staff_sent
        return ("reactions.remove", message.ts, WORKING) in self.reactions


@dataclass
class Bench:
    params: Params
    bot: BotProcess
    emulator: SlackEmulator
    slack: Slack
    watcher: Watcher
    postmaster: int | None
    conversations: list[Conversation] = field(default_factory=list)

    def cpu(self) -> CpuSample:
        return CpuSample.take(self.bot.proc.pid, self.postmaster)

    async def until(self, done: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.001) -> bool:
        return await poll_until(self.watcher.scan, self.bot, done, timeout_s, what, poll_s)


# ------------------------------------------------------------------------------------------------ set-up


async def escalate_all(bench: Bench) -> dict[str, Any]:
    """N customers ask for a person at once; each gets a case message in the staff channel. The case is found
    by the permalink to the customer's thread that its blocks carry."""
    slack, emulator = bench.slack, bench.emulator
    started = time.monotonic()
    bodies = [
        slack.event(SUPPORT, CUSTOMER, f"{ESCALATE} conversation {i}, I want to talk to a person", None, CUSTOMER)
        for i in range(bench.params.conversations)
    ]
    bench.conversations = [Conversation(i, ts) for i, (ts, _) in enumerate(bodies)]
    results = await asyncio.gather(*(slack.post(body) for _, body in bodies))
    bad = [r for r in results if r[2] != 200]
    if bad:
        raise RuntimeError(f"{len(bad)} escalation events not acknowledged with 200: {bad[:3]}")
    sent = {c.thread_ts: r[0] for c, r in zip(bench.conversations, results, strict=True)}

    def permalink(conversation: Conversation) -> str:
        return f"/p{conversation.thread_ts.replace('.', '')}"

    def all_done() -> bool:
        return all(("reactions.add", c.thread_ts, DONE) in bench.watcher.reactions for c in bench.conversations)

    if not await bench.until(all_done, 30, "every escalation to be handled", poll_s=0.01):
        raise RuntimeError(f"not every escalation was handled; the bot posted {list(bench.watcher.posts)[-3:]}")
    posted: dict[str, float] = {}  # customer thread -> when its case message was posted
    for call in emulator.calls_to("chat.postMessage"):
        if call.params.get("channel") == STAFF_CHANNEL and not call.params.get("thread_ts"):
            blocks = json.dumps(call.params.get("blocks"))
            posted |= {c.thread_ts: call.at for c in bench.conversations if permalink(c) in blocks}
    for msg in emulator.posts(STAFF_CHANNEL):
        if msg.thread_ts is None:
            blocks = json.dumps(msg.blocks)
            for conversation in bench.conversations:
                if permalink(conversation) in blocks:
                    conversation.case_ts = msg.ts
    missing = [c.index for c in bench.conversations if not c.case_ts or c.thread_ts not in posted]
    if missing:
        raise RuntimeError(f"no case message found for conversations {missing}")
    return {
        "conversations": len(bench.conversations),
        "seconds": round(time.monotonic() - started, 2),
        "event_to_case_message_ms": summary(
            [(posted[c.thread_ts] - sent[c.thread_ts]) * 1000 for c in bench.conversations]
        ),
    }


async def warm_up(bench: Bench) -> list[Message]:
    """One staff reply (it claims the case) and one customer message per conversation, not measured."""
    messages: list[Message] = []
    for conversation in bench.conversations:
        for direction in DIRECTIONS:
            text = f"warm-up from the {SPEAKER[direction]} in conversation {conversation.index}"
            message, body = bench.slack.prepare(conversation, direction, text)
            messages.append(message)
            await bench.slack.send(message, body)
            if message.status != 200:
                raise RuntimeError(f"warm-up event answered {message.status} {message.error or ''}")
            if not await bench.until(partial(bench.watcher.handled, message, conversation), 15, "a warm-up relay"):
                raise RuntimeError(f"no relay {message.relay_text!r}; the bot posted {list(bench.watcher.posts)[-3:]}")
    return messages


def say(direction: Direction, phase: str, n: int, conversation: Conversation) -> str:
    """A unique text (relays are matched to messages by text)."""
    return f"{phase} message {n} from the {SPEAKER[direction]} in conversation {conversation.index}: {SAYS[direction]}"


# ------------------------------------------------------------------------------------------------ figures


async def low_load(bench: Bench) -> tuple[list[Message], dict[str, Any]]:
    """One message at a time, directions alternating, conversations in turn; each waits until the previous
    one is fully handled."""
    params, watcher = bench.params, bench.watcher
    messages: list[Message] = []
    lost = 0
    before = bench.cpu()
    with LoopLag() as lag:
        for k in range(2 * params.low_load_per_direction):
            direction = DIRECTIONS[k % 2]
            conversation = bench.conversations[(k // 2) % len(bench.conversations)]
            message, body = bench.slack.prepare(
                conversation, direction, say(direction, "low-load", k // 2, conversation)
            )
            watcher.expect(message)
            messages.append(message)
            await bench.slack.send(message, body)
            if not await bench.until(
                partial(watcher.handled, message, conversation), params.relay_timeout_s, f"message {k}"
            ):
                lost += 1
    after = bench.cpu()
    return messages, {
        "not_handled_within_timeout": lost,
        "cpu": cpu_use(before, after),
        "bench_loop_lag_ms": lag.figures(),
    }


async def burst(bench: Bench) -> tuple[list[Message], dict[str, Any]]:
    """Every conversation at once; within one, staff and customer messages alternate, each sent as soon as
    the previous one is acknowledged."""
    params, watcher, slack = bench.params, bench.watcher, bench.slack
    messages: list[Message] = []

    async def talk(conversation: Conversation) -> None:
        for j in range(params.burst_per_conversation):
            for direction in DIRECTIONS:
                message, body = slack.prepare(conversation, direction, say(direction, "burst", j, conversation))
                watcher.expect(message)
                messages.append(message)
                await slack.send(message, body)

    by_index = {c.index: c for c in bench.conversations}

    def all_handled() -> bool:
        return all(watcher.handled(m, by_index[m.conversation]) for m in messages)

    with LoopLag() as lag:
        cpu_start = bench.cpu()
        await asyncio.gather(*(talk(c) for c in bench.conversations))
        cpu_sent = bench.cpu()
        relayed = await bench.until(lambda: not watcher.awaited, params.drain_timeout_s, "every relay", poll_s=0.002)
        handled = relayed and await bench.until(all_handled, 10, "every case update and reaction", poll_s=0.01)
        cpu_done = bench.cpu()
    await asyncio.sleep(params.quiet_s)  # room for a duplicate to show up, if one were coming
    watcher.scan()
    first_sent = min(m.sent for m in messages)
    last_sent = max(m.sent for m in messages)
    relay_ats = [posts[0].at for m in messages if (posts := watcher.posts.get(m.relay_text))]
    last_relay = max(relay_ats, default=float("nan"))
    return messages, {
        "events": len(messages),
        "send_s": round(last_sent - first_sent, 3),
        "events_per_s": round((len(messages) - 1) / (last_sent - first_sent), 1) if last_sent > first_sent else None,
        "all_relayed": relayed,
        "all_handled": handled,
        "drain_s": round(last_relay - last_sent, 3) if relayed else None,
        "relays_per_s": round(len(relay_ats) / (last_relay - first_sent), 1) if relay_ats else None,
        "cpu_sending": cpu_use(cpu_start, cpu_sent),
        "cpu_draining": cpu_use(cpu_sent, cpu_done),
        "bench_loop_lag_ms": lag.figures(),
    }


def direction_figures(messages: Sequence[Message], watcher: Watcher) -> dict[str, Any]:
    """Latency, ack, exactly-once and order of one direction's messages (given in the order they were sent)."""
    latencies: list[float] = []
    missing = duplicates = wrong_place = 0
    for message in messages:
        posts = watcher.posts.get(message.relay_text, [])
        if not posts:
            missing += 1
            continue
        duplicates += len(posts) - 1
        latencies.append((posts[0].at - message.sent) * 1000)
        for post in posts:
            misplaced = (post.channel, post.thread_ts) != (message.relay_channel, message.relay_thread)
            # Relays to the customer go out under the colleague's name; relays to staff under the bot's.
            named = post.username is not None
            wrong_place += misplaced or named != (message.direction == "staff_to_customer")
    by_conversation: dict[int, list[Message]] = {}
    for message in messages:
        by_conversation.setdefault(message.conversation, []).append(message)
    out_of_order_conversations = out_of_order_messages = 0
    for sent in by_conversation.values():
        relayed = [m for m in sent if m.relay_text in watcher.posts]
        order = sorted(relayed, key=lambda m: watcher.posts[m.relay_text][0].n)
        moved = sum(1 for a, b in zip(relayed, order, strict=True) if a is not b)
        out_of_order_conversations += moved > 0
        out_of_order_messages += moved
    acked = [m for m in messages if m.error is None]
    return {
        "messages": len(messages),
        "relayed": len(messages) - missing,
        "latency_ms": summary(latencies),
        "ack_ms": summary([m.ack_ms for m in acked]),
        "non_200_acks": sum(1 for m in messages if m.status != 200),
        "missing": missing,
        "duplicates": duplicates,
        "in_wrong_thread_or_name": wrong_place,
        "exactly_once": missing == 0 and duplicates == 0 and wrong_place == 0,
        "conversations": len(by_conversation),
        "conversations_out_of_order": out_of_order_conversations,
        "messages_out_of_place": out_of_order_messages,
        "order_preserved": out_of_order_conversations == 0,
    }


def by_direction(messages: Sequence[Message], watcher: Watcher, stages: dict[str, dict[str, float]]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for direction in DIRECTIONS:
        mine = [m for m in messages if m.direction == direction]
        figures[direction] = direction_figures(mine, watcher) | {"bot_stages": stage_figures(mine, stages)}
    return figures


def stray_posts(bench: Bench, expected: set[str]) -> dict[str, int]:
    """Posts the bot made that are neither a relay of ours, nor an escalation's notice or case message: a
    relay of something never sent, or a bot answer in a conversation a human has."""
    notice = str(DEFAULTS["escalation_message"].default)
    strays: Counter[str] = Counter()
    for text, posts in bench.watcher.posts.items():
        for post in posts:
            if text in expected:
                continue
            if post.channel == SUPPORT and text == notice:
                continue
            if post.channel == STAFF_CHANNEL and post.thread_ts is None and text.startswith("Case #"):
                continue
            strays[f"{post.channel} {'thread' if post.thread_ts else 'top-level'}: {text[:60]}"] += 1
    notices = len(bench.watcher.posts.get(notice, []))
    if notices != len(bench.conversations):
        strays[f"escalation notices: {notices} for {len(bench.conversations)} escalations"] += 1
    return dict(strays)


def disturbed(figures: dict[str, Any]) -> dict[str, float]:
    """The phases in which the rest of the machine (other processes) used more than OTHERS_WARNING of a core,
    and how much: the bot, Postgres and this process were then short of CPU, and every figure is too slow."""
    phases = {
        "low_load": figures["low_load"]["cpu"],
        "burst_sending": figures["burst"]["cpu_sending"],
        "burst_draining": figures["burst"]["cpu_draining"],
    }
    return {name: other for name, cpu in phases.items() if (other := cpu["other"] or 0.0) > OTHERS_WARNING}


async def stage_times(database_url: str) -> dict[str, dict[str, float]]:
    """Where each relay's time went, by the bot's own timestamps (Postgres's now(): the start of the
    transaction that wrote it), keyed by the ts of the message relayed: received (the ack's transaction) ->
    the turn that took it began -> the outbox sender began the relay's post -> the post was confirmed."""
    received, turn, attempted, sent = (
        m.Inbound.received_at,
        m.Inbound.processed_at,
        m.Outbox.attempted_at,
        m.Outbox.sent_at,
    )

    def ms(later: Any, earlier: Any) -> Any:
        return func.extract("epoch", later - earlier) * 1000

    relay_of = and_(
        m.Outbox.conversation_id == m.Inbound.conversation_id,
        or_(
            and_(m.Outbox.kind == RelayToCustomer.kind, m.Outbox.source_ts == m.Inbound.external_id),
            and_(m.Outbox.kind == RelayToStaff.kind, m.Outbox.text == m.Inbound.text),
        ),
    )
    query = select(m.Inbound.external_id, ms(turn, received), ms(attempted, turn), ms(sent, attempted)).join(
        m.Outbox, relay_of
    )
    engine = create_async_engine(async_url(database_url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(query)).tuples().all()
    finally:
        await engine.dispose()
    return {
        str(ts): {"to_turn": float(a), "turn_to_post": float(b), "post": float(c)}
        for ts, a, b, c in rows
        if ts is not None and None not in (a, b, c)
    }


def stage_figures(messages: Sequence[Message], stages: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    found = [stages[m.ts] for m in messages if m.ts in stages]
    return {
        "received_to_turn_start_ms": summary([s["to_turn"] for s in found]),
        "turn_start_to_post_start_ms": summary([s["turn_to_post"] for s in found]),
        "post_ms": summary([s["post"] for s in found]),
    }


# ------------------------------------------------------------------------------------------------ report


def print_figures(figures: dict[str, Any], params: Params) -> None:
    section("Relay latency: from sending the event to the relayed post, ms")
    rows: list[Sequence[object]] = []
    for phase in ("low_load", "burst"):
        for direction in DIRECTIONS:
            f = figures[phase][direction]
            lat = f["latency_ms"]
            rows.append(
                (
                    f"{phase.replace('_', ' ')}, {LABELS[direction]}",
                    f["messages"],
                    f["relayed"],
                    lat["p50"],
                    lat["p90"],
                    lat["p99"],
                    lat["max"],
                    f["ack_ms"]["p50"],
                    f["ack_ms"]["max"],
                )
            )
    print(table(("load, direction", "sent", "relayed", "p50", "p90", "p99", "max", "ack p50", "ack max"), rows))
    low, burst = figures["low_load"], figures["burst"]
    print(
        f"low load: {2 * params.low_load_per_direction} messages one at a time over {params.conversations} "
        f"conversations; {low['not_handled_within_timeout']} not handled within {params.relay_timeout_s:g} s"
    )
    print("  " + _cpu_line(low["cpu"]) + _lag_line(low["bench_loop_lag_ms"]))
    print(
        f"burst: {burst['events']} events ({params.burst_per_conversation} each way in each of "
        f"{params.conversations} conversations) sent in {burst['send_s']:.2f} s = {burst['events_per_s']} events/s; "
        + (
            f"the last relay came {burst['drain_s']:.2f} s after the last event; {burst['relays_per_s']} relays/s"
            if burst["all_relayed"]
            else f"WARNING: not every message was relayed within {params.drain_timeout_s:g} s"
        )
    )
    print("  while sending:  " + _cpu_line(burst["cpu_sending"]))
    print("  while draining: " + _cpu_line(burst["cpu_draining"]) + _lag_line(burst["bench_loop_lag_ms"]))


def print_stages(figures: dict[str, Any]) -> None:
    section("Where the time went, by the bot's own timestamps (p50 / max, ms)")
    stage_rows: list[Sequence[object]] = []
    for phase in ("low_load", "burst"):
        for direction in DIRECTIONS:
            st = figures[phase][direction]["bot_stages"]
            stage_rows.append(
                (
                    f"{phase.replace('_', ' ')}, {LABELS[direction]}",
                    *(
                        f"{st[k]['p50']:,.1f} / {st[k]['max']:,.1f}"
                        for k in ("received_to_turn_start_ms", "turn_start_to_post_start_ms", "post_ms")
                    ),
                )
            )
    print(table(("load, direction", "received -> turn", "turn -> post", "post"), stage_rows))
    print(
        "(received: the ack's transaction; turn: the start of the turn's transaction; post: from the sender "
        "starting the relay's chat.postMessage to its row marked sent; turn -> post includes the turn itself "
        "and the rows ahead of the relay in its conversation's outbox)"
    )


def print_checks(report: dict[str, Any]) -> None:
    section("Checks")
    figures = report["figures"]
    for phase in ("warm_up", "low_load", "burst"):
        for direction in DIRECTIONS:
            f = figures[phase][direction]
            verdict = "yes" if f["exactly_once"] else "NO"
            order = "yes" if f["order_preserved"] else "NO"
            print(
                f"{phase.replace('_', ' ')}, {LABELS[direction]}: exactly once {verdict} ({f['relayed']} of "
                f"{f['messages']} relayed, {f['missing']} missing, {f['duplicates']} duplicates, "
                f"{f['in_wrong_thread_or_name']} in a wrong thread or under a wrong name); order kept {order} "
                f"({f['conversations_out_of_order']} of {f['conversations']} conversations out of order); "
                f"{f['non_200_acks']} acks not 200"
            )
    strays = report["stray_posts"]
    print(f"other posts by the bot (relays of nothing sent, answers in a human's conversation): {strays or 'none'}")
    db, bot, echoes, log = report["database"], report["bot_metrics"], report["echoes"], report["bot_log"]
    print(
        f"database: slack_events {db['slack_events']}; inbound {db['inbound']} "
        f"({db['inbound_unprocessed']} unprocessed, {db['inbound_claimed_more_than_once']} claimed more than once); "
        f"outbox {db['outbox']} ({db['outbox_unsent']} unsent, {db['outbox_given_up']} given up, "
        f"{db['outbox_rows_sent_more_than_once']} tried more than once)"
    )
    per = db["postgres_per_message"]
    print(
        f"Postgres per inbound message (pg_stat_database over the run): {per['xact_commit']} commits, "
        f"rows inserted {per['tup_inserted']}, updated {per['tup_updated']}, fetched {per['tup_fetched']}"
    )
    print(
        f"bot /metrics: turns {bot['turns']} (mean {bot['mean_turn_ms']} ms), processed {bot['processed']}, "
        f"events {bot['events']}, outbox sent {bot.get('outbox_sent_total')}"
    )
    print(f"echoes of the bot's own posts delivered to it: {echoes['deliveries']}, statuses {echoes['statuses']}")
    if report["failed_web_api_calls"]:
        print(f"failed Web API calls: {report['failed_web_api_calls']}")
    print(f"bot log (WARNING and up): {log['by_level'] or 'none'}")
    for line in log["first"]:
        print(f"  {line[:200]}")


# ------------------------------------------------------------------------------------------------ entry


async def run(server_url: str, database: str, params: Params) -> dict[str, Any]:
    started = time.perf_counter()
    version = await admin(server_url, "SELECT current_setting('server_version')")
    durability = {name: await admin(server_url, f"SELECT current_setting('{name}')") for name in PG_SETTINGS}
    async with (
        throwaway_database(server_url) as url,
        FakeOpenAI() as fake,
        SlackEmulator(signing_secret=SIGNING_SECRET, bot_token=BOT_TOKEN) as emulator,
    ):
        fake.rule = answer
        with tempfile.TemporaryDirectory(prefix="helpdesk-bench-relay-") as tmp:
            async with bot_process(
                url,
                fake,
                emulator,
                Path(tmp),
                max_turns=params.bot_max_turns,
                db_pool_size=params.bot_db_pool_size,
                ack_pool_size=params.bot_ack_pool_size,
                extra_env={"CASE_SUMMARY": "transcript"},
            ) as bot:
                async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                    bench = Bench(
                        params,
                        bot,
                        emulator,
                        Slack(emulator, session, bot.events_url),
                        Watcher(emulator),
                        await find_postmaster(url),
                    )
                    print(
                        f"set-up (database, migrations, fake LLM, emulator, bot process): "
                        f"{time.perf_counter() - started:.1f} s, of which the bot's start {bot.started_s:.1f} s",
                        flush=True,
                    )
                    print(f"Postgres {version}: " + ", ".join(f"{k} {v}" for k, v in durability.items()))
                    setup = await escalate_all(bench)
                    print(
                        f"{setup['conversations']} conversations escalated in {setup['seconds']} s (event to case "
                        f"message p50 {setup['event_to_case_message_ms']['p50']} ms)",
                        flush=True,
                    )
                    warm_messages = await warm_up(bench)
                    with paused_gc():
                        low_messages, low_figures = await low_load(bench)
                    with paused_gc():
                        burst_messages, burst_figures = await burst(bench)
                    metrics = await bot_metrics(bot, session)
                database_figures = await database_state(url)
                stages = await stage_times(url)
            log = bot_log_summary(bot.log)
    bench.watcher.scan()
    expected = {m.relay_text for m in (*warm_messages, *low_messages, *burst_messages)}
    figures = {
        "setup": setup,
        "warm_up": by_direction(warm_messages, bench.watcher, stages),
        "low_load": by_direction(low_messages, bench.watcher, stages) | low_figures,
        "burst": by_direction(burst_messages, bench.watcher, stages) | burst_figures,
    }
    report: dict[str, Any] = {
        "benchmark": "relay",
        "machine": machine(
            database,
            version,
            slack_bolt=slack_bolt.version.__version__,
            aiohttp=aiohttp.__version__,
            postgres_settings=durability,
        ),
        "note": CORES_NOTE.format(cores=os.cpu_count()),
        "parameters": {
            **asdict(params),
            "burst_per_direction": params.burst_per_direction,
            "messages_per_direction": params.low_load_per_direction + params.burst_per_direction,
            "llm": "FakeOpenAI in this process: escalate_to_human for a new conversation; no LLM call on relays",
            "case_summary": "transcript",
            "bot": "python -m bot serve, a separate process; Slack Web API: SlackEmulator in this process",
            "timing": "from just before this process POSTs the signed event to the emulator recording the "
            "relay's chat.postMessage (both time.monotonic() in this process)",
            "bench_process_gc": "cyclic GC paused in this process during the low-load and burst figures",
        },
        "figures": figures,
        "disturbed_by_other_processes": disturbed(figures),
        "stray_posts": stray_posts(bench, expected),
        "database": database_figures,
        "bot_metrics": metrics,
        "echoes": echo_figures(emulator),
        "failed_web_api_calls": dict(bench.watcher.failed),
        "bot_log": log,
    }
    print_figures(figures, params)
    print_stages(figures)
    print_checks(report)
    report["total_s"] = round(time.perf_counter() - started, 1)
    return report


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Run the relay benchmark, print its figures and write `results/relay.json`."""
    quiet()
    params = Params.of(quick)
    print(f"relay benchmark{' (quick)' if quick else ''}: Python {sys.version.split()[0]}")
    print(f"note: {CORES_NOTE.format(cores=os.cpu_count())}; figures are for this machine only", flush=True)
    source = source_version()
    with postgres_server() as (server_url, database):
        report = asyncio.run(run(server_url, database, params))
    report["source"] = source
    return write_report(report, results / "relay.json")
