"""What the benchmarks of the live bot share (`slack`, `teams`, `relay`, `inflight`, `admin`): the bot as
`python -m bot serve` processes (`harness.bot`) on a throwaway database, the fake LLM, the Slack emulator (and
the Teams one, when asked) and a watcher of its record; the CPU each process used; this process's loop lag;
and, afterwards, the bot's /metrics, what the run left in the database and the warnings in its log.

This process (load generator, emulator and fake LLM on one event loop), the bot and Postgres share the
machine's cores: the CPU each used is measured per phase, with what the rest of the machine used, and a
phase in which other processes were busy is flagged as disturbed."""

from __future__ import annotations

import asyncio
import gc
import os
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from agents.db import models as m
from agents.db.url import async_url
from bench.setup import DATABASE_PREFIX, summary
from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI, FakeReply, RecordedRequest
from fakes.teams_api import TeamsEmulator
from harness import teams as th
from harness.bot import BotProcess, bot_env, bot_process, emulator
from harness.database import throwaway_database
from harness.slack import Watcher

CORES_NOTE = (
    "{cores} CPU cores shared by the bot process, Postgres, and this process (load generator, Slack emulator "
    "and fake LLM on one event loop)"
)
OTHERS_WARNING = 0.25
"""Other processes using more than this share of a core disturb the figures: say so."""
CONNECTIONS = 2000
"""This process's connections to the bot at once (aiohttp's default of 100 would queue a burst's requests)."""
UNLIMITED = {"daily_token_budget_per_user": 0}
"""The benchmarks' few customers write at load-test rates: a full Slack run costs its one customer more than the
default daily token budget, and the rest of the run would be refused (`harness.bot` turns the per-minute limits
off for the same reason)."""


@dataclass
class Live:
    """The running bot and its surroundings; `afterwards` is filled when the bot has stopped."""

    database_url: str
    fake: FakeOpenAI
    emulator: SlackEmulator
    bots: list[BotProcess]
    """In the order started; the emulator delivers to the last one."""
    watcher: Watcher
    postmaster: int | None
    teams: TeamsEmulator | None = None
    """Delivering to the last bot process, when Teams is served too."""
    afterwards: dict[str, Any] = field(default_factory=dict)

    @property
    def bot(self) -> BotProcess:
        return self.bots[-1]

    def check_alive(self) -> None:
        for bot in self.bots:
            bot.check_alive()

    def cpu(self) -> CpuSample:
        return CpuSample.take(self.bot.proc.pid, self.postmaster)

    async def until(self, done: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.001) -> bool:
        return await self.watcher.until(done, timeout_s, what, poll_s=poll_s, alive=self.check_alive)


@asynccontextmanager
async def live_bot(
    server_url: str, rule: Callable[[RecordedRequest], FakeReply], *settings: dict[str, Any], teams: bool = False
) -> AsyncIterator[Live]:
    """A throwaway database, the fake LLM answering by `rule`, the emulator (and Teams' with `teams`: the bots
    then serve both), and one bot process for each of `settings` (by field name, over `harness.bot.bot_config`'s),
    started in order. On exit: the first process's /metrics (the one running the turns when the roles are split),
    then, once all have stopped, the database and the logs."""
    started = time.perf_counter()
    async with (
        throwaway_database(server_url, DATABASE_PREFIX) as url,
        FakeOpenAI() as fake,
        emulator(connection_limit=CONNECTIONS) as slack,
        th.emulator(connection_limit=CONNECTIONS) if teams else nullcontext() as teams_emulator,
    ):
        fake.rule = rule
        extra: dict[str, Any] = UNLIMITED | ({} if teams_emulator is None else th.teams_settings(teams_emulator))
        env = {} if teams_emulator is None else teams_emulator.env()
        with tempfile.TemporaryDirectory(prefix="helpdesk-bench-") as tmp:
            logs = [Path(tmp) / str(n) for n in range(len(settings))]
            async with AsyncExitStack() as stack:
                bots = [
                    await stack.enter_async_context(
                        bot_process(bot_env(url, fake, slack, **extra | s) | env, slack, workdir=log)
                    )
                    for s, log in zip(settings, logs, strict=True)
                ]
                if teams_emulator is not None:
                    teams_emulator.messaging_url = f"{bots[-1].url}/api/messages"
                live = Live(url, fake, slack, bots, Watcher(slack), await find_postmaster(url), teams_emulator)
                set_up = f"{time.perf_counter() - started:.1f} s, of which the bot's start {bots[-1].started_s:.1f} s"
                print(f"set-up (database, migrations, fake LLM, emulator, bot): {set_up}", flush=True)
                yield live
                live.afterwards["bot_metrics"] = await bot_metrics(bots[0])
            live.watcher.scan()
            live.afterwards |= {
                "database": await database_state(url),
                "failed_web_api_calls": dict(live.watcher.failed),
                "bot_log": bot_log_summary([log / "bot.log" for log in logs]),
            }


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
    total = None if postmaster is None else process_cpu_s(postmaster, reaped_children=True)
    if total is None:
        return None
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None and fields[1] == str(postmaster):
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
    try:
        name = "" if fields is None else Path(f"/proc/{fields[1]}/comm").read_text().strip()
    except OSError:
        return None
    return int(fields[1]) if fields is not None and name.startswith(("postgres", "postmaster")) else None


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
            time.monotonic(), time.process_time(), process_cpu_s(bot_pid), postgres_cpu_s(postmaster), machine_cpu_s()
        )


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
        known = sum(figures[k] or 0.0 for k in ("bot", "postgres", "bench_process"))
        if figures["machine"] is not None:
            figures["other"] = round(max(0.0, figures["machine"] - known), 2)
    return figures


