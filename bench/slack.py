"""Benchmark of the Slack edge: the real bot as its own process (`python -m bot serve`), fed signed Events API
requests by this process, which also plays Slack's Web API (`fakes.slack_api.SlackEmulator`) and the LLM
(`FakeOpenAI`, answering at once with "re: <the customer's message>"). Postgres is real: the embedded
pgserver, or the server in BENCH_DATABASE_URL, with a fresh database built by the migrations.

Figures
    sequential   one message at a time, each sent once the previous one is fully handled: the ack, and the
                 time from sending the event to the bot's Web API calls for it as the emulator records them
                 (the :eyes: reaction, the reply post, the done reaction)
    burst        message events fired on an open-loop schedule (each at its own time, whatever the earlier
                 ones are doing) over many threads: the ack latency (what Slack's 3-second deadline
                 applies to), the time the bot then needs to answer everything (drain), each event's
                 time to reply, and whether every event got exactly one reply, in its thread

The load generator, the emulator and the fake LLM share this process's event loop; its lag is measured and
reported, since a late loop delays the timestamps taken here. Bot, Postgres and this process share the
machine's cores: the CPU each used is reported per phase, with what the rest of the machine used (a warning
says when other processes were busy enough to disturb the figures). Also reported: the bot's Postgres
connections during the burst (pg_stat_activity), its own /metrics, Postgres's work per message
(pg_stat_database) and the WARNING lines of its log.

BENCH_BOT_PROFILE=path.prof runs the bot under cProfile (to read with pstats; the figures of such a run are
not comparable).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import slack_bolt
from prometheus_client.parser import text_string_to_metric_families
from slack_sdk.signature import SignatureVerifier
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from bench.setup import (
    RESULTS,
    admin,
    machine,
    percentile,
    postgres_server,
    quiet,
    section,
    summary,
    table,
    throwaway_database,
    write_report,
)
from bot.settings import Settings
from db import models as m
from db.url import async_url
from fakes.openai_server import FakeOpenAI, FakeReply, RecordedRequest, reply
from fakes.slack_api import TEAM_ID, ApiCall, SlackEmulator

SIGNING_SECRET = "bench-signing-secret"
BOT_TOKEN = "xoxb-bench"
CHANNEL = "C_SUPPORT"
STAFF_CHANNEL = "C_STAFF"
CUSTOMER = "U_CUSTOMER"
SLACK_ACK_DEADLINE_S = 3.0
"""Slack retries an Events API delivery that is not acknowledged within 3 seconds."""
DEFAULTS = Settings.model_fields
WORKING = str(DEFAULTS["working_reaction"].default)
DONE = str(DEFAULTS["done_reaction"].default)
CORES_NOTE = (
    "{cores} CPU cores shared by the bot process, Postgres, and this process (load generator, Slack emulator "
    "and fake LLM on one event loop)"
)


@dataclass(frozen=True)
class Params:
    quick: bool
    rate_per_s: float
    burst_s: float
    threads: int
    sequential_messages: int
    messages_per_thread: int
    """Sequential figure: messages per thread (the first one top-level, the others replies)."""
    warmup_messages: int
    drain_timeout_s: float
    quiet_s: float
    """After everything is answered: how long to keep watching for duplicate replies."""
    connection_limit: int = 2000
    """This process's connections to the bot (aiohttp's default of 100 would queue a burst's requests here)."""
    bot_max_turns: int = int(DEFAULTS["max_concurrent_turns"].default)
    bot_db_pool_size: int = int(DEFAULTS["db_pool_size"].default)
    bot_ack_pool_size: int | None = int(DEFAULTS["ack_pool_size"].default) if "ack_pool_size" in DEFAULTS else None
    """The acknowledgements' own pool, in bot versions that have one."""
    split: bool = False
    """Two bot processes: PROCESS_ROLE=web receives and acknowledges, PROCESS_ROLE=worker runs the turns and
    the outbox (BENCH_SPLIT=1)."""

    @property
    def bot_connection_limit(self) -> int:
        """Each of the bot's pools may open as many overflow connections as its size (db.engine.make_engine)."""
        return 2 * (self.bot_db_pool_size + (self.bot_ack_pool_size or 0))

    @classmethod
    def of(cls, quick: bool) -> Params:
        return replace(cls._of(quick), split=os.environ.get("BENCH_SPLIT") == "1")

    @classmethod
    def _of(cls, quick: bool) -> Params:
        if quick:
            return cls(
                quick=True,
                rate_per_s=100,
                burst_s=3,
                threads=100,
                sequential_messages=30,
                messages_per_thread=5,
                warmup_messages=10,
                drain_timeout_s=60,
                quiet_s=0.5,
            )
        return cls(
            quick=False,
            rate_per_s=200,
            burst_s=10,
            threads=200,
            sequential_messages=100,
            messages_per_thread=5,
            warmup_messages=20,
            drain_timeout_s=75,
            quiet_s=1.0,
        )

    @property
    def events(self) -> int:
        return round(self.rate_per_s * self.burst_s)


def answer(request: RecordedRequest) -> FakeReply:
    return reply(f"re: {request.last_user}")


def reply_text(text: str) -> str:
    return f"re: {text}"


