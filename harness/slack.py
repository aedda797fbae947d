"""Slack's side of a conversation with the bot: what users write, delivered as signed events through the
emulator (timed, for the benchmarks), and what the bot did, read from the emulator's record of its Web API
calls (waited for, for the tests; followed incrementally by a `Watcher`, for the benchmarks)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bot.playground.slack_emulator import SlackEmulator


async def replies_in(emulator: SlackEmulator, channel: str, thread_ts: str, n: int, wait_s: float = 10) -> list[str]:
    """The texts of the bot's posts in a thread, once there are at least `n`."""
    posts = await emulator.wait_for(
        lambda: (p := emulator.posts(channel, thread_ts)) and len(p) >= n and p, timeout=wait_s
    )
    return [p.text for p in posts]


@dataclass
class Sent:
    """A message a user wrote, and its signed `message` event's delivery (times: time.monotonic())."""

    channel: str
    text: str
    ts: str
    thread_ts: str
    """The thread's root (the message itself when top-level)."""
    envelope: dict[str, Any] = field(repr=False)
    scheduled: float = 0.0
    sent: float = 0.0
    acked: float = 0.0
    status: int = 0
    """0 when no HTTP answer came (see error)."""
    error: str | None = None

    @property
    def ack_ms(self) -> float:
        return (self.acked - self.sent) * 1000


def write(
    emulator: SlackEmulator, channel: str, text: str, *, user: str = "U_CUSTOMER", thread_ts: str | None = None
) -> Sent:
    """The message stored in the emulator (so the bot can read the thread back); its event not sent yet."""
    msg = emulator.add_message(channel, text, user=user, thread_ts=thread_ts)
    return Sent(channel, text, msg.ts, thread_ts or msg.ts, emulator.message_event(msg))


async def deliver(emulator: SlackEmulator, sent: Sent) -> Sent:
    """Send the message's event to the bot, signed; a failed request is recorded, not raised."""
    sent.sent = time.monotonic()
    try:
        sent.status = (await emulator.deliver(sent.envelope)).status
    except (aiohttp.ClientError, TimeoutError) as exc:
        sent.error = repr(exc)
    sent.acked = time.monotonic()
    return sent


async def say(
    emulator: SlackEmulator, channel: str, text: str, *, user: str = "U_CUSTOMER", thread_ts: str | None = None
) -> Sent:
    """`write`, then `deliver` at once."""
    sent = write(emulator, channel, text, user=user, thread_ts=thread_ts)
    sent.scheduled = time.monotonic()
    return await deliver(emulator, sent)


@dataclass(frozen=True)
class Post:
    """A chat.postMessage as the emulator recorded it: the n-th call, at `at` (time.monotonic())."""

    n: int
    at: float
    channel: str
    thread_ts: str | None
    username: str | None
    text: str


Reaction = tuple[str, str, str]
"""(reactions.add or reactions.remove, the message's ts, the reaction's name)."""


@dataclass
class Watcher:
    """Follows the emulator's record of Web API calls (a list that only grows) without reading it twice.
    Posts are kept by text: where every text sent is unique, a second post of one text is a duplicate."""

    emulator: SlackEmulator
    seen: int = 0
    posts: dict[str, list[Post]] = field(default_factory=dict)
    reactions: dict[Reaction, float] = field(default_factory=dict)
    """When each was first recorded."""
    updates: Counter[str] = field(default_factory=Counter)
    """chat.update calls by the ts of the message updated."""
    failed: Counter[str] = field(default_factory=Counter)
    awaited_posts: set[str] = field(default_factory=set)
    awaited_reactions: set[Reaction] = field(default_factory=set)
    """What is still awaited (see `expect`), so that waiting for many costs nothing per look."""

    def expect(self, *, post: str | None = None, reaction: Reaction | None = None) -> None:
        if post is not None:
            self.awaited_posts.add(post)
        if reaction is not None:
            self.awaited_reactions.add(reaction)

    def scan(self) -> None:
        calls = self.emulator.calls
        for n in range(self.seen, len(calls)):
            call, params = calls[n], calls[n].params
            if call.failed:
                self.failed[f"{call.method}: {call.error}"] += 1
            elif call.method == "chat.postMessage":
                text, thread, name = str(params.get("text")), params.get("thread_ts"), params.get("username")
                where = (str(params.get("channel")), None if thread is None else str(thread))
                self.posts.setdefault(text, []).append(Post(n, call.at, *where, name and str(name), text))
                self.awaited_posts.discard(text)
            elif call.method == "chat.update":
                self.updates[str(params.get("ts"))] += 1
            elif call.method in ("reactions.add", "reactions.remove"):
                key = (call.method, str(params.get("timestamp")), str(params.get("name")))
                self.reactions.setdefault(key, call.at)
                self.awaited_reactions.discard(key)
        self.seen = len(calls)

    def posted_at(self, text: str) -> float | None:
        posts = self.posts.get(text)
        return posts[0].at if posts else None

    async def until(
        self,
        done: Callable[[], bool],
        timeout_s: float,
        what: str,
        *,
        poll_s: float = 0.001,
        alive: Callable[[], None] = lambda: None,
    ) -> bool:
        """Scan until `done()`; False on timeout (`alive` raises when the bot died meanwhile)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.scan()
            if done():
                return True
            alive()
            if time.monotonic() >= deadline:
                print(f"WARNING: gave up waiting after {timeout_s:.0f} s for {what}", flush=True)
                return False
            await asyncio.sleep(poll_s)
