"""Benchmark of the Slack edge: the real bot as its own process (`python -m bot serve`), fed signed Events API
requests by this process, which also plays Slack's Web API (the emulator) and the LLM (answering at once
with "re: <the customer's message>"); see `bench.live`.

Figures
    sequential   one message at a time, each sent once the previous one is fully handled: the ack, and the
                 time from sending the event to the bot's Web API calls for it as the emulator records them
                 (the working reaction, the reply post, the done reaction)
    burst        message events fired on an open-loop schedule (each at its own time, whatever the earlier
                 ones are doing) over many threads: the ack latency (what Slack's 3-second deadline
                 applies to), the time the bot then needs to answer everything (drain), each event's
                 time to reply, and whether every event got exactly one reply, in its thread

The phases drive a platform through `Chats` (Slack's is `SlackChats`; `bench.teams` runs them for Teams too).

BENCH_SPLIT=1 runs two bot processes: PROCESS_ROLE=web receives and acknowledges, PROCESS_ROLE=worker runs
the turns and the outbox.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aiohttp
import slack_bolt

from bench.live import CORES_NOTE, Live, LoopLag, cpu_line, cpu_use, disturbed, live_bot, paused_gc, print_afterwards
from bench.setup import RESULTS, run_benchmark, section, summary, summary_rows
from bot.settings import Settings
from fakes.openai_server import FakeReply, RecordedRequest, reply
from harness.slack import Sent, deliver, write

CHANNEL = "C_SUPPORT"
SLACK_ACK_DEADLINE_S = 3.0
"""Slack retries an Events API delivery that is not acknowledged within 3 seconds."""
WORKING = str(Settings.model_fields["working_reaction"].default)
DONE = str(Settings.model_fields["done_reaction"].default)


@dataclass(frozen=True)
class Params:
    quick: bool
    rate_per_s: float
    burst_s: float
    threads: int
    sequential_messages: int
    warmup_messages: int
    drain_timeout_s: float
    quiet_s: float
    """After everything is answered: how long to keep watching for duplicate replies."""
    messages_per_thread: int = 5
    """Sequential figure: messages per thread (the first one top-level, the others replies)."""
    split: bool = False

    @classmethod
    def of(cls, quick: bool) -> Params:
        split = os.environ.get("BENCH_SPLIT") == "1"
        if quick:
            return cls(True, rate_per_s=100, burst_s=3, threads=100, sequential_messages=30, warmup_messages=10,
                       drain_timeout_s=60, quiet_s=0.5, split=split)  # fmt: skip
        return cls(False, rate_per_s=200, burst_s=10, threads=200, sequential_messages=100, warmup_messages=20,
                   drain_timeout_s=75, quiet_s=1.0, split=split)  # fmt: skip

    @property
    def events(self) -> int:
        return round(self.rate_per_s * self.burst_s)


def answer(request: RecordedRequest) -> FakeReply:
    return reply(reply_text(request.last_user))


def reply_text(text: str) -> str:
    return f"re: {text}"


# ------------------------------------------------------------------------------------------------ platforms


class Timed(Protocol):
    """A customer's message as a platform's harness records its delivery (times: time.monotonic())."""

    scheduled: float
    sent: float
    status: int
    """0 when no HTTP answer came (see error)."""
    error: str | None

    @property
    def ack_ms(self) -> float: ...


M = TypeVar("M", bound=Timed)


@dataclass(frozen=True)
class Mark:
    """Something the bot does for every message, timed from sending it: `event_to_<key>_ms` in the figures."""

    key: str
    label: str
    optional: bool = False
    """The bot may leave it out (counted as `<key>s_skipped`)."""


class Chats(Protocol[M]):
    """A platform's customers as the phases drive them, and what the bot did, read from its emulator's record."""

    @property
    def name(self) -> str: ...

    @property
    def ack_deadline_s(self) -> float: ...

    @property
    def marks(self) -> tuple[Mark, ...]:
        """In the order the bot does them; the last one means it is done with the message."""
        ...

    async def write(self, text: str, root: M | None) -> M:
        """A message built, not delivered: it starts a conversation (a thread) when `root` is None, else it
        continues `root`'s."""
        ...

    async def deliver(self, message: M) -> M: ...

    def text(self, message: M) -> str:
        """What the customer wrote (what the fake LLM answers)."""
        ...

    def marked(self, message: M) -> dict[str, float | None]:
        """When each mark was first recorded (None: not yet)."""
        ...

    def replies(self, message: M) -> list[tuple[float, bool]]:
        """The bot's posts of the reply to `message`: when, and whether in its conversation (thread)."""
        ...

    def expect(self, message: M) -> None:
        """Its reply is awaited (see `awaited`)."""
        ...

    def awaited(self) -> bool:
        """Some expected reply has not been posted yet."""
        ...

    async def after_burst(self, live: Live, sent: list[M], replied: bool, last_sent: float) -> dict[str, Any]:
        """The platform's own burst figures, once every reply was posted (or the wait gave up)."""
        ...


