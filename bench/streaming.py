"""`python -m bench streaming`: how soon a customer sees the answer streamed into the Slack thread (issue 28), against
the answer posted whole (`STREAM_ANSWERS=false`, today's), and what a kill -9 mid-stream leaves in the thread.

The fake model takes 1 s to its first token and writes a word every 150 ms (answers of 40 words: about 6 s of
writing). Conversations one after another, each in a thread of its own, on a fresh `python -m bot serve` per mode
(`bench.live`). Per answer, from its event's delivery: the first words visible (the stream's first text, or the
post) and the whole answer standing (the message final with the answer's text), both from the emulator's record;
the Slack calls each answer cost. Then conversations killed -9 once their stream shows words, a new process started
each time: how many messages the thread ends with, and whether the one left is the answer of record (the new
process's)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import tables
from bench.live import UNLIMITED, Live, live_bot, print_afterwards
from bench.setup import DATABASE_PREFIX, RESULTS, run_benchmark, section, summary, table
from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI, FakeReply, RecordedRequest, reply, slow_words
from harness.bot import BotProcess, bot_env, bot_process, emulator
from harness.database import throwaway_database
from harness.slack import Sent, say

CHANNEL = "C_SUPPORT"
FIRST_TOKEN_S = 1.0
EACH_WORD_S = 0.15
LEASE_S = 2.0
"""A killed process's turn is taken over when its lease runs out: soon, here."""
QUIET_S = 1.0
"""How long a settled thread is watched for a second message, if one were coming."""


@dataclass(frozen=True)
class Params:
    conversations: int
    kills: int
    words: int

    @classmethod
    def of(cls, quick: bool) -> Params:
        return cls(conversations=2, kills=1, words=20) if quick else cls(conversations=10, kills=5, words=40)


@dataclass(frozen=True)
class Killed:
    """What a thread killed mid-stream ended with."""

    kind: str
    """One of "once", "twice_or_more", "half" (what stands is not the whole answer of record, or still streams) and
    "none"."""
    recovery_s: float | None
    """From the kill to the answer of record standing."""
    finished_by: str | None
    """How the preview ended: "stopped" (chat.stopStream), "updated" (chat.update), None (left open)."""


def answer_to(question: str, words: int, attempt: int = 1) -> str:
    """A different answer to each question, and to each attempt at it (the killed run's is not the one of record)."""
    return " ".join([f"Answer {attempt} to {question}:", *(f"word{i}" for i in range(words - 5))]) + "."


def shown(slack: SlackEmulator, thread: str) -> list[tuple[float, str, bool]]:
    """What the thread's bot messages showed, in order: (when, text, final), from streams (their chat.update
    included) and chat.postMessage calls."""
    seen = [
        (s.at, s.text, s.state == "completed")
        for stream in slack.streams(CHANNEL)
        if (msg := slack.message(CHANNEL, stream.ts)) is not None and msg.thread_ts == thread
        for s in stream.shown
    ]
    posted = [
        (c.at, str(c.params.get("text")), True)
        for c in slack.calls_to("chat.postMessage")
        if not c.failed and c.params.get("thread_ts") == thread
    ]
    return sorted(seen + posted)


def first_words(slack: SlackEmulator, thread: str) -> float | None:
    return next((at for at, text, _ in shown(slack, thread) if text), None)


def standing(slack: SlackEmulator, thread: str, answer: str) -> float | None:
    return next((at for at, text, final in shown(slack, thread) if final and text == answer), None)


def rule(words: int, asked: dict[str, list[float]]) -> Callable[[RecordedRequest], FakeReply]:
    """The slow model, noting when each question was asked; a warm-up is answered at once."""

    def answer(request: RecordedRequest) -> FakeReply:
        question = request.last_user
        if question.startswith("warm"):
            return reply("Ready.")
        asked.setdefault(question, []).append(time.monotonic())
        return slow_words(answer_to(question, words, len(asked[question])), FIRST_TOKEN_S, EACH_WORD_S)

    return answer


async def answers(server_url: str, params: Params, *, stream: bool) -> dict[str, Any]:
    asked: dict[str, list[float]] = {}
    async with live_bot(server_url, rule(params.words, asked), {"stream_answers": stream}) as live:
        slack = live.emulator
        warm = await say(slack, CHANNEL, "warm up")
        await live.until(lambda: slack.posts(CHANNEL, warm.ts) != [], 30, "the warm-up's answer")
        calls_before = len(slack.calls)
        said = [await answered(live, f"question {i}", params.words) for i in range(params.conversations)]
        await asyncio.sleep(QUIET_S)
        calls = Counter(c.method for c in slack.calls[calls_before:] if c.method.startswith(("chat.", "assistant.")))
        rows = [
            (s, first_words(slack, s.ts), standing(slack, s.ts, answer_to(s.text, params.words)), asked[s.text][0])
            for s in said
        ]
        messages = sum(len(slack.posts(CHANNEL, s.ts)) for s in said)
    done = [(s, first, whole, at) for s, first, whole, at in rows if first is not None and whole is not None]
    return {
        "answers": len(done),
        "first_words_s": summary([first - s.sent for s, first, _, _ in done]),
        "whole_answer_s": summary([whole - s.sent for s, _, whole, _ in done]),
        "to_model_call_s": summary([at - s.sent for s, _, _, at in done]),
        "first_token_to_first_words_s": summary([first - at - FIRST_TOKEN_S for _, first, _, at in done]),
        "calls_per_answer": {m: round(n / len(said), 2) for m, n in sorted(calls.items())},
        "messages_per_answer": round(messages / len(said), 2),
        "afterwards": live.afterwards,
    }