# ------------------------------------------------------------------------------------------------ CPU


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on; None when there is no such process (or no /proc)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_s(pid: int, *, reaped_children: bool = False) -> float | None:
    fields = _stat(pid)
    if fields is None:
        return None
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / _TICK


def postgres_cpu_s(postmaster: int | None) -> float | None:
    """The postmaster, the children it has reaped, and its live children (backends, background workers)."""
    if postmaster is None:
        return None
    total = process_cpu_s(postmaster, reaped_children=True)
    if total is None:
        return None
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[1] == str(postmaster):
                total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


async def find_postmaster(database_url: str) -> int | None:
    """The local postmaster's pid (the parent of a backend), when Postgres runs on this machine."""
    engine = create_async_engine(async_url(database_url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:  # the backend must live while /proc is read
            backend = await conn.scalar(text("SELECT pg_backend_pid()"))
            return None if backend is None else _postmaster_of(int(backend))
    finally:
        await engine.dispose()


def _postmaster_of(backend: int) -> int | None:
    fields = _stat(backend)
    if fields is None:
        return None
    parent = int(fields[1])
    try:
        name = Path(f"/proc/{parent}/comm").read_text().strip()
    except OSError:
        return None
    return parent if name.startswith(("postgres", "postmaster")) else None


def machine_cpu_s() -> tuple[float, float] | None:
    """(busy, stolen) CPU seconds of the whole machine, all cores, from /proc/stat."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    return (user + nice + system + irq + softirq) / _TICK, steal / _TICK


@dataclass(frozen=True)
class CpuSample:
    at: float
    bench: float
    bot: float | None
    postgres: float | None
    machine: tuple[float, float] | None

    @classmethod
    def take(cls, bot_pid: int, postmaster: int | None) -> CpuSample:
        return cls(
            time.monotonic(),
            time.process_time(),
            process_cpu_s(bot_pid),
            postgres_cpu_s(postmaster),
            machine_cpu_s(),
        )


OTHERS_WARNING = 0.25
"""Other processes using more than this share of a core disturb the figures: say so."""


def cpu_use(before: CpuSample, after: CpuSample) -> dict[str, float | None]:
    """Share of one core each used between two samples (1.0 = one core busy all the time). "other" is what the
    rest of the machine used: other processes, or Postgres when it is not found on this machine; "steal" is
    time the hypervisor gave to other virtual machines."""
    span = after.at - before.at

    def share(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or span <= 0 else round((b - a) / span, 2)

    figures = {
        "seconds": round(span, 2),
        "bot": share(before.bot, after.bot),
        "postgres": share(before.postgres, after.postgres),
        "bench_process": share(before.bench, after.bench),
        "machine": None,
        "other": None,
        "steal": None,
    }
    if before.machine is not None and after.machine is not None:
        figures["machine"] = share(before.machine[0], after.machine[0])
        figures["steal"] = share(before.machine[1], after.machine[1])
        known = [figures[k] for k in ("bot", "postgres", "bench_process")]
        if figures["machine"] is not None:
            figures["other"] = round(max(0.0, figures["machine"] - sum(k or 0.0 for k in known)), 2)
    return figures


# ------------------------------------------------------------------------------------------------ the bot


@dataclass
class BotProcess:
    proc: asyncio.subprocess.Process
    events_url: str
    metrics_url: str
    log: Path
    started_s: float
    """From spawning the process to its "ready" line (imports, migrations check, pools, workers)."""

    def check_alive(self) -> None:
        if self.proc.returncode is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"the bot exited with {self.proc.returncode}; its log ends:\n{tail}")


async def poll_until(
    scan: Callable[[], object],
    bot: BotProcess,
    done: Callable[[], bool],
    timeout_s: float,
    what: str,
    poll_s: float = 0.001,
) -> bool:
    """Poll the emulator's record (`scan` reads what is new) until `done()`; False on timeout (the bot being
    dead raises)."""
    deadline = time.monotonic() + timeout_s
    while True:
        scan()
        if done():
            return True
        bot.check_alive()
        if time.monotonic() >= deadline:
            print(f"WARNING: gave up waiting after {timeout_s:.0f} s for {what}", flush=True)
            return False
        await asyncio.sleep(poll_s)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bot_command() -> list[str]:
    """`python -m bot serve`; under cProfile when BENCH_BOT_PROFILE names a file for its stats (a diagnosis
    aid: profiling slows the bot down, so the figures of such a run are not comparable)."""
    profile = os.environ.get("BENCH_BOT_PROFILE")
    profiler = ["-m", "cProfile", "-o", str(Path(profile).resolve())] if profile else []
    # BENCH_BOT_PYTHON: another installation's interpreter (an earlier checkout's), for before/after figures.
    return [os.environ.get("BENCH_BOT_PYTHON") or sys.executable, *profiler, "-m", "bot", "serve"]


@asynccontextmanager
async def bot_process(
    database_url: str,
    fake: FakeOpenAI,
    emulator: SlackEmulator,
    workdir: Path,
    *,
    max_turns: int,
    db_pool_size: int,
    ack_pool_size: int | None,
    extra_env: dict[str, str] | None = None,
) -> AsyncIterator[BotProcess]:
    """`python -m bot serve` in `workdir` (so no `.env` is read) with only our settings in its environment
    (`extra_env` adds to them: the relay benchmark's transcript summaries)."""
    port = _free_port()
    ours = {name.upper() for name in DEFAULTS}
    env = {k: v for k, v in os.environ.items() if k.upper() not in ours} | {
        "DATABASE_URL": database_url,
        "OPENAI_API_KEY": "bench",
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_MODEL": "fake-model",
        "OPENAI_MAX_RETRIES": "0",
        "SLACK_BOT_TOKEN": BOT_TOKEN,
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "SLACK_API_URL": emulator.api_url,
        "STAFF_CHANNEL_ID": STAFF_CHANNEL,
        "MAX_CONCURRENT_TURNS": str(max_turns),
        "DB_POOL_SIZE": str(db_pool_size),
        # The fake LLM serves embeddings too, of its own size (as tests/conftest.py configures the bot).
        "EMBEDDINGS": "openai",
        "OPENAI_EMBEDDING_MODEL": "fake-embed",
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "LOG_LEVEL": "WARNING",
    }
    if ack_pool_size is not None:
        env["ACK_POOL_SIZE"] = str(ack_pool_size)
    env |= extra_env or {}
    log = workdir / "bot.log"
    started = time.monotonic()
    with log.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            *_bot_command(), env=env, cwd=workdir, stdout=asyncio.subprocess.PIPE, stderr=log_file
        )
    bot = BotProcess(proc, f"http://127.0.0.1:{port}/slack/events", f"http://127.0.0.1:{port}/metrics", log, 0.0)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
        if not line:  # stdout closed: the bot is exiting
            await asyncio.wait_for(proc.wait(), timeout=15)
        bot.check_alive()
        if json.loads(line).get("event") != "ready":
            raise RuntimeError(f"the bot said {line!r} instead of being ready")
        bot.started_s = time.monotonic() - started
        emulator.events_url = bot.events_url
        yield bot
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout=15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def bot_log_summary(log: Path) -> dict[str, Any]:
    lines = log.read_text(errors="replace").splitlines()
    levels = Counter(level for line in lines for level in ("WARNING", "ERROR", "CRITICAL") if f" {level} " in line)
    notable = [line for line in lines if any(f" {level} " in line for level in levels)]
    return {"lines": len(lines), "by_level": dict(levels), "first": notable[:5]}


async def bot_metrics(bot: BotProcess, session: aiohttp.ClientSession) -> dict[str, Any]:
    """The bot's own counters (from /metrics): event dispositions, turns and their mean wall time."""
    async with session.get(bot.metrics_url) as response:
        body = await response.text()
    found: dict[str, Any] = {"events": {}, "processed": {}}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == "helpdesk_events_received_total":
                found["events"][sample.labels["disposition"]] = int(sample.value)
            elif sample.name == "helpdesk_messages_processed_total":
                found["processed"][sample.labels["kind"]] = int(sample.value)
            elif sample.name in ("helpdesk_turn_seconds_sum", "helpdesk_turn_seconds_count"):
                found[sample.name.removeprefix("helpdesk_")] = sample.value
            elif sample.name in ("helpdesk_outbox_sent_total", "helpdesk_inbox_backlog", "helpdesk_outbox_backlog"):
                found[sample.name.removeprefix("helpdesk_")] = int(sample.value)
    count = found.pop("turn_seconds_count", 0)
    total = found.pop("turn_seconds_sum", 0.0)
    found["turns"] = int(count)
    found["mean_turn_ms"] = round(total * 1000 / count, 2) if count else None
    return found


# ------------------------------------------------------------------------------------------------ load


@dataclass
class Sent:
    text: str
    ts: str
    thread_ts: str
    """The thread's root (the message itself when top-level)."""
    scheduled: float = 0.0
    sent: float = 0.0
    acked: float = 0.0
    status: int = 0
    """0 when no HTTP answer came (see error)."""
    error: str | None = None

    @property
    def ack_ms(self) -> float:
        return (self.acked - self.sent) * 1000


@dataclass
class Watcher:
    """Follows the emulator's record of Web API calls (a list that only grows) without re-reading it."""

    emulator: SlackEmulator
    seen: int = 0
    posts: dict[str, list[ApiCall]] = field(default_factory=dict)
    reactions: dict[tuple[str, str], float] = field(default_factory=dict)
    failed: Counter[str] = field(default_factory=Counter)
    awaited_replies: set[str] = field(default_factory=set)
    """Reply texts still awaited (see `expect`), so that waiting for many replies costs nothing per poll."""
    awaited_done: set[str] = field(default_factory=set)
    """ts of messages whose done reaction is still awaited."""

    def expect(self, sent: Sent) -> None:
        self.awaited_replies.add(reply_text(sent.text))
        self.awaited_done.add(sent.ts)

    def scan(self) -> None:
        calls = self.emulator.calls
        for call in calls[self.seen :]:
            if call.failed:
                self.failed[f"{call.method}: {call.error}"] += 1
            elif call.method == "chat.postMessage":
                text = str(call.params.get("text"))
                self.posts.setdefault(text, []).append(call)
                self.awaited_replies.discard(text)
            elif call.method == "reactions.add":
                ts, name = str(call.params.get("timestamp")), str(call.params.get("name"))
                self.reactions.setdefault((ts, name), call.at)
                if name == DONE:
                    self.awaited_done.discard(ts)
        self.seen = len(calls)

    def reply_at(self, sent: Sent) -> float | None:
        posts = self.posts.get(reply_text(sent.text))
        return posts[0].at if posts else None

    def done_at(self, sent: Sent) -> float | None:
        return self.reactions.get((sent.ts, DONE))

    def is_done(self, sent: Sent) -> bool:
        return (sent.ts, DONE) in self.reactions


class Customer:
    """Posts messages as a customer: stored in the emulator (so the bot can read the thread), then delivered to
    the bot as signed `message` events over one client session of our own, whose pool is sized for bursts."""

    def __init__(self, emulator: SlackEmulator, session: aiohttp.ClientSession, events_url: str) -> None:
        self.emulator = emulator
        self.session = session
        self.events_url = events_url
        self.verifier = SignatureVerifier(SIGNING_SECRET)
        self.in_flight = 0
        self.max_in_flight = 0

    def prepare(self, text: str, thread_ts: str | None = None) -> tuple[Sent, bytes]:
        msg = self.emulator.add_message(CHANNEL, text, user=CUSTOMER, thread_ts=thread_ts)
        event: dict[str, Any] = {
            "type": "message",
            "channel": CHANNEL,
            "user": CUSTOMER,
            "text": text,
            "ts": msg.ts,
            "team": TEAM_ID,
            "event_ts": msg.ts,
            "channel_type": "channel",
        }
        if thread_ts is not None:
            event |= {"thread_ts": thread_ts, "parent_user_id": CUSTOMER}
        body = json.dumps(self.emulator.event_envelope(event)).encode()
        return Sent(text, msg.ts, thread_ts or msg.ts), body

    async def send(self, sent: Sent, body: bytes) -> Sent:
        stamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": self.verifier.generate_signature(timestamp=stamp, body=body) or "",
        }
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        sent.sent = time.monotonic()
        try:
            async with self.session.post(self.events_url, data=body, headers=headers) as response:
                await response.read()
                sent.status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            sent.error = repr(exc)
        finally:
            sent.acked = time.monotonic()
            self.in_flight -= 1
        return sent

    async def say(self, text: str, thread_ts: str | None = None) -> Sent:
        sent, body = self.prepare(text, thread_ts)
        sent.scheduled = time.monotonic()
        return await self.send(sent, body)