@dataclass(frozen=True)
class SlackChats:
    """Customers writing in one Slack channel; the bot's working and done reactions on their messages."""

    live: Live
    name: str = "Slack"
    ack_deadline_s: float = SLACK_ACK_DEADLINE_S
    marks: tuple[Mark, ...] = (
        # No working reaction when the reply was ready before the sender got to it (the outbox skips it).
        Mark("working_reaction", f"the :{WORKING}: reaction", optional=True),
        Mark("reply", "the reply post"),
        Mark("done_reaction", f"the :{DONE}: reaction"),
    )

    async def write(self, text: str, root: Sent | None) -> Sent:
        return write(self.live.emulator, CHANNEL, text, thread_ts=None if root is None else root.thread_ts)

    async def deliver(self, message: Sent) -> Sent:
        return await deliver(self.live.emulator, message)

    def text(self, message: Sent) -> str:
        return message.text

    def marked(self, message: Sent) -> dict[str, float | None]:
        reactions = self.live.watcher.reactions
        return {
            "working_reaction": reactions.get(("reactions.add", message.ts, WORKING)),
            "reply": self.live.watcher.posted_at(reply_text(message.text)),
            "done_reaction": reactions.get(("reactions.add", message.ts, DONE)),
        }

    def replies(self, message: Sent) -> list[tuple[float, bool]]:
        posts = self.live.watcher.posts.get(reply_text(message.text), [])
        return [(p.at, p.thread_ts == message.thread_ts) for p in posts]

    def expect(self, message: Sent) -> None:
        self.live.watcher.expect(post=reply_text(message.text), reaction=("reactions.add", message.ts, DONE))

    def awaited(self) -> bool:
        return bool(self.live.watcher.awaited_posts)

    async def after_burst(self, live: Live, sent: list[Sent], replied: bool, last_sent: float) -> dict[str, Any]:
        watcher = live.watcher
        finished = replied and await live.until(lambda: not watcher.awaited_reactions, 10, "every done", 0.005)
        done_ats = [at for s in sent if (at := self.marked(s)["done_reaction"]) is not None]
        return {
            "all_done_reactions": finished,
            "done_drain_s": round(max(done_ats) - last_sent, 2) if finished else None,
        }


# ------------------------------------------------------------------------------------------------ figures


def answered(chats: Chats[M], message: M) -> bool:
    return chats.marked(message)[chats.marks[-1].key] is not None


async def warm_up(live: Live, chats: Chats[M], params: Params) -> None:
    """A few messages in two conversations so that the bot's pools, Bolt's auth.test and the code paths are
    warm; also checks that replies come back as expected, since the figures match replies to events by text."""
    roots: list[M | None] = [None, None]
    for i in range(params.warmup_messages):
        message = await chats.write(f"warm-up message {i}", roots[i % 2])
        roots[i % 2] = roots[i % 2] or message
        message.scheduled = time.monotonic()
        await chats.deliver(message)
        if message.status != 200:
            raise RuntimeError(f"warm-up message answered {message.status} {message.error or ''}")
        if not await live.until(partial(answered, chats, message), 15, "a warm-up reply"):
            raise RuntimeError(f"no reply {reply_text(chats.text(message))!r} to the warm-up: {chats.marked(message)}")


async def sequential(live: Live, chats: Chats[M], params: Params) -> dict[str, Any]:
    """One message at a time; the next one leaves when the bot is done with the previous one."""
    rows: list[dict[str, float]] = []
    root: M | None = None
    lost = not_ok = 0
    before = live.cpu()
    with LoopLag() as lag:
        for i in range(params.sequential_messages):
            if i % params.messages_per_thread == 0:
                root = None
            message = await chats.write(f"sequential message {i}: where is my order?", root)
            root = root or message
            message.scheduled = time.monotonic()
            await chats.deliver(message)
            not_ok += message.status != 200
            if not await live.until(partial(answered, chats, message), 10, f"message {i}"):
                lost += 1
                continue
            at = {k: (v - message.sent) * 1000 for k, v in chats.marked(message).items() if v is not None}
            rows.append({"ack": message.ack_ms} | at)
    figures: dict[str, Any] = {
        "messages": params.sequential_messages,
        "answered": len(rows),
        "not_answered_within_10s": lost,
        "non_200_acks": not_ok,
        "ack_ms": summary([r["ack"] for r in rows]),
    }
    for mark in chats.marks:
        figures[f"event_to_{mark.key}_ms"] = summary([r[mark.key] for r in rows if mark.key in r])
        if mark.optional:
            figures[f"{mark.key}s_skipped"] = sum(1 for r in rows if mark.key not in r)
    return figures | {"cpu": cpu_use(before, live.cpu()), "bench_loop_lag_ms": lag.figures()}