async def answered(live: Live, question: str, words: int) -> Sent:
    """A question in a thread of its own, once its answer stands."""
    sent, answer = await say(live.emulator, CHANNEL, question), answer_to(question, words)
    await live.until(lambda: standing(live.emulator, sent.ts, answer) is not None, 60, f"the answer in {sent.ts}")
    return sent


async def killed(server_url: str, params: Params) -> dict[str, Any]:
    """Each conversation: its stream shows words, the process is killed -9, a new one takes the turn over."""
    asked: dict[str, list[float]] = {}
    outcomes: list[Killed] = []
    async with (
        throwaway_database(server_url, DATABASE_PREFIX) as url,
        FakeOpenAI() as fake,
        emulator() as slack,
        AsyncExitStack() as bots,
    ):
        fake.rule = rule(params.words, asked)
        env = bot_env(url, fake, slack, lease_seconds=LEASE_S, **UNLIMITED)

        async def start() -> BotProcess:
            return await bots.enter_async_context(bot_process(env, slack))

        bot = await start()
        for i in range(params.kills):
            outcome, bot = await kill_mid_stream(slack, bot, start, f"kill question {i}", asked, params.words)
            outcomes.append(outcome)
        calls = Counter(c.method for c in slack.calls if c.method.startswith(("chat.", "assistant.")))
    counts = Counter(o.kind for o in outcomes)
    return {
        "conversations": params.kills,
        **{k: counts[k] for k in ("once", "twice_or_more", "half", "none")},
        "kill_to_answer_s": summary([o.recovery_s for o in outcomes if o.recovery_s is not None]),
        "previews_finished_by": dict(Counter(str(o.finished_by) for o in outcomes)),
        "calls_per_answer": {m: round(n / params.kills, 2) for m, n in sorted(calls.items())},
        "lease_seconds": LEASE_S,
    }


async def kill_mid_stream(
    slack: SlackEmulator,
    bot: BotProcess,
    start: Callable[[], Awaitable[BotProcess]],
    question: str,
    asked: dict[str, list[float]],
    words: int,
) -> tuple[Killed, BotProcess]:
    """What the thread ended with, and the new process."""
    sent = await say(slack, CHANNEL, question)
    await slack.wait_for(lambda: first_words(slack, sent.ts) is not None, timeout=30)
    await bot.kill()
    kill_at = time.monotonic()
    bot = await start()
    with contextlib.suppress(TimeoutError):
        await slack.wait_for(lambda: len(asked[question]) > 1, timeout=30)
    record = answer_to(question, words, len(asked[question]))
    with contextlib.suppress(TimeoutError):
        await slack.wait_for(lambda: standing(slack, sent.ts, record) is not None, timeout=60)
    await asyncio.sleep(QUIET_S)
    at = standing(slack, sent.ts, record)
    posts = slack.posts(CHANNEL, sent.ts)
    final = all(slack.stream_state(CHANNEL, p.ts) in (None, "completed") for p in posts)
    if len(posts) > 1:
        kind = "twice_or_more"
    elif not posts:
        kind = "none"
    else:
        kind = "once" if posts[0].text == record and final else "half"
    ended = next((s.ended for s in slack.streams(CHANNEL) if s.ts in {p.ts for p in posts}), None)
    return Killed(kind, None if at is None else at - kill_at, ended), bot


async def run(server_url: str, params: Params) -> dict[str, Any]:
    result: dict[str, Any] = {
        "parameters": asdict(params) | {"first_token_s": FIRST_TOKEN_S, "each_word_s": EACH_WORD_S}
    }
    for key, stream, title in (("streamed", True, "streamed"), ("today", False, "posted whole (STREAM_ANSWERS=false)")):
        section(f"{params.conversations} answers {title}")
        result[key] = await answers(server_url, params, stream=stream)
        print_afterwards(result[key]["afterwards"])
        figures = {k: v for k, v in result[key].items() if k != "afterwards"}
        print(figures, flush=True)
    section(f"{params.kills} conversations killed -9 mid-stream")
    result["killed"] = await killed(server_url, params)
    print(result["killed"], flush=True)
    streamed, today = result["streamed"], result["today"]
    result["first_words_vs_first_token"] = round(streamed["first_words_s"]["p50"] / FIRST_TOKEN_S, 2)
    result["first_words_vs_whole_today"] = round(streamed["first_words_s"]["p50"] / today["whole_answer_s"]["p50"], 2)
    section("summary")
    summed = tables.streaming(result)
    print(table(summed.headers, summed.rows))
    return result


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Run the streaming benchmark, print its figures and write `results/streaming.json`."""
    params = Params.of(quick)
    return run_benchmark("streaming", quick, results, lambda url: run(url, params))
