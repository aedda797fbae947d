"""What the fault scenarios share (`python -m bench faults`): a scene of a throwaway database, the fake LLM and the
Slack emulator, in which real `python -m bot serve` processes start; a wave of customers; their threads' replies."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.texts import Text, Texts
from bench.live import CONNECTIONS, UNLIMITED
from bench.setup import DATABASE_PREFIX
from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI, FakeReply, RecordedRequest, error, reply, slow
from harness.bot import BotProcess, bot_env, bot_process, emulator
from harness.database import throwaway_database
from harness.slack import Sent, deliver, write

CHANNEL = "C_SUPPORT"
LEASE_SECONDS = 10.0
"""Shorter than the default 30 s, to keep the run short; the kill's recovery time scales with it."""
LLM_LATENCY_S = 1.0
QUIET_S = 3.0
"""After the last expected reply: time enough for a duplicate to show up, if one were coming."""
APOLOGY = Texts().get(Text.PROVIDER_FAILURE_MESSAGE)
OVERLOADED = error(503, "overloaded")
TIMEOUT_S = 2.0
"""The bot's OPENAI_TIMEOUT_S in the timeout scenario (60 s by default for a hosted provider)."""
TOO_LATE = slow(3 * TIMEOUT_S, reply("too late"))
"""A reply the bot has stopped waiting for: the provider hangs rather than failing."""
DOWN_S = 3.0
"""How long the database server stays stopped in the restart scenario."""


@dataclass
class Scene:
    database_url: str
    fake: FakeOpenAI
    slack: SlackEmulator
    stack: AsyncExitStack
    logs: Path
    started: int = 0

    async def start(self, *, events: bool = True, **settings: Any) -> BotProcess:
        """One more bot process, with its log in a folder of its own; the emulator then delivers to it, unless
        it must not take Slack's events (a worker: pointing the emulator there even for a moment would lose the
        messages sent meanwhile, 404)."""
        folder, self.started = self.logs / str(self.started), self.started + 1
        env = bot_env(self.database_url, self.fake, self.slack, **UNLIMITED | settings)
        return await self.stack.enter_async_context(bot_process(env, self.slack if events else None, workdir=folder))


@asynccontextmanager
async def scene(server_url: str, logs: Path) -> AsyncIterator[Scene]:
    async with (
        throwaway_database(server_url, DATABASE_PREFIX) as url,
        FakeOpenAI() as fake,
        emulator(connection_limit=CONNECTIONS) as slack,
        AsyncExitStack() as stack,
    ):
        yield Scene(url, fake, slack, stack, logs)


def answer_to(request: RecordedRequest) -> FakeReply:
    return slow(LLM_LATENCY_S, reply(f"answer: {request.last_user}"))


def replies(slack: SlackEmulator, said: Sequence[Sent]) -> list[list[str]]:
    return [[p.text for p in slack.posts(CHANNEL, s.ts)] for s in said]


def tally(slack: SlackEmulator, said: Sequence[Sent]) -> dict[str, Any]:
    """Replies per customer message: each should have exactly one, its own answer (`answer_to`)."""
    threads = replies(slack, said)
    counts = [len(r) for r in threads]
    return {
        "answered": sum(c >= 1 for c in counts),
        "exactly_once": sum(c == 1 for c in counts),
        "twice_or_more": sum(c > 1 for c in counts),
        "unanswered": sum(c == 0 for c in counts),
        "wrong_text": sum(any(t != f"answer: {m.text}" for t in r) for r, m in zip(threads, said, strict=True)),
        "replies_per_thread": dict(Counter(counts)),
    }


async def until(check: Any, timeout_s: float, poll_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll_s)
    return True


def last_post_at(slack: SlackEmulator) -> float | None:
    posts = [c.at for c in slack.calls if c.method == "chat.postMessage" and not c.failed]
    return max(posts) if posts else None


async def mid_wave(s: Scene, label: str, customers: int) -> tuple[list[Sent], float, int, Callable[[], int]]:
    """`customers` write at once; back when a fifth have their answer and the rest are mid-turn (their model calls
    made, their leases held): what was said, when, how many Slack acked, and a count of those answered."""
    said = [write(s.slack, CHANNEL, f"{label} question {i:03d}") for i in range(customers)]
    started = time.monotonic()
    await asyncio.gather(*(deliver(s.slack, m) for m in said))
    acked = sum(m.status == 200 for m in said)

    def answered() -> int:
        return sum(bool(r) for r in replies(s.slack, said))

    await until(lambda: answered() >= customers // 5, 60, poll_s=0.005)
    return said, started, acked, answered