def disturbed(phases: dict[str, dict[str, float | None]]) -> dict[str, float]:
    """The phases in which the rest of the machine used more than OTHERS_WARNING of a core, and how much: the
    bot, Postgres and this process were then short of CPU, and every figure of the phase is too slow."""
    return {name: other for name, cpu in phases.items() if (other := cpu["other"] or 0.0) > OTHERS_WARNING}


def cpu_line(cpu: dict[str, float | None], lag: dict[str, float] | None = None) -> str:
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
    if lag is not None:
        line += f"; this process's loop lag p99 {lag['p99']:.1f} ms, max {lag['max']:.1f} ms"
    return line


# ------------------------------------------------------------------------------------------------ this process


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


# ------------------------------------------------------------------------------------------------ afterwards


async def bot_metrics(bot: BotProcess) -> dict[str, Any]:
    """The bot's own counters (from /metrics): event dispositions, turns and their mean wall time."""
    async with aiohttp.ClientSession() as http, http.get(f"{bot.monitoring_url}/metrics") as response:
        body = await response.text()
    found: dict[str, Any] = {"events": {}, "processed": {}}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            name = sample.name.removeprefix("helpdesk_")
            if name == "events_received_total":
                found["events"][sample.labels["disposition"]] = int(sample.value)
            elif name == "messages_processed_total":
                found["processed"][sample.labels["kind"]] = int(sample.value)
            elif name in ("turn_seconds_sum", "turn_seconds_count"):
                found[name] = sample.value
            elif name == "outbox_sent_total":
                found[name] = int(sample.value)
    count, total = found.pop("turn_seconds_count", 0), found.pop("turn_seconds_sum", 0.0)
    return found | {"turns": int(count), "mean_turn_ms": round(total * 1000 / count, 2) if count else None}


def counted(model: Any, *conditions: Any) -> Any:
    """SELECT count(*) and the count of rows meeting each condition."""
    return select(func.count(), *(func.count().filter(c) for c in conditions)).select_from(model)


STAT_COLUMNS = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted", "tup_fetched")


async def database_state(database_url: str) -> dict[str, Any]:
    """What the run left in the database, once the bot has stopped (so its backends have reported their
    statistics): the counts that show every message was handled once, and Postgres's work per inbound message
    over the whole run (set-up and these queries add a few transactions)."""
    await asyncio.sleep(0.5)  # the bot's backends report their statistics as they exit
    engine = create_async_engine(async_url(database_url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            where = text(f"SELECT {', '.join(STAT_COLUMNS)} FROM pg_stat_database WHERE datname = current_database()")
            stats = (await conn.execute(where)).one()
            by = select(m.Received.disposition, func.count()).group_by(m.Received.disposition)
            dispositions = dict((await conn.execute(by)).tuples().all())
            counts = [
                *(
                    await conn.execute(counted(m.Inbound, m.Inbound.processed_at.is_(None), m.Inbound.attempts > 1))
                ).one(),
                *(
                    await conn.execute(
                        counted(
                            m.Outbox,
                            m.Outbox.done_at.is_(None),
                            m.Outbox.last_error.like("gave up%"),
                            m.Outbox.attempts > 1,
                        )
                    )
                ).one(),
            ]
    finally:
        await engine.dispose()
    names: tuple[str, ...] = ("inbound", "inbound_unprocessed", "inbound_claimed_more_than_once")
    names += ("outbox", "outbox_unsent", "outbox_given_up", "outbox_rows_sent_more_than_once")
    figures: dict[str, Any] = dict(zip(names, (int(c) for c in counts), strict=True))
    per = figures["inbound"] or None
    return figures | {
        "received": {str(k): int(v) for k, v in dispositions.items()},
        "postgres_per_message": {
            column: round(int(value) / per, 1) if per else None
            for column, value in zip(STAT_COLUMNS, stats, strict=True)
        },
    }


def bot_log_summary(logs: list[Path]) -> dict[str, Any]:
    lines = [line for log in logs for line in log.read_text(errors="replace").splitlines()]
    levels = Counter(level for line in lines for level in ("WARNING", "ERROR", "CRITICAL") if f" {level} " in line)
    notable = [line for line in lines if any(f" {level} " in line for level in levels)]
    return {"lines": len(lines), "by_level": dict(levels), "first": notable[:5]}


def print_afterwards(afterwards: dict[str, Any]) -> None:
    db, bot, log = (afterwards[k] for k in ("database", "bot_metrics", "bot_log"))
    print(
        f"database: received {db['received']}; inbound {db['inbound']} "
        f"({db['inbound_unprocessed']} unprocessed, {db['inbound_claimed_more_than_once']} claimed more than once); "
        f"outbox {db['outbox']} ({db['outbox_unsent']} unsent, {db['outbox_given_up']} given up, "
        f"{db['outbox_rows_sent_more_than_once']} tried more than once)"
    )
    per = db["postgres_per_message"]
    print(
        f"Postgres per inbound message (pg_stat_database over the run): {per['xact_commit']} commits, "
        f"{per['xact_rollback']} rollbacks, rows inserted {per['tup_inserted']}, updated {per['tup_updated']}, "
        f"deleted {per['tup_deleted']}, fetched {per['tup_fetched']}"
    )
    print(
        f"bot /metrics: {bot['turns']} turns (mean {bot['mean_turn_ms']} ms), processed {bot['processed']}, "
        f"events {bot['events']}, outbox sent {bot.get('outbox_sent_total')}"
    )
    if afterwards["failed_web_api_calls"]:
        print(f"failed Web API calls: {afterwards['failed_web_api_calls']}")
    print(f"bot log (WARNING and up): {log['by_level'] or 'none'}")
    for line in log["first"]:
        print(f"  {line[:200]}")
