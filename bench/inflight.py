"""Benchmark of conversations in flight: N customers write at once (each a new thread), the fake LLM takes L
seconds per call, and one `python -m bot serve` process (DB_POOL_SIZE=20) answers them. Reported per (L, N):
event -> reply p50 / p99 / max, the last answer against the single-turn time (the goal: all within 3x), and
the bot's resident memory at its peak. Then the cross-process wake-up: a message stored by process A (which
runs no turns) and run by process B, timed from A's ack to B's model call, with LISTEN/NOTIFY.

Reuses the Slack benchmark's harness (`bench.slack.bot_process`, the emulator, the fake LLM).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.setup import (
    RESULTS,
    machine,
    postgres_server,
    quiet,
    section,
    summary,
    table,
    throwaway_database,
    write_report,
)
from bench.slack import BOT_TOKEN, SIGNING_SECRET, bot_process
from db import migrate
from fakes.openai_server import FakeOpenAI, FakeReply, RecordedRequest, reply, slow
from fakes.slack_api import SlackEmulator

CHANNEL = "C_SUPPORT"


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def wave(emulator: SlackEmulator, fake: FakeOpenAI, pid: int, n: int, latency_s: float) -> dict[str, Any]:
    """N customers at once; seconds from each event to its answer in the thread."""

    def answer(request: RecordedRequest) -> FakeReply:
        return slow(latency_s, reply(f"answer: {request.last_user}"))

    fake.rule = answer
    started = time.monotonic()
    said = await asyncio.gather(*(emulator.user_says(CHANNEL, f"wave {n} question {i}") for i in range(n)))
    sent = time.monotonic()
    waiting = {s.ts: f"answer: wave {n} question {i}" for i, s in enumerate(said)}
    answered: dict[str, float] = {}
    peak_rss = 0.0
    while waiting and time.monotonic() - started < 120 + 3 * latency_s * n:
        for ts, expected in list(waiting.items()):
            if any(p.text == expected for p in emulator.posts(CHANNEL, ts)):
                answered[ts] = time.monotonic() - started
                del waiting[ts]
        peak_rss = max(peak_rss, rss_mb(pid))
        await asyncio.sleep(0.02)
    times = list(answered.values())
    return {
        "customers": n,
        "llm_latency_s": latency_s,
        "answered": len(answered),
        "unanswered": len(waiting),
        "send_s": round(sent - started, 3),
        "event_to_reply_s": summary(times),
        "last_answer_s": round(max(times), 3) if times else None,
        "peak_rss_mb": round(peak_rss, 1),
    }


async def wakeup(server_url: str, workdir: Path, count: int) -> dict[str, Any]:
    """Process A stores (MAX_CONCURRENT_TURNS=0), process B runs: A's ack to B's model call."""
    arrivals: dict[str, float] = {}
    arrived = asyncio.Event()

    def record(request: RecordedRequest) -> FakeReply:
        arrivals[request.last_user] = time.monotonic()
        arrived.set()
        return reply("ok")

    async with throwaway_database(server_url) as url, FakeOpenAI() as fake:
        await asyncio.to_thread(migrate.upgrade, url)
        fake.rule = record
        async with SlackEmulator(signing_secret=SIGNING_SECRET, bot_token=BOT_TOKEN) as emulator:
            common = {"max_turns": 0, "db_pool_size": 20, "ack_pool_size": None}
            async with (
                bot_process(url, fake, emulator, workdir / "a", **common) as a,  # type: ignore[arg-type]
                bot_process(url, fake, emulator, workdir / "b", max_turns=64, db_pool_size=20, ack_pool_size=None),
            ):
                emulator.events_url = a.events_url
                await asyncio.sleep(1.0)
                delays: list[float] = []
                for i in range(count):
                    text = f"wake {i}"
                    arrived.clear()
                    await emulator.user_says(CHANNEL, text)
                    acked = time.monotonic()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(arrived.wait(), timeout=10)
                    if text in arrivals:
                        delays.append((arrivals[text] - acked) * 1000)
                    await asyncio.sleep(0.05)
    return {"messages": count, "received": len(delays), "stored_to_model_call_ms": summary(delays)}


async def run(server_url: str, quick: bool) -> dict[str, Any]:
    latencies = (1.0,) if quick else (1.0, 2.0)
    sizes = (1, 50) if quick else (1, 100, 500)
    waves: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-inflight-") as tmp:
        work = Path(tmp)
        for sub in ("a", "b", "bot"):
            (work / sub).mkdir()
        for latency in latencies:
            async with throwaway_database(server_url) as url, FakeOpenAI() as fake:
                await asyncio.to_thread(migrate.upgrade, url)
                async with (
                    SlackEmulator(signing_secret=SIGNING_SECRET, bot_token=BOT_TOKEN) as emulator,
                    bot_process(
                        url, fake, emulator, work / "bot", max_turns=512, db_pool_size=20, ack_pool_size=None
                    ) as bot,
                ):
                    for n in sizes:
                        section(f"{n} customers at once, {latency:.0f} s per model call")
                        figures = await wave(emulator, fake, bot.proc.pid, n, latency)
                        print(figures, flush=True)
                        waves.append(figures)
        section("wake-up across processes (A stores, B runs)")
        wake = await wakeup(server_url, work, 10 if quick else 50)
        print(wake, flush=True)
    return {"waves": waves, "wakeup": wake}


def report_table(waves: list[dict[str, Any]]) -> str:
    single = {w["llm_latency_s"]: w["last_answer_s"] for w in waves if w["customers"] == 1}
    rows = []
    for w in waves:
        base = single.get(w["llm_latency_s"]) or 0
        ratio = round(w["last_answer_s"] / base, 2) if base and w["last_answer_s"] else None
        s = w["event_to_reply_s"]
        rows.append(
            [
                f"{w['customers']} at once, {w['llm_latency_s']:.0f} s/call",
                f"{w['answered']}/{w['customers']}",
                s["p50"],
                s["p99"],
                w["last_answer_s"],
                ratio,
                w["peak_rss_mb"],
            ]
        )
    return table(["load", "answered", "p50 s", "p99 s", "last s", "last / single", "RSS MB"], rows)


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    quiet()
    started = time.monotonic()
    with postgres_server() as (server_url, database):
        figures = asyncio.run(run(server_url, quick))
    section("summary")
    print(report_table(figures["waves"]))
    wake = figures["wakeup"]["stored_to_model_call_ms"]
    print(f"\nwake-up across processes, A's ack -> B's model call: p50 {wake['p50']} ms, p99 {wake['p99']} ms")
    report = {
        "benchmark": "inflight",
        "quick": quick,
        **figures,
        "load_average": list(os.getloadavg()),
        "machine": machine(database, None),
        "total_s": round(time.monotonic() - started, 1),
    }
    return write_report(report, results / "inflight.json")


if __name__ == "__main__":
    main()
