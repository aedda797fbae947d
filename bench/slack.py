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
from typing import Any

import aiohttp
import slack_bolt

from bench.live import CORES_NOTE, Live, LoopLag, cpu_line, cpu_use, disturbed, live_bot, paused_gc, print_afterwards
from bench.setup import RESULTS, run_benchmark, section, summary, summary_rows
from bot.settings import Settings
from fakes.openai_server import FakeReply, RecordedRequest, reply
from harness.slack import Sent, deliver, say, write

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


def done(sent: Sent) -> tuple[str, str, str]:
    return ("reactions.add", sent.ts, DONE)


def answered(live: Live, sent: Sent) -> bool:
    """Done: the reply is posted and the working reaction swapped for the done one."""
    return done(sent) in live.watcher.reactions


# ------------------------------------------------------------------------------------------------ figures


async def warm_up(live: Live, params: Params) -> None:
    """A few messages so that the bot's pools, Bolt's auth.test and the code paths are warm; also checks that
    replies come back as expected, since the figures match replies to events by their text."""
    root: str | None = None
    for i in range(params.warmup_messages):
        sent = await say(live.emulator, CHANNEL, f"warm-up message {i}", thread_ts=root)
        root = root or sent.ts
        if sent.status != 200:
            raise RuntimeError(f"warm-up event answered {sent.status} {sent.error or ''}")
        if not await live.until(partial(answered, live, sent), 15, "a warm-up reply"):
            texts = list(live.watcher.posts)[-3:]
            raise RuntimeError(f"no reply {reply_text(sent.text)!r} to the warm-up; the bot posted {texts}")


async def sequential(live: Live, params: Params) -> dict[str, Any]:
    """One message at a time; the next one leaves when the previous one got its done reaction."""
    watcher = live.watcher
    rows: list[dict[str, float]] = []
    root: str | None = None
    lost = not_ok = 0
    before = live.cpu()
    with LoopLag() as lag:
        for i in range(params.sequential_messages):
            if i % params.messages_per_thread == 0:
                root = None
            sent = await say(live.emulator, CHANNEL, f"sequential message {i}: where is my order?", thread_ts=root)
            root = root or sent.ts
            not_ok += sent.status != 200
            if not await live.until(partial(answered, live, sent), 10, f"message {i}"):
                lost += 1
                continue
            reply_at = watcher.posted_at(reply_text(sent.text))
            working_at = watcher.reactions.get(("reactions.add", sent.ts, WORKING))
            assert reply_at is not None
            # No working reaction when the reply was ready before the sender got to it (the outbox skips it).
            at = {"working": working_at, "reply": reply_at, "done": watcher.reactions[done(sent)]}
            rows.append({"ack": sent.ack_ms} | {k: (v - sent.sent) * 1000 for k, v in at.items() if v is not None})
    return {
        "messages": params.sequential_messages,
        "answered": len(rows),
        "not_answered_within_10s": lost,
        "non_200_acks": not_ok,
        "ack_ms": summary([r["ack"] for r in rows]),
        "event_to_working_reaction_ms": summary([r["working"] for r in rows if "working" in r]),
        "working_reactions_skipped": sum(1 for r in rows if "working" not in r),
        "event_to_reply_ms": summary([r["reply"] for r in rows]),
        "event_to_done_reaction_ms": summary([r["done"] for r in rows]),
        "cpu": cpu_use(before, live.cpu()),
        "bench_loop_lag_ms": lag.figures(),
    }


