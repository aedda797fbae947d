"""`python -m bench streaming`: how soon a customer sees the answer streamed into the Slack thread and into the Teams
personal chat (issue 28), against the answer posted whole (`STREAM_ANSWERS=false`, today's), and what a kill -9
mid-stream leaves there.

The fake model takes 1 s to its first token and writes a word every 150 ms (answers of 40 words: about 6 s of
writing). Per mode, one `python -m bot serve` serving both platforms (`bench.live`): conversations one after
another, first in Slack (each in a thread of its own), then in Teams (each in a new customer's personal chat). Per
answer, from the customer's message's delivery: the first words visible (the stream's first text, not Teams'
informative line, or the post) and the whole answer standing (the message final with the answer's text), both from
the emulators' records; the platform calls each answer cost. Then conversations killed -9 once their stream shows
words, a new process started each time: how many messages the thread or chat ends with, and whether the one left is
the answer of record (the new process's)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from bench import tables
from bench.live import UNLIMITED, Live, live_bot, print_afterwards
from bench.setup import DATABASE_PREFIX, RESULTS, run_benchmark, section, summary, table
from bot.playground.slack_emulator import SlackEmulator
from bot.playground.waiting import poll
from fakes.openai_server import FakeOpenAI, FakeReply, RecordedRequest, reply, slow_words
from fakes.teams_api import ConnectorCall, StreamType, TeamsEmulator
from harness import teams as th
from harness.bot import BotProcess, bot_env, bot_process, emulator
from harness.database import throwaway_database
from harness.slack import say

CHANNEL = "C_SUPPORT"
FIRST_TOKEN_S = 1.0
EACH_WORD_S = 0.15
LEASE_S = 2.0
"""A killed process's turn is taken over when its lease runs out: soon, here."""
QUIET_S = 1.0
"""How long a settled thread is watched for a second message, if one were coming."""

Seen = tuple[float, str, bool]
"""(when, text, final): what a thread or chat showed of the bot's answer at one moment."""


@dataclass(frozen=True)
class Params:
    conversations: int
    kills: int
    words: int

    @classmethod
    def of(cls, quick: bool) -> Params:
        return cls(conversations=2, kills=1, words=20) if quick else cls(conversations=10, kills=5, words=40)


@dataclass(frozen=True)
class Asked:
    """A customer's question, delivered: `where` names its thread (Slack) or personal chat (Teams)."""

    text: str
    where: str
    sent: float


@dataclass(frozen=True)
class Killed:
    """What a thread killed mid-stream ended with."""

    kind: str
    """One of "once", "twice_or_more", "half" (what stands is not the whole answer of record, or still streams) and
    "none"."""
    recovery_s: float | None
    """From the kill to the answer of record standing."""
    finished_by: str | None
    """How the preview ended: Slack's "stopped" (chat.stopStream) or "updated" (chat.update); Teams' "final" (the
    stream's final message) or "posted" (a message of its own); None (left open)."""


class Surface(Protocol):
    """One platform as the benchmark drives and reads it: a question in a conversation of its own, and what the
    customer saw there, from the emulator's record."""

    @property
    def name(self) -> str: ...

    async def ask(self, question: str, n: int) -> Asked:
        """`question` from customer `n` in a conversation of its own."""
        ...

    def seen(self, where: str) -> list[Seen]: ...

    def standing_messages(self, where: str) -> list[tuple[str, bool]]:
        """The bot's messages that stand in the conversation: (text, final)."""
        ...

    def finished_by(self, where: str) -> str | None: ...

    def call_kinds(self) -> list[str]:
        """Every platform call so far, by kind."""
        ...


@dataclass
class SlackSurface:
    slack: SlackEmulator
    name: str = "Slack"

    async def ask(self, question: str, n: int) -> Asked:
        sent = await say(self.slack, CHANNEL, question)
        return Asked(question, sent.ts, sent.sent)

    def seen(self, where: str) -> list[Seen]:
        """From streams (their chat.update included) and chat.postMessage calls."""
        streamed = [
            (s.at, s.text, s.state == "completed")
            for stream in self.slack.streams(CHANNEL)
            if (msg := self.slack.message(CHANNEL, stream.ts)) is not None and msg.thread_ts == where
            for s in stream.shown
        ]
        posted = [
            (c.at, str(c.params.get("text")), True)
            for c in self.slack.calls_to("chat.postMessage")
            if not c.failed and c.params.get("thread_ts") == where
        ]
        return sorted(streamed + posted)

    def standing_messages(self, where: str) -> list[tuple[str, bool]]:
        return [
            (p.text, self.slack.stream_state(CHANNEL, p.ts) in (None, "completed"))
            for p in self.slack.posts(CHANNEL, where)
        ]

    def finished_by(self, where: str) -> str | None:
        posts = {p.ts for p in self.slack.posts(CHANNEL, where)}
        return next((s.ended for s in self.slack.streams(CHANNEL) if s.ts in posts), None)

    def call_kinds(self) -> list[str]:
        return [c.method for c in self.slack.calls if c.method.startswith(("chat.", "assistant."))]