async def burst(live: Live, chats: Chats[M], params: Params) -> dict[str, Any]:
    """Open loop: message i leaves at start + i / rate, whether or not the earlier ones were answered."""
    roots: dict[int, M] = {}
    sent_all: list[M] = []
    tasks: list[asyncio.Task[M]] = []
    deadline = f"acks_over_{chats.ack_deadline_s:g}s"
    with LoopLag() as lag:
        cpu_start = live.cpu()
        start = time.monotonic() + 0.05
        for i in range(params.events):
            scheduled = start + i / params.rate_per_s
            if (delay := scheduled - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            thread = i % params.threads
            message = await chats.write(f"burst message {i} in thread {thread}: where is my order?", roots.get(thread))
            roots.setdefault(thread, message)
            message.scheduled = scheduled
            sent_all.append(message)
            chats.expect(message)
            tasks.append(asyncio.create_task(chats.deliver(message)))
        await asyncio.gather(*tasks)
        cpu_sent = live.cpu()
        first_sent, last_sent = min(s.sent for s in sent_all), max(s.sent for s in sent_all)
        replied = await live.until(lambda: not chats.awaited(), params.drain_timeout_s, "every reply", 0.005)
        own = await chats.after_burst(live, sent_all, replied, last_sent)
        cpu_done = live.cpu()
    await asyncio.sleep(params.quiet_s)  # room for a duplicate to show up, if one were coming
    live.watcher.scan()

    acked = [s for s in sent_all if s.error is None]
    posts = [chats.replies(s) for s in sent_all]
    counts = [len(p) for p in posts]
    wrong_thread = sum(1 for p in posts for _, in_thread in p if not in_thread)
    to_reply = [(p[0][0] - s.sent) * 1000 for s, p in zip(sent_all, posts, strict=True) if p]
    last_reply = max((p[0][0] for p in posts if p), default=float("nan"))
    top_level = len(roots)
    return {
        "exactly_once": all(c == 1 for c in counts) and wrong_thread == 0,
        "events": len(sent_all),
        "threads": len(roots),
        "top_level_messages": top_level,
        "thread_replies": len(sent_all) - top_level,
        "send_s": round(last_sent - first_sent, 3),
        "achieved_rate_per_s": round((len(sent_all) - 1) / (last_sent - first_sent), 1),
        "send_lag_ms": summary([(s.sent - s.scheduled) * 1000 for s in sent_all]),
        "ack_ms": summary([s.ack_ms for s in acked]),
        "acks": len(acked),
        "non_200_acks": sum(1 for s in acked if s.status != 200),
        "statuses": dict(Counter(str(s.status) for s in acked)),
        "errors": dict(Counter((s.error or "")[:120] for s in sent_all if s.error)),
        deadline: sum(1 for s in acked if s.ack_ms > chats.ack_deadline_s * 1000),
        "all_replied": replied,
        "drain_s": round(last_reply - last_sent, 2) if replied else None,
        "replies_per_s": round(sum(1 for c in counts if c) / (last_reply - first_sent), 1) if any(counts) else None,
        "event_to_reply_ms": summary(to_reply),
        "replies": sum(counts),
        "events_without_reply": sum(1 for c in counts if c == 0),
        "duplicate_replies": sum(c - 1 for c in counts if c > 1),
        "replies_in_wrong_thread": wrong_thread,
        "cpu_sending": cpu_use(cpu_start, cpu_sent),
        "cpu_draining": cpu_use(cpu_sent, cpu_done),
        "bench_loop_lag_ms": lag.figures(),
    } | own


async def phases(live: Live, chats: Chats[M], params: Params) -> dict[str, Any]:
    """Warm up, then the sequential and the burst figures, each printed as it is done."""
    await warm_up(live, chats, params)
    with paused_gc():
        sequential_figures = await sequential(live, chats, params)
    print_sequential(chats, sequential_figures)
    with paused_gc():
        burst_figures = await burst(live, chats, params)
    print_burst(chats, burst_figures, params)
    return {"burst": burst_figures, "sequential": sequential_figures}


def phase_cpu(figures: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """The CPU use of each phase of `phases`' figures, by name (for `disturbed`)."""
    burst_figures = figures["burst"]
    return {
        "sequential": figures["sequential"]["cpu"],
        "burst_sending": burst_figures["cpu_sending"],
        "burst_draining": burst_figures["cpu_draining"],
    }


# ------------------------------------------------------------------------------------------------ report


def print_sequential(chats: Chats[M], f: dict[str, Any]) -> None:
    last = chats.marks[-1].label
    section(
        f"{chats.name}, low load: {f['messages']} messages one at a time (each sent once the previous one got {last})"
    )
    print("from sending the event to ..., ms")
    marks = [(f"event_to_{m.key}_ms", m.label) for m in chats.marks]
    print(summary_rows([("the ack (HTTP 200)", f["ack_ms"]), *((label, f[key]) for key, label in marks)]))
    if f["not_answered_within_10s"] or f["non_200_acks"]:
        print(f"WARNING: {f['not_answered_within_10s']} not answered within 10 s, {f['non_200_acks']} acks not 200")
    print(cpu_line(f["cpu"], f["bench_loop_lag_ms"]))


def print_burst(chats: Chats[M], f: dict[str, Any], params: Params) -> None:
    section(
        f"{chats.name}, burst: {params.rate_per_s:g} events/s for {params.burst_s:g} s, open loop, over "
        f"{f['threads']} threads ({f['top_level_messages']} top-level messages, {f['thread_replies']} thread replies)"
    )
    lag = f["send_lag_ms"]
    print(
        f"sent {f['events']} events in {f['send_s']:.2f} s = {f['achieved_rate_per_s']} events/s "
        f"(send lag behind schedule p99 {lag['p99']:.1f} ms, max {lag['max']:.1f} ms)"
    )
    print(summary_rows([("ack (HTTP response), ms", f["ack_ms"]), ("event to reply post, ms", f["event_to_reply_ms"])]))
    deadline = chats.ack_deadline_s
    print(
        f"acks: {f['acks']} answered, {f['non_200_acks']} not 200 {f['statuses']}, {f['events'] - f['acks']} without "
        f"an answer {f['errors'] or ''}; {f[f'acks_over_{deadline:g}s']} slower than the {deadline:g} s {chats.name} "
        "allows"
    )
    if f["all_replied"]:
        done = f" (done reactions: {f['done_drain_s']} s)" if "done_drain_s" in f else ""
        print(
            f"drain: the last reply came {f['drain_s']:.2f} s after the last event was sent{done}; "
            f"{f['replies_per_s']} replies/s from first send"
        )
    else:
        print(f"WARNING: not every event was answered within {params.drain_timeout_s:g} s of the burst")
    verdict = "yes" if f["exactly_once"] else "NO" if f["duplicate_replies"] or f["replies_in_wrong_thread"] else "?"
    print(
        f"exactly once: {verdict} ({f['replies']} replies for {f['events']} events: {f['events_without_reply']} "
        f"without, {f['duplicate_replies']} duplicates, {f['replies_in_wrong_thread']} in a wrong thread)"
    )
    print("while sending:  " + cpu_line(f["cpu_sending"]))
    print("while draining: " + cpu_line(f["cpu_draining"], f["bench_loop_lag_ms"]))


# ------------------------------------------------------------------------------------------------ entry


async def run(server_url: str, params: Params) -> dict[str, Any]:
    roles = [{"process_role": "worker"}, {"process_role": "web"}] if params.split else [{}]
    async with live_bot(server_url, answer, *roles) as live:
        figures = await phases(live, SlackChats(live), params)
    section("Afterwards")
    print_afterwards(live.afterwards)
    return {
        "machine": {"slack_bolt": slack_bolt.version.__version__, "aiohttp": aiohttp.__version__},
        "note": CORES_NOTE.format(cores=os.cpu_count()),
        "parameters": asdict(params) | {"events": params.events},
        "figures": figures,
        "disturbed_by_other_processes": disturbed(phase_cpu(figures)),
        **live.afterwards,
    }


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Run the Slack benchmark, print its figures and write `results/slack.json`."""
    params = Params.of(quick)
    return run_benchmark("slack", quick, results, lambda url: run(url, params))