async def burst(live: Live, params: Params) -> dict[str, Any]:
    """Open loop: event i leaves at start + i / rate, whether or not the earlier ones were answered."""
    watcher = live.watcher
    roots: dict[int, str] = {}
    sent_all: list[Sent] = []
    tasks: list[asyncio.Task[Sent]] = []
    with LoopLag() as lag:
        cpu_start = live.cpu()
        start = time.monotonic() + 0.05
        for i in range(params.events):
            scheduled = start + i / params.rate_per_s
            if (delay := scheduled - time.monotonic()) > 0:
                await asyncio.sleep(delay)
            thread = i % params.threads
            text = f"burst message {i} in thread {thread}: where is my order?"
            sent = write(live.emulator, CHANNEL, text, thread_ts=roots.get(thread))
            roots.setdefault(thread, sent.ts)
            sent.scheduled = scheduled
            sent_all.append(sent)
            watcher.expect(post=reply_text(text), reaction=done(sent))
            tasks.append(asyncio.create_task(deliver(live.emulator, sent)))
        await asyncio.gather(*tasks)
        cpu_sent = live.cpu()
        first_sent, last_sent = min(s.sent for s in sent_all), max(s.sent for s in sent_all)
        replied = await live.until(lambda: not watcher.awaited_posts, params.drain_timeout_s, "every reply", 0.005)
        finished = replied and await live.until(lambda: not watcher.awaited_reactions, 10, "every done", 0.005)
        cpu_done = live.cpu()
    await asyncio.sleep(params.quiet_s)  # room for a duplicate to show up, if one were coming
    watcher.scan()

    acked = [s for s in sent_all if s.error is None]
    posts = [watcher.posts.get(reply_text(s.text), []) for s in sent_all]
    counts = [len(p) for p in posts]
    wrong_thread = sum(1 for s, p in zip(sent_all, posts, strict=True) for post in p if post.thread_ts != s.thread_ts)
    to_reply = [(p[0].at - s.sent) * 1000 for s, p in zip(sent_all, posts, strict=True) if p]
    last_reply = max((p[0].at for p in posts if p), default=float("nan"))
    done_ats = [at for s in sent_all if (at := watcher.reactions.get(done(s))) is not None]
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
        f"acks_over_{SLACK_ACK_DEADLINE_S:g}s": sum(1 for s in acked if s.ack_ms > SLACK_ACK_DEADLINE_S * 1000),
        "all_replied": replied,
        "all_done_reactions": finished,
        "drain_s": round(last_reply - last_sent, 2) if replied else None,
        "done_drain_s": round(max(done_ats) - last_sent, 2) if finished else None,
        "replies_per_s": round(sum(1 for c in counts if c) / (last_reply - first_sent), 1) if any(counts) else None,
        "event_to_reply_ms": summary(to_reply),
        "replies": sum(counts),
        "events_without_reply": sum(1 for c in counts if c == 0),
        "duplicate_replies": sum(c - 1 for c in counts if c > 1),
        "replies_in_wrong_thread": wrong_thread,
        "cpu_sending": cpu_use(cpu_start, cpu_sent),
        "cpu_draining": cpu_use(cpu_sent, cpu_done),
        "bench_loop_lag_ms": lag.figures(),
    }


# ------------------------------------------------------------------------------------------------ report


def print_sequential(f: dict[str, Any]) -> None:
    section(f"Low load: {f['messages']} messages one at a time (each waits for the previous one's done reaction)")
    labels = {"ack_ms": "the ack (HTTP 200)", "event_to_working_reaction_ms": f"the :{WORKING}: reaction"}
    labels |= {"event_to_reply_ms": "the reply post", "event_to_done_reaction_ms": f"the :{DONE}: reaction"}
    print("from sending the event to ..., ms")
    print(summary_rows([(label, f[key]) for key, label in labels.items()]))
    if f["not_answered_within_10s"] or f["non_200_acks"]:
        print(f"WARNING: {f['not_answered_within_10s']} not answered within 10 s, {f['non_200_acks']} acks not 200")
    print(cpu_line(f["cpu"], f["bench_loop_lag_ms"]))


def print_burst(f: dict[str, Any], params: Params) -> None:
    section(
        f"Burst: {params.rate_per_s:g} events/s for {params.burst_s:g} s, open loop, over {f['threads']} threads "
        f"({f['top_level_messages']} top-level messages, {f['thread_replies']} thread replies)"
    )
    lag = f["send_lag_ms"]
    print(
        f"sent {f['events']} events in {f['send_s']:.2f} s = {f['achieved_rate_per_s']} events/s "
        f"(send lag behind schedule p99 {lag['p99']:.1f} ms, max {lag['max']:.1f} ms)"
    )
    print(summary_rows([("ack (HTTP response), ms", f["ack_ms"]), ("event to reply post, ms", f["event_to_reply_ms"])]))
    print(
        f"acks: {f['acks']} answered, {f['non_200_acks']} not 200 {f['statuses']}, {f['events'] - f['acks']} without "
        f"an answer {f['errors'] or ''}; {f[f'acks_over_{SLACK_ACK_DEADLINE_S:g}s']} slower than Slack's "
        f"{SLACK_ACK_DEADLINE_S:g} s deadline"
    )
    if f["all_replied"]:
        print(
            f"drain: the last reply came {f['drain_s']:.2f} s after the last event was sent "
            f"(done reactions: {f['done_drain_s']} s); {f['replies_per_s']} replies/s from first send"
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
        await warm_up(live, params)
        with paused_gc():
            sequential_figures = await sequential(live, params)
        print_sequential(sequential_figures)
        with paused_gc():
            burst_figures = await burst(live, params)
        print_burst(burst_figures, params)
    section("Afterwards")
    print_afterwards(live.afterwards)
    cpu = {"sequential": sequential_figures["cpu"], "burst_sending": burst_figures["cpu_sending"]}
    return {
        "machine": {"slack_bolt": slack_bolt.version.__version__, "aiohttp": aiohttp.__version__},
        "note": CORES_NOTE.format(cores=os.cpu_count()),
        "parameters": asdict(params) | {"events": params.events},
        "figures": {"burst": burst_figures, "sequential": sequential_figures},
        "disturbed_by_other_processes": disturbed(cpu | {"burst_draining": burst_figures["cpu_draining"]}),
        **live.afterwards,
    }


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Run the Slack benchmark, print its figures and write `results/slack.json`."""
    params = Params.of(quick)
    return run_benchmark("slack", quick, results, lambda url: run(url, params))