@dataclass
class TeamsSurface:
    teams: TeamsEmulator
    name: str = "Teams"

    async def ask(self, question: str, n: int) -> Asked:
        customer = self.teams.add_user(f"29:stream-{n}", f"Customer{n} Streaming")
        sent = await th.personal(self.teams, question, user=customer.id)
        if sent.status != 200:
            raise RuntimeError(f"the bot answered the activity {sent.status} ({sent.error})")
        return Asked(question, sent.conversation_id, sent.sent)

    def seen(self, where: str) -> list[Seen]:
        """From the chat's streams (their informative lines aside: no answer in them) and the messages posted
        whole (a stream's final message is one of its updates, and has the stream's id)."""
        streamed = [
            (s.at, s.text, s.kind == StreamType.FINAL)
            for s in self.teams.shown_in(where)
            if s.kind != StreamType.INFORMATIVE
        ]
        posted = [(m.at, m.text, True) for m in self.teams.posts(where) if m.id not in self.teams.streams]
        return sorted(streamed + posted)

    def standing_messages(self, where: str) -> list[tuple[str, bool]]:
        """Its messages, and a stream never finished that showed words: Teams leaves what it showed."""
        posted = [(m.text, True) for m in self.teams.posts(where) if not m.deleted]
        streams = self.teams.streams.values()
        left = [(s.text, False) for s in streams if s.conversation_id == where and not s.final and s.text]
        return posted + left

    def finished_by(self, where: str) -> str | None:
        posts = self.teams.posts(where)
        if any(m.id in self.teams.streams for m in posts):
            return "final"
        return "posted" if posts else None

    def call_kinds(self) -> list[str]:
        return [teams_call(c) for c in self.teams.calls]


def teams_call(call: ConnectorCall) -> str:
    """A Bot Connector call's kind: the operation, with a sent activity's stream type (or its own type), and the
    status when refused (`send streaming 429`)."""
    data = call.body.get("channelData")
    stream = data.get("streamType") if isinstance(data, dict) else None
    kind = f"{call.op} {stream or call.body.get('type')}" if call.body.get("type") else str(call.op)
    return f"{kind} {call.status}" if call.failed else kind


def answer_to(question: str, words: int, attempt: int = 1) -> str:
    """A different answer to each question, and to each attempt at it (the killed run's is not the one of record)."""
    return " ".join([f"Answer {attempt} to {question}:", *(f"word{i}" for i in range(words - 5))]) + "."


def first_words(seen: list[Seen]) -> float | None:
    return next((at for at, text, _ in seen if text), None)


def standing(seen: list[Seen], answer: str) -> float | None:
    return next((at for at, text, final in seen if final and text == answer), None)


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
    """Slack's figures, then Teams' (under "teams"), from one process serving both."""
    asked: dict[str, list[float]] = {}
    async with live_bot(server_url, rule(params.words, asked), {"stream_answers": stream}, teams=True) as live:
        assert live.teams is not None
        slack, teams = SlackSurface(live.emulator), TeamsSurface(live.teams)
        result = await figures(live, slack, params, asked)
        result["teams"] = await figures(live, teams, params, asked)
    return result | {"afterwards": live.afterwards}


async def figures(live: Live, surface: Surface, params: Params, asked: dict[str, list[float]]) -> dict[str, Any]:
    """`params.conversations` answers one after another, after a warm-up (the first call to a platform pays for
    its clients and tokens)."""
    warm = await surface.ask(f"warm up {surface.name}", 0)
    await live.until(lambda: surface.standing_messages(warm.where) != [], 30, f"the {surface.name} warm-up's answer")
    calls_before = len(surface.call_kinds())
    said = [
        await answered(live, surface, f"{surface.name} question {i}", i + 1, params.words)
        for i in range(params.conversations)
    ]
    await asyncio.sleep(QUIET_S)
    calls = Counter(surface.call_kinds()[calls_before:])
    rows = []
    for s in said:
        seen = surface.seen(s.where)
        rows.append((s, first_words(seen), standing(seen, answer_to(s.text, params.words)), asked[s.text][0]))
    messages = sum(len(surface.standing_messages(s.where)) for s in said)
    done = [(s, first, whole, at) for s, first, whole, at in rows if first is not None and whole is not None]
    return {
        "answers": len(done),
        "first_words_s": summary([first - s.sent for s, first, _, _ in done]),
        "whole_answer_s": summary([whole - s.sent for s, _, whole, _ in done]),
        "to_model_call_s": summary([at - s.sent for s, _, _, at in done]),
        "first_token_to_first_words_s": summary([first - at - FIRST_TOKEN_S for _, first, _, at in done]),
        "calls_per_answer": {m: round(n / len(said), 2) for m, n in sorted(calls.items())},
        "messages_per_answer": round(messages / len(said), 2),
    }


async def answered(live: Live, surface: Surface, question: str, n: int, words: int) -> Asked:
    """A question in a conversation of its own, once its answer stands."""
    asked, answer = await surface.ask(question, n), answer_to(question, words)

    def done() -> bool:
        return standing(surface.seen(asked.where), answer) is not None

    await live.until(done, 60, f"the answer in {asked.where}")
    return asked