class LoopLag:
    """How late this process's event loop wakes a task that sleeps `interval_s`: a late loop delays every
    timestamp taken here (sends, acks, the emulator's record of the bot's calls)."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.lags_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            await asyncio.sleep(self.interval_s)
            self.lags_ms.append((time.monotonic() - started - self.interval_s) * 1000)

    def __enter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()

    def figures(self) -> dict[str, float]:
        return {k: v for k, v in summary(self.lags_ms).items() if k in ("p50", "p99", "max")}


class ConnectionWatch:
    """Samples the bot's Postgres connections (pg_stat_activity, over one connection of our own) a few times a
    second: how close its pool (DB_POOL_SIZE plus as many overflow connections) came to its limit."""

    def __init__(self, database_url: str, interval_s: float = 0.25) -> None:
        self.database_url = database_url
        self.interval_s = interval_s
        self.samples: list[dict[str, int]] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        engine = create_async_engine(async_url(self.database_url), poolclass=NullPool)
        query = text(
            "SELECT coalesce(state, '?'), count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1"
        )
        try:
            async with engine.connect() as conn:
                while True:
                    rows = (await conn.execute(query)).tuples().all()
                    await conn.commit()
                    self.samples.append({str(state): int(n) for state, n in rows})
                    await asyncio.sleep(self.interval_s)
        finally:
            await engine.dispose()

    async def __aenter__(self) -> ConnectionWatch:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def figures(self) -> dict[str, Any]:
        totals = [sum(s.values()) for s in self.samples]
        states = sorted({state for s in self.samples for state in s})
        return {
            "samples": len(self.samples),
            "max": max(totals, default=0),
            "mean": round(sum(totals) / len(totals), 1) if totals else None,
            "max_by_state": {state: max(s.get(state, 0) for s in self.samples) for state in states},
        }


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection in this process while measuring: with the emulator's growing record, a
    full collection stalls this loop for 100-200 ms, delaying every timestamp taken meanwhile. (Reference
    counting still frees almost everything; the cycles left wait for the end of the phase.) The bot's own
    collections are left alone: they are part of what is measured."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


@dataclass
class Bench:
    params: Params
    bot: BotProcess
    emulator: SlackEmulator
    customer: Customer
    watcher: Watcher
    postmaster: int | None
    database_url: str

    def cpu(self) -> CpuSample:
        return CpuSample.take(self.bot.proc.pid, self.postmaster)

    async def until(self, done: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.001) -> bool:
        return await poll_until(self.watcher.scan, self.bot, done, timeout_s, what, poll_s)


# ------------------------------------------------------------------------------------------------ figures


async def warm_up(bench: Bench) -> None:
    """A few messages so that the bot's pools, Bolt's auth.test and the code paths are warm; also checks that
    replies come back as expected, since the figures match replies to events by their text."""
    root: str | None = None
    for i in range(bench.params.warmup_messages):
        sent = await bench.customer.say(f"warm-up message {i}", root)
        root = root or sent.ts
        if sent.status != 200:
            raise RuntimeError(f"warm-up event answered {sent.status} {sent.error or ''}")
        if not await bench.until(partial(bench.watcher.is_done, sent), 15, "a warm-up reply"):
            texts = list(bench.watcher.posts)[-3:]
            raise RuntimeError(f"no reply {reply_text(sent.text)!r} to the warm-up; the bot posted {texts}")


async def sequential(bench: Bench) -> dict[str, Any]:
    """One message at a time; the next one leaves when the previous one got its done reaction."""
    params = bench.params
    rows: list[dict[str, float]] = []
    root: str | None = None
    lost = not_ok = 0
    before = bench.cpu()
    with LoopLag() as lag:
        for i in range(params.sequential_messages):
            if i % params.messages_per_thread == 0:
                root = None
            sent = await bench.customer.say(f"sequential message {i}: where is my order?", root)
            root = root or sent.ts
            not_ok += sent.status != 200
            if not await bench.until(partial(bench.watcher.is_done, sent), 10, f"message {i}"):
                lost += 1
                continue
            reply_at = bench.watcher.reply_at(sent)
            working_at = bench.watcher.reactions.get((sent.ts, WORKING))
            done_at = bench.watcher.done_at(sent)
            assert reply_at is not None and working_at is not None and done_at is not None
            rows.append(
                {
                    "ack": sent.ack_ms,
                    "working": (working_at - sent.sent) * 1000,
                    "reply": (reply_at - sent.sent) * 1000,
                    "done": (done_at - sent.sent) * 1000,
                }
            )
    after = bench.cpu()
    return {
        "messages": params.sequential_messages,
        "answered": len(rows),
        "not_answered_within_10s": lost,
        "non_200_acks": not_ok,
        "ack_ms": summary([r["ack"] for r in rows]),
        "event_to_working_reaction_ms": summary([r["working"] for r in rows]),
        "event_to_reply_ms": summary([r["reply"] for r in rows]),
        "event_to_done_reaction_ms": summary([r["done"] for r in rows]),
        "cpu": cpu_use(before, after),
        "bench_loop_lag_ms": lag.figures(),
    }


async def burst(bench: Bench) -> dict[str, Any]:
    """Open loop: event i leaves at start + i / rate, whether or not the earlier ones were answered."""
    params, customer, watcher = bench.params, bench.customer, bench.watcher
    roots: dict[int, str] = {}
    sent_all: list[Sent] = []
    tasks: list[asyncio.Task[Sent]] = []
    top_level = 0
    async with ConnectionWatch(bench.database_url) as connections:
        with LoopLag() as lag:
            cpu_start = bench.cpu()
            start = time.monotonic() + 0.05
            for i in range(params.events):
                scheduled = start + i / params.rate_per_s
                delay = scheduled - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                thread = i % params.threads
                root = roots.get(thread)
                top_level += root is None
                sent, body = customer.prepare(f"burst message {i} in thread {thread}: where is my order?", root)
                roots.setdefault(thread, sent.ts)
                sent.scheduled = scheduled
                sent_all.append(sent)
                watcher.expect(sent)
                tasks.append(asyncio.create_task(customer.send(sent, body)))
            await asyncio.gather(*tasks)
            cpu_sent = bench.cpu()
            last_sent = max(s.sent for s in sent_all)
            first_sent = min(s.sent for s in sent_all)

            replied = await bench.until(
                lambda: not watcher.awaited_replies, params.drain_timeout_s, "every reply", poll_s=0.005
            )
            finished = replied and await bench.until(
                lambda: not watcher.awaited_done, 10, "every done reaction", poll_s=0.005
            )
            cpu_done = bench.cpu()
    await asyncio.sleep(params.quiet_s)  # room for a duplicate to show up, if one were coming
    watcher.scan()

    acked = [s for s in sent_all if s.error is None]
    reply_ats = {id(s): watcher.reply_at(s) for s in sent_all}
    replies = [at for at in reply_ats.values() if at is not None]
    done_ats = [at for s in sent_all if (at := watcher.done_at(s)) is not None]
    counts = [len(watcher.posts.get(reply_text(s.text), [])) for s in sent_all]
    wrong_thread = sum(
        1
        for s in sent_all
        for post in watcher.posts.get(reply_text(s.text), [])
        if post.params.get("thread_ts") != s.thread_ts
    )
    to_reply = [(at - s.sent) * 1000 for s in sent_all if (at := reply_ats[id(s)]) is not None]
    last_reply = max(replies, default=float("nan"))
    wrong = sum(1 for c in counts if c != 1)
    by_second: dict[int, list[float]] = {}
    for s in acked:
        by_second.setdefault(int(s.scheduled - start), []).append(s.ack_ms)
    return {
        "exactly_once": wrong == 0 and wrong_thread == 0,
        "events": len(sent_all),
        "threads": len(roots),
        "top_level_messages": top_level,
        "thread_replies": len(sent_all) - top_level,
        "send_s": round(last_sent - first_sent, 3),
        "achieved_rate_per_s": round((len(sent_all) - 1) / (last_sent - first_sent), 1),
        "send_lag_ms": summary([(s.sent - s.scheduled) * 1000 for s in sent_all]),
        "max_in_flight": customer.max_in_flight,
        "ack_ms": summary([s.ack_ms for s in acked]),
        "ack_ms_by_second": [
            {"second": second, "events": len(acks), "p50": round(percentile(acks, 50), 1), "max": round(max(acks), 1)}
            for second, acks in sorted(by_second.items())
        ],
        "acks": len(acked),
        "non_200_acks": sum(1 for s in acked if s.status != 200),
        "statuses": dict(Counter(str(s.status) for s in acked)),
        "no_answer": len(sent_all) - len(acked),
        "errors": dict(Counter((s.error or "")[:120] for s in sent_all if s.error)),
        f"acks_over_{SLACK_ACK_DEADLINE_S:g}s": sum(1 for s in acked if s.ack_ms > SLACK_ACK_DEADLINE_S * 1000),
        "all_replied": replied,
        "all_done_reactions": finished,
        "drain_s": round(last_reply - last_sent, 2) if replied else None,
        "done_drain_s": round(max(done_ats) - last_sent, 2) if finished else None,
        "replies_per_s": round(len(replies) / (last_reply - first_sent), 1) if replies else None,
        "event_to_reply_ms": summary(to_reply),
        "replies": sum(counts),
        "events_with_one_reply": sum(1 for c in counts if c == 1),
        "events_without_reply": sum(1 for c in counts if c == 0),
        "duplicate_replies": sum(c - 1 for c in counts if c > 1),
        "replies_in_wrong_thread": wrong_thread,
        "cpu_sending": cpu_use(cpu_start, cpu_sent),
        "cpu_draining": cpu_use(cpu_sent, cpu_done),
        "bench_loop_lag_ms": lag.figures(),
        "bot_postgres_connections": connections.figures(),
        "bot_postgres_connection_limit": params.bot_connection_limit,
    }


STAT_COLUMNS = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted", "tup_fetched")


async def database_state(database_url: str) -> dict[str, Any]:
    """What the run left in the database, once the bot has stopped (so its backends have reported their
    statistics): the counts that show every event was handled once, and Postgres's work per customer message
    over the whole run (warm-up and both figures; set-up and these queries add a few transactions)."""
    await asyncio.sleep(0.5)  # the bot's backends report their statistics as they exit
    engine = create_async_engine(async_url(database_url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            stats = (
                await conn.execute(
                    text(f"SELECT {', '.join(STAT_COLUMNS)} FROM pg_stat_database WHERE datname = current_database()")
                )
            ).one()
            dispositions = dict(
                (await conn.execute(select(m.SlackEvent.disposition, func.count()).group_by(m.SlackEvent.disposition)))
                .tuples()
                .all()
            )
            inbound, unprocessed, retried = (
                await conn.execute(
                    select(
                        func.count(),
                        func.count().filter(m.Inbound.processed_at.is_(None)),
                        func.count().filter(m.Inbound.attempts > 1),
                    )
                )
            ).one()
            outbox, unsent, gave_up, post_retries = (
                await conn.execute(
                    select(
                        func.count(),
                        func.count().filter(m.Outbox.sent_at.is_(None)),
                        func.count().filter(m.Outbox.last_error.like("gave up%")),
                        func.count().filter(m.Outbox.attempts > 1),
                    )
                )
            ).one()
    finally:
        await engine.dispose()
    return {
        "slack_events": {str(k): int(v) for k, v in dispositions.items()},
        "inbound": int(inbound),
        "inbound_unprocessed": int(unprocessed),
        "inbound_claimed_more_than_once": int(retried),
        "outbox": int(outbox),
        "outbox_unsent": int(unsent),
        "outbox_given_up": int(gave_up),
        "outbox_rows_sent_more_than_once": int(post_retries),
        "postgres_per_message": {
            column: round(int(value) / int(inbound), 1) if inbound else None
            for column, value in zip(STAT_COLUMNS, stats, strict=True)
        },
    }


def echo_figures(emulator: SlackEmulator) -> dict[str, Any]:
    """The emulator echoes each bot post back to the bot as an event, as Slack does; how those went."""
    echoes = [d for d in emulator.deliveries if d.payload.get("event", {}).get("bot_id")]
    answered = [d.result for d in echoes if d.result is not None]
    return {
        "deliveries": len(echoes),
        "statuses": dict(Counter(str(r.status) for r in answered)),
        "not_answered": len(echoes) - len(answered),
        "ack_ms": summary([r.elapsed_s * 1000 for r in answered]),
    }


# ------------------------------------------------------------------------------------------------ report


def _row(label: str, figures: dict[str, float]) -> Sequence[object]:
    return (label, *(figures[k] for k in ("p50", "p90", "p99", "mean", "max")))


def print_sequential(figures: dict[str, Any]) -> None:
    section(f"Low load: {figures['messages']} messages one at a time (each waits for the previous one's done reaction)")
    print(
        table(
            ("from sending the event to ..., ms", "p50", "p90", "p99", "mean", "max"),
            [
                _row("the ack (HTTP 200)", figures["ack_ms"]),
                _row(f"the :{WORKING}: reaction", figures["event_to_working_reaction_ms"]),
                _row("the reply post", figures["event_to_reply_ms"]),
                _row(f"the :{DONE}: reaction", figures["event_to_done_reaction_ms"]),
            ],
        )
    )
    if figures["not_answered_within_10s"] or figures["non_200_acks"]:
        print(
            f"WARNING: {figures['not_answered_within_10s']} messages not answered within 10 s, "
            f"{figures['non_200_acks']} acks not 200"
        )
    print(_cpu_line(figures["cpu"]) + _lag_line(figures["bench_loop_lag_ms"]))


def print_burst(figures: dict[str, Any], params: Params) -> None:
    section(
        f"Burst: {params.rate_per_s:g} events/s for {params.burst_s:g} s, open loop, over {figures['threads']} threads "
        f"({figures['top_level_messages']} top-level messages, {figures['thread_replies']} thread replies)"
    )
    lag = figures["send_lag_ms"]
    print(
        f"sent {figures['events']} events in {figures['send_s']:.2f} s = {figures['achieved_rate_per_s']} events/s "
        f"(send lag behind schedule p99 {lag['p99']:.1f} ms, max {lag['max']:.1f} ms; "
        f"up to {figures['max_in_flight']} requests in flight)"
    )
    over = figures[f"acks_over_{SLACK_ACK_DEADLINE_S:g}s"]
    print(
        table(
            ("per event, ms", "p50", "p90", "p99", "mean", "max"),
            [_row("ack (HTTP response)", figures["ack_ms"]), _row("event to reply post", figures["event_to_reply_ms"])],
        )
    )
    seconds = figures["ack_ms_by_second"]
    print("ack p50 by second of the burst, ms: " + ", ".join(f"{b['p50']:,.0f}" for b in seconds))
    print(
        f"acks: {figures['acks']} answered, {figures['non_200_acks']} not 200 {figures['statuses']}, "
        f"{figures['no_answer']} without an answer; {over} slower than Slack's {SLACK_ACK_DEADLINE_S:g} s deadline"
    )
    for error, n in figures["errors"].items():
        print(f"  {n} x {error}")
    if figures["all_replied"]:
        print(
            f"drain: the last reply came {figures['drain_s']:.2f} s after the last event was sent "
            f"(done reactions: {figures['done_drain_s']} s); {figures['replies_per_s']} replies/s from first send"
        )
    else:
        print(f"WARNING: not every event was answered within {params.drain_timeout_s:g} s of the burst")
    if figures["exactly_once"]:
        verdict = "yes"
    elif figures["duplicate_replies"] or figures["replies_in_wrong_thread"]:
        verdict = "NO"
    else:
        verdict = "not shown: replies missing when the wait ended, none duplicated"
    print(
        f"exactly once: {verdict}; "
        f"replies: {figures['replies']} for {figures['events']} events; {figures['events_with_one_reply']} events "
        f"with exactly one, {figures['events_without_reply']} with none, {figures['duplicate_replies']} duplicates, "
        f"{figures['replies_in_wrong_thread']} in a wrong thread"
    )
    pg = figures["bot_postgres_connections"]
    print(
        f"the bot's Postgres connections (sampled every 0.25 s): up to {pg['max']} of the "
        f"{figures['bot_postgres_connection_limit']} its pools allow, mean {pg['mean']}; "
        f"most at once by state {pg['max_by_state']}"
    )
    print("while sending:  " + _cpu_line(figures["cpu_sending"]))
    print("while draining: " + _cpu_line(figures["cpu_draining"]) + _lag_line(figures["bench_loop_lag_ms"]))


def _cpu_line(cpu: dict[str, float | None]) -> str:
    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.0%}"

    line = (
        f"CPU over {cpu['seconds']} s (100% = one core): bot {pct(cpu['bot'])}, Postgres {pct(cpu['postgres'])}, "
        f"this process {pct(cpu['bench_process'])}, the rest of the machine {pct(cpu['other'])}"
    )
    if cpu["steal"]:
        line += f", stolen by the hypervisor {pct(cpu['steal'])}"
    if (cpu["other"] or 0.0) > OTHERS_WARNING:
        line += " (WARNING: other processes were busy; these figures are disturbed)"
    return line


def _lag_line(lag: dict[str, float]) -> str:
    return f"; this process's loop lag p99 {lag['p99']:.1f} ms, max {lag['max']:.1f} ms"


def print_checks(report: dict[str, Any]) -> None:
    section("Afterwards")
    db, bot, echoes, log = report["database"], report["bot_metrics"], report["echoes"], report["bot_log"]
    print(
        f"database: slack_events {db['slack_events']}; inbound {db['inbound']} "
        f"({db['inbound_unprocessed']} unprocessed, {db['inbound_claimed_more_than_once']} claimed more than once); "
        f"outbox {db['outbox']} ({db['outbox_unsent']} unsent, {db['outbox_given_up']} given up, "
        f"{db['outbox_rows_sent_more_than_once']} tried more than once)"
    )
    per = db["postgres_per_message"]
    print(
        f"Postgres per customer message (pg_stat_database over the run): {per['xact_commit']} commits, "
        f"{per['xact_rollback']} rollbacks, rows inserted {per['tup_inserted']}, updated {per['tup_updated']}, "
        f"deleted {per['tup_deleted']}, fetched {per['tup_fetched']}"
    )
    print(
        f"bot /metrics: {bot['turns']} turns, mean turn {bot['mean_turn_ms']} ms; events {bot['events']}; "
        f"outbox sent {bot.get('outbox_sent_total')}"
    )
    print(f"echoes of the bot's own posts delivered to it: {echoes['deliveries']}, statuses {echoes['statuses']}")
    failed = report["failed_web_api_calls"]
    if failed:
        print(f"failed Web API calls: {failed}")
    print(f"bot log (WARNING and up): {log['by_level'] or 'none'}")
    for line in log["first"]:
        print(f"  {line[:200]}")


# ------------------------------------------------------------------------------------------------ entry


async def run(server_url: str, database: str, params: Params) -> dict[str, Any]:
    started = time.perf_counter()
    version = await admin(server_url, "SELECT current_setting('server_version')")
    async with (
        throwaway_database(server_url) as url,
        FakeOpenAI() as fake,
        SlackEmulator(signing_secret=SIGNING_SECRET, bot_token=BOT_TOKEN) as emulator,
    ):
        fake.rule = answer
        with tempfile.TemporaryDirectory(prefix="helpdesk-bench-bot-") as tmp, contextlib.ExitStack() as dirs:
            pools = {"db_pool_size": params.bot_db_pool_size, "ack_pool_size": params.bot_ack_pool_size}
            worker_dir = Path(dirs.enter_context(tempfile.TemporaryDirectory(prefix="helpdesk-bench-worker-")))
            async with contextlib.AsyncExitStack() as processes:
                worker = None
                if params.split:  # started first: the last process started receives the emulator's events
                    worker = await processes.enter_async_context(
                        bot_process(
                            url, fake, emulator, worker_dir, max_turns=params.bot_max_turns,
                            extra_env={"PROCESS_ROLE": "worker"}, **pools,  # type: ignore[arg-type]
                        )
                    )  # fmt: skip
                bot = await processes.enter_async_context(
                    bot_process(
                        url, fake, emulator, Path(tmp), max_turns=params.bot_max_turns,
                        extra_env={"PROCESS_ROLE": "web"} if params.split else None, **pools,  # type: ignore[arg-type]
                    )
                )  # fmt: skip
                connector = aiohttp.TCPConnector(limit=params.connection_limit)
                async with aiohttp.ClientSession(
                    connector=connector, timeout=aiohttp.ClientTimeout(total=30)
                ) as session:
                    bench = Bench(
                        params,
                        bot,
                        emulator,
                        Customer(emulator, session, bot.events_url),
                        Watcher(emulator),
                        await find_postmaster(url),
                        url,
                    )
                    print(
                        f"set-up (database, migrations, fake LLM, emulator, bot process): "
                        f"{time.perf_counter() - started:.1f} s, of which the bot's start {bot.started_s:.1f} s",
                        flush=True,
                    )
                    await warm_up(bench)
                    with paused_gc():
                        sequential_figures = await sequential(bench)
                    print_sequential(sequential_figures)
                    with paused_gc():
                        burst_figures = await burst(bench)
                    print_burst(burst_figures, params)
                    metrics = await bot_metrics(worker or bot, session)
                database_figures = await database_state(url)
            log = bot_log_summary(bot.log)
    report: dict[str, Any] = {
        "benchmark": "slack",
        "machine": machine(database, version, slack_bolt=slack_bolt.version.__version__, aiohttp=aiohttp.__version__),
        "note": CORES_NOTE.format(cores=os.cpu_count()),
        "parameters": {
            **asdict(params),
            "events": params.events,
            "bot_connection_limit": params.bot_connection_limit,
            "llm": "FakeOpenAI in this process, zero latency, answering 're: <last user message>'",
            "bot": "python -m bot serve, a separate process; Slack Web API: SlackEmulator in this process",
            "bench_process_gc": "cyclic GC paused in this process during the sequential and burst figures",
        },
        "figures": {"burst": burst_figures, "sequential": sequential_figures},
        "database": database_figures,
        "bot_metrics": metrics,
        "echoes": echo_figures(emulator),
        "failed_web_api_calls": dict(bench.watcher.failed),
        "bot_log": log,
    }
    print_checks(report)
    report["total_s"] = round(time.perf_counter() - started, 1)
    return report


def source_version() -> dict[str, Any]:
    """The commit the bot ran from, and whether its code had uncommitted changes (figures move with them)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    changed = git("status", "--porcelain", "--", "bot", "agents", "db", "escalation", "fakes", "migrations")
    dirty = None if changed is None else bool(changed)
    return {"commit": git("rev-parse", "--short", "HEAD"), "uncommitted_changes": dirty}


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Run the Slack benchmark, print its figures and write `results/slack.json`."""
    quiet()
    params = Params.of(quick)
    print(f"slack benchmark{' (quick)' if quick else ''}: Python {sys.version.split()[0]}")
    print(f"note: {CORES_NOTE.format(cores=os.cpu_count())}; figures are for this machine only", flush=True)
    source = source_version()
    with postgres_server() as (server_url, database):
        report = asyncio.run(run(server_url, database, params))
    report["source"] = source
    return write_report(report, results / "slack.json")
