"""Benchmark of conversations in flight: N customers write at once (each a new thread), the fake LLM takes L
seconds per call, and one `python -m bot serve` process (DB_POOL_SIZE=20) answers them. Reported per (L, N):
event -> reply p50 / p99 / max, the last answer against the single-turn time (the goal: all within 3x), and
the bot's resident memory at its peak. Then the cross-process wake-up: a message stored by process A (which
runs no turns) and run by process B, timed from A's ack to B's model call, with LISTEN/NOTIFY.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from bench.live import Live, cpu_use, live_bot
from bench.setup import RESULTS, run_benchmark, section, summary, table
from fakes.openai_server import FakeReply, RecordedRequest, reply, slow
from harness.slack import deliver, say, write

CHANNEL = "C_SUPPORT"


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def wave(live: Live, n: int, latency_s: float) -> dict[str, Any]:
    """N customers at once; seconds from each event to its answer in the thread."""
    live.fake.rule = lambda request: slow(latency_s, reply(f"answer: {request.last_user}"))
    watcher = live.watcher
    cpu_before = live.cpu()
    started = time.monotonic()
    said = [write(live.emulator, CHANNEL, f"wave {n} question {i}") for i in range(n)]
    for s in said:
        watcher.expect(post=f"answer: {s.text}")
    await asyncio.gather(*(deliver(live.emulator, s) for s in said))
    sent = time.monotonic()
    peak_rss = 0.0
    while watcher.awaited_posts and time.monotonic() - started < 120 + 3 * latency_s * n:
        watcher.scan()
        peak_rss = max(peak_rss, rss_mb(live.bot.proc.pid))
        await asyncio.sleep(0.02)
    times = [at - started for s in said if (at := watcher.posted_at(f"answer: {s.text}")) is not None]
    cpu = cpu_use(cpu_before, live.cpu())
    return {
        "customers": n,
        "llm_latency_s": latency_s,
        "answered": len(times),
        "unanswered": n - len(times),
        "send_s": round(sent - started, 3),
        "event_to_reply_s": summary(times),
        "last_answer_s": round(max(times), 3) if times else None,
        "peak_rss_mb": round(peak_rss, 1),
        "cpu": cpu,
        "bot_cpu_ms_per_customer": round((cpu["bot"] or 0) * cpu["seconds"] * 1000 / n, 1) if cpu["seconds"] else None,
    }


async def wakeup(server_url: str, count: int) -> dict[str, Any]:
    """Process A stores (MAX_CONCURRENT_TURNS=0), process B runs: A's ack to B's model call."""
    arrivals: dict[str, float] = {}
    arrived = asyncio.Event()

    def record(request: RecordedRequest) -> FakeReply:
        arrivals[request.last_user] = time.monotonic()
        arrived.set()
        return reply("ok")

    b, a = {"max_concurrent_turns": 64, "db_pool_size": 20}, {"max_concurrent_turns": 0, "db_pool_size": 20}
    async with live_bot(server_url, record, b, a) as live:  # the emulator delivers to A, the last one started
        await asyncio.sleep(1.0)
        delays: list[float] = []
        for i in range(count):
            arrived.clear()
            sent = await say(live.emulator, CHANNEL, f"wake {i}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), timeout=10)
            if sent.text in arrivals:
                delays.append((arrivals[sent.text] - sent.acked) * 1000)
            await asyncio.sleep(0.05)
    return {"messages": count, "received": len(delays), "stored_to_model_call_ms": summary(delays)}


def report_table(waves: list[dict[str, Any]]) -> str:
    single = {w["llm_latency_s"]: w["last_answer_s"] for w in waves if w["customers"] == 1}
    rows = []
    for w in waves:
        base, last, s = single.get(w["llm_latency_s"]) or 0, w["last_answer_s"], w["event_to_reply_s"]
        ratio = round(last / base, 2) if base and last else None
        load = f"{w['customers']} at once, {w['llm_latency_s']:.0f} s/call"
        cpu = w["bot_cpu_ms_per_customer"]
        rows.append([load, f"{w['answered']}/{w['customers']}", s["p50"], s["p99"], last, ratio, w["peak_rss_mb"], cpu])
    headers = ["load", "answered", "p50 s", "p99 s", "last s", "last / single", "RSS MB", "bot CPU ms/customer"]
    return table(headers, rows)


async def run(server_url: str, quick: bool) -> dict[str, Any]:
    waves: list[dict[str, Any]] = []
    for latency in (1.0,) if quick else (1.0, 2.0):
        async with live_bot(server_url, lambda _: reply(""), {"max_concurrent_turns": 512, "db_pool_size": 20}) as live:
            for n in (1, 50) if quick else (1, 100, 500):
                section(f"{n} customers at once, {latency:.0f} s per model call")
                waves.append(await wave(live, n, latency))
                print(waves[-1], flush=True)
    section("wake-up across processes (A stores, B runs)")
    wake = await wakeup(server_url, 10 if quick else 50)
    print(wake, flush=True)
    section("summary")
    print(report_table(waves))
    ms = wake["stored_to_model_call_ms"]
    print(f"\nwake-up across processes, A's ack -> B's model call: p50 {ms['p50']} ms, p99 {ms['p99']} ms")
    return {"waves": waves, "wakeup": wake}


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    return run_benchmark("inflight", quick, results, lambda url: run(url, quick))