async def killed(server_url: str, params: Params) -> dict[str, Any]:
    """Each conversation (Slack's, then Teams'): its stream shows words, the process is killed -9, a new one takes
    the turn over. Slack's figures, with Teams' under "teams"."""
    asked: dict[str, list[float]] = {}
    async with (
        throwaway_database(server_url, DATABASE_PREFIX) as url,
        FakeOpenAI() as fake,
        emulator() as slack,
        th.emulator() as teams,
        AsyncExitStack() as bots,
    ):
        fake.rule = rule(params.words, asked)
        settings = UNLIMITED | th.teams_settings(teams)
        env = bot_env(url, fake, slack, lease_seconds=LEASE_S, **settings) | teams.env()

        async def start() -> BotProcess:
            bot = await bots.enter_async_context(bot_process(env, slack))
            teams.messaging_url = f"{bot.url}/api/messages"
            return bot

        bot = await start()
        result: dict[str, dict[str, Any]] = {}
        for surface in (SlackSurface(slack), TeamsSurface(teams)):
            outcomes: list[Killed] = []
            for i in range(params.kills):
                question = f"{surface.name} kill question {i}"
                outcome, bot = await kill_mid_stream(surface, bot, start, question, i + 1, asked, params.words)
                outcomes.append(outcome)
            result[surface.name] = outcomes_of(outcomes, Counter(surface.call_kinds()), params.kills)
    return result["Slack"] | {"teams": result["Teams"]}


def outcomes_of(outcomes: list[Killed], calls: Counter[str], kills: int) -> dict[str, Any]:
    counts = Counter(o.kind for o in outcomes)
    return {
        "conversations": kills,
        **{k: counts[k] for k in ("once", "twice_or_more", "half", "none")},
        "kill_to_answer_s": summary([o.recovery_s for o in outcomes if o.recovery_s is not None]),
        "previews_finished_by": dict(Counter(str(o.finished_by) for o in outcomes)),
        "calls_per_answer": {m: round(n / kills, 2) for m, n in sorted(calls.items())},
        "lease_seconds": LEASE_S,
    }


async def kill_mid_stream(
    surface: Surface,
    bot: BotProcess,
    start: Callable[[], Awaitable[BotProcess]],
    question: str,
    n: int,
    asked: dict[str, list[float]],
    words: int,
) -> tuple[Killed, BotProcess]:
    """What the conversation ended with, and the new process."""
    said = await surface.ask(question, n)
    await settled(lambda: first_words(surface.seen(said.where)) is not None, 30)
    await bot.kill()
    kill_at = time.monotonic()
    bot = await start()
    await settled(lambda: len(asked[question]) > 1, 30)
    record = answer_to(question, words, len(asked[question]))
    await settled(lambda: standing(surface.seen(said.where), record) is not None, 60)
    await asyncio.sleep(QUIET_S)
    at = standing(surface.seen(said.where), record)
    messages = surface.standing_messages(said.where)
    if len(messages) > 1:
        kind = "twice_or_more"
    elif not messages:
        kind = "none"
    else:
        kind = "once" if messages[0] == (record, True) else "half"
    return Killed(kind, None if at is None else at - kill_at, surface.finished_by(said.where)), bot


async def settled(done: Callable[[], bool], timeout_s: float) -> None:
    """Until `done()` or the timeout, which the outcome then shows."""
    with contextlib.suppress(TimeoutError):
        await poll(done, timeout_s, lambda: "")


async def run(server_url: str, params: Params) -> dict[str, Any]:
    result: dict[str, Any] = {
        "parameters": asdict(params) | {"first_token_s": FIRST_TOKEN_S, "each_word_s": EACH_WORD_S}
    }
    for key, stream, title in (("streamed", True, "streamed"), ("today", False, "posted whole (STREAM_ANSWERS=false)")):
        section(f"{params.conversations} answers {title}, in Slack and in Teams")
        result[key] = await answers(server_url, params, stream=stream)
        print_afterwards(result[key]["afterwards"])
        print({k: v for k, v in result[key].items() if k != "afterwards"}, flush=True)
    section(f"{params.kills} conversations killed -9 mid-stream, in Slack and in Teams")
    result["killed"] = await killed(server_url, params)
    print(result["killed"], flush=True)
    teams = {k: result[k].pop("teams") for k in ("streamed", "today", "killed")}
    result["teams"] = teams | ratios(teams)
    result |= ratios(result)
    section("summary")
    summed = tables.streaming(result)
    print(table(summed.headers, summed.rows))
    return result


def ratios(result: dict[str, Any]) -> dict[str, float]:
    streamed, today = result["streamed"], result["today"]
    return {
        "first_words_vs_first_token": round(streamed["first_words_s"]["p50"] / FIRST_TOKEN_S, 2),
        "first_words_vs_whole_today": round(streamed["first_words_s"]["p50"] / today["whole_answer_s"]["p50"], 2),
    }


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Run the streaming benchmark, print its figures and write `results/streaming.json`."""
    params = Params.of(quick)
    return run_benchmark("streaming", quick, results, lambda url: run(url, params))
