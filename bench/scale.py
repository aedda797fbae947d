"""Scale-out, measured (issue 30): one `web` process taking Slack's events and 1, 2, then 4 `worker` processes
running the turns and the outbox (`PROCESS_ROLE`, as the Procfile and compose.yaml run them), all against one
database. Per set-up (`bench.cpu`'s: the defaults a user gets, and stripped) and number of workers: one question to
warm up, one customer alone (the single turn), then a burst of different customers in several channels at once,
each model call 1 s.

Reported per configuration: messages per second through the system (customers ÷ the last answer's time from the
first event), the last answer against the single turn's, whether every answer was posted exactly once, and the CPU
seconds per message of each kind of process (/proc utime + stime from before the burst until every process is quiet
again): the web process, the workers together, Postgres (the postmaster, its live children and the ones it reaped),
this process. And the database's own cost per message, from Postgres's statistics for the bench's database (the
embedded Postgres does not ship pg_stat_statements, which would also need `shared_preload_libraries`: transactions
and rows come from pg_stat_database instead) and for the cluster (WAL bytes between two `pg_current_wal_lsn()`,
records from pg_stat_wal); the tables most rows were read from (pg_stat_user_tables); the most backends the database
had at once and the connections Postgres refused (from its log, when it is on this machine). The monitoring queries
run on a connection to the `postgres` database, so that they do not count as the bench database's work. Four workers
run at the default `DB_POOL_SIZE` (10, a hard cap per process), which keeps one web process and four workers inside
Postgres's default `max_connections` (100).

This machine has 2 cores: with 2 and 4 workers, the workers, the web process, Postgres and this process (the load,
the Slack emulator, the fake LLM) share them, so those figures measure contention, not scale-out; the per-core
figures (CPU per message) are what carries over to a machine with more cores.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import NullPool

from agents.db.url import async_url
from bench.cpu import LATENCY_S, SETUPS, Burst, customers, quiet
from bench.inflight import rss_mb
from bench.live import Live, live_bot, machine_cpu_s, paused_gc, postgres_cpu_s, print_afterwards, process_cpu_s
from bench.setup import RESULTS, run_benchmark, section, summary
from bench.tables import scale as scale_table
from fakes.openai_server import FakeReply, RecordedRequest, reply, slow
from harness.slack import deliver

STATS = (
    "xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted", "tup_fetched", "tup_returned",
    "blks_hit", "blks_read",
)  # fmt: skip
"""pg_stat_database's counters taken per message."""
TABLE_STATS = ("seq_scan", "seq_tup_read", "idx_scan", "idx_tup_fetch", "n_tup_ins", "n_tup_upd", "n_tup_del")
TOP_TABLES = 6
"""pg_stat_user_tables' counters of the TOP_TABLES most read tables, per message."""
REFUSED = b"too many clients already"
"""Postgres's message when a connection would exceed `max_connections`."""
STATS_FLUSH_S = 1.5
"""Backends report their statistics at most once a second, when idle: wait that long after the burst."""


@dataclass(frozen=True)
class Configuration:
    setup: str
    workers: int
    pool: int | None = None
    """`DB_POOL_SIZE` of every process; None: the default."""

    @property
    def label(self) -> str:
        pool = "" if self.pool is None else f", DB_POOL_SIZE={self.pool}"
        return f"{self.setup}: 1 web + {self.workers} worker{'s' if self.workers > 1 else ''}{pool}"


def plan(quick: bool) -> tuple[list[Configuration], Burst]:
    if quick:
        return [Configuration(s, n) for s in SETUPS for n in (1, 2)], Burst("40 in 2", 40, 2)
    return [Configuration(s, n) for s in SETUPS for n in (1, 2, 4)], Burst("300 in 6", 300, 6)


class Database:
    """Snapshots of the bench database's statistics and the cluster's WAL, over a connection to `postgres`."""

    def __init__(self, database_url: str) -> None:
        url = make_url(async_url(database_url))
        self.name = url.database
        self.engine = create_async_engine(url.set(database="postgres"), poolclass=NullPool)
        self.own = create_async_engine(url, poolclass=NullPool)
        """For the tables' statistics, which only a connection to the bench database sees (one transaction each)."""
        self.conn: AsyncConnection | None = None
        self.log: Path | None = None

    async def __aenter__(self) -> Database:
        self.conn = await self.engine.connect()
        # Statistics are cached for the length of a transaction: each snapshot must be a transaction of its own.
        await self.conn.execution_options(isolation_level="AUTOCOMMIT")
        await self.find_log()
        return self

    async def __aexit__(self, *_: object) -> None:
        if self.conn is not None:
            await self.conn.close()
        await self.engine.dispose()
        await self.own.dispose()

    async def tables(self) -> dict[str, dict[str, int]]:
        """Scans and rows read and written per table (pg_stat_user_tables)."""
        async with self.own.connect() as conn:
            rows = await conn.execute(text(f"SELECT relname, {', '.join(TABLE_STATS)} FROM pg_stat_user_tables"))
            return {r[0]: dict(zip(TABLE_STATS, (int(v or 0) for v in r[1:]), strict=True)) for r in rows}

    async def snapshot(self) -> dict[str, Any]:
        assert self.conn is not None
        row = (
            await self.conn.execute(
                text(f"SELECT {', '.join(STATS)} FROM pg_stat_database WHERE datname = :name"), {"name": self.name}
            )
        ).one()
        wal = (await self.conn.execute(text("SELECT pg_current_wal_lsn()::text, wal_records FROM pg_stat_wal"))).one()
        return dict(zip(STATS, (int(v) for v in row), strict=True)) | {"lsn": wal[0], "wal_records": int(wal[1])}

    async def backends(self) -> int:
        assert self.conn is not None
        found = await self.conn.scalar(
            text("SELECT count(*) FROM pg_stat_activity WHERE datname = :name"), {"name": self.name}
        )
        return int(found or 0)

    async def find_log(self) -> None:
        """The server's log, when it is on this machine and readable (the embedded Postgres writes `log` in its
        data folder), for the connections it refused."""
        assert self.conn is not None
        current = await self.conn.scalar(text("SELECT pg_current_logfile()"))
        folder = await self.conn.scalar(text("SHOW data_directory"))
        path = Path(folder or "") / (current or "log")
        self.log = path if path.is_file() else None

    def log_size(self) -> int:
        return 0 if self.log is None else self.log.stat().st_size

    def refused_since(self, offset: int) -> int | None:
        """Connections refused for want of `max_connections` since the log was `offset` bytes long."""
        if self.log is None:
            return None
        with self.log.open("rb") as f:
            f.seek(offset)
            return f.read().count(REFUSED)

    async def max_connections(self) -> int:
        assert self.conn is not None
        return int(await self.conn.scalar(text("SHOW max_connections")) or 0)


def busiest(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], n: int) -> dict[str, Any]:
    """The tables most rows were read from (sequential scans and index fetches), their figures per message."""
    per = {
        table: {k: round((v - before.get(table, {}).get(k, 0)) / n, 1) for k, v in figures.items()}
        for table, figures in after.items()
    }
    ranked = sorted(per.items(), key=lambda item: item[1]["seq_tup_read"] + item[1]["idx_tup_fetch"], reverse=True)
    return dict(ranked[:TOP_TABLES])


def lsn_bytes(lsn: str) -> int:
    """A WAL location ("16/B374D848") as a byte position: pg_wal_lsn_diff's arithmetic."""
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


def cpu_now(live: Live) -> dict[str, float | None]:
    web, workers = live.bot, live.bots[:-1]
    found = [process_cpu_s(w.proc.pid) for w in workers]
    machine = machine_cpu_s()
    return {
        "at": time.monotonic(),
        "web": process_cpu_s(web.proc.pid),
        "workers": None if None in found else sum(f or 0.0 for f in found),
        "postgres": postgres_cpu_s(live.postmaster),
        "bench_process": time.process_time(),
        "machine": None if machine is None else machine[0],
    }


async def all_quiet(live: Live) -> None:
    await asyncio.gather(*(quiet(b.proc.pid) for b in live.bots))


async def burst(live: Live, db: Database, b: Burst, tag: str) -> dict[str, Any]:
    """The burst's customers at once, through the web process; the answers, CPU and database work until quiet."""
    said = customers(live, b, tag)
    answer = {s.text: f"answer: {s.text}" for s in said}
    for text_ in answer.values():
        live.watcher.expect(post=text_)
    await all_quiet(live)
    await asyncio.sleep(STATS_FLUSH_S)
    tables_before = await db.tables()
    stats_before, cpu_before, log_at = await db.snapshot(), cpu_now(live), db.log_size()
    started = time.monotonic()
    peak_backends, peak_rss = 0, dict.fromkeys(("web", "worker"), 0.0)
    with paused_gc():
        await asyncio.gather(*(deliver(live.emulator, s) for s in said))
        sent = time.monotonic()
        polls = 0
        while live.watcher.awaited_posts and time.monotonic() - started < 120 + 3 * LATENCY_S * b.customers:
            live.watcher.scan()
            live.check_alive()
            if polls % 10 == 0:  # every 0.2 s: the query is Postgres work too
                peak_backends = max(peak_backends, await db.backends())
                peak_rss["web"] = max(peak_rss["web"], rss_mb(live.bot.proc.pid))
                for w in live.bots[:-1]:
                    peak_rss["worker"] = max(peak_rss["worker"], rss_mb(w.proc.pid))
            polls += 1
            await asyncio.sleep(0.02)
        await all_quiet(live)
    cpu_after = cpu_now(live)
    await asyncio.sleep(STATS_FLUSH_S)
    stats_after, tables_after = await db.snapshot(), await db.tables()
    live.watcher.scan()
    times = [at - started for s in said if (at := live.watcher.posted_at(answer[s.text])) is not None]
    posts = Counter(len(live.watcher.posts.get(a, [])) for a in answer.values())
    last = max(times) if times else None
    n = b.customers
    span = (cpu_after["at"] or 0.0) - (cpu_before["at"] or 0.0)

    def ms_per_message(kind: str) -> float | None:
        a, z = cpu_before[kind], cpu_after[kind]
        return None if a is None or z is None else round((z - a) * 1000 / n, 2)

    def busy_cores(kind: str) -> float | None:
        a, z = cpu_before[kind], cpu_after[kind]
        return None if a is None or z is None or span <= 0 else round((z - a) / span, 2)

    cores = {k: busy_cores(k) for k in ("web", "workers", "postgres", "bench_process")}
    # What the rest of the machine used (the colleagues' jobs): the figures are disturbed when it is much.
    machine, known = busy_cores("machine"), sum(v or 0.0 for v in cores.values())
    wal = lsn_bytes(stats_after["lsn"]) - lsn_bytes(stats_before["lsn"])
    per_message = {k: round((stats_after[k] - stats_before[k]) / n, 2) for k in (*STATS, "wal_records")}
    return {
        "burst": b.name,
        "customers": n,
        "channels": b.channels,
        "answered_once": posts[1],
        "answered_more_than_once": sum(c for k, c in posts.items() if k > 1),
        "unanswered": posts[0],
        "send_s": round(sent - started, 3),
        "event_to_reply_s": summary(times),
        "last_answer_s": None if last is None else round(last, 3),
        "messages_per_s": None if not last else round(n / last, 1),
        "cpu_ms_per_message": {k: ms_per_message(k) for k in ("web", "workers", "postgres", "bench_process")},
        "busy_cores": cores | {"other": None if machine is None else round(max(0.0, machine - known), 2)},
        "cpu_span_s": round(span, 2),
        "database_per_message": per_message | {"wal_bytes": round(wal / n)},
        "tables_per_message": busiest(tables_before, tables_after, n),
        "peak_backends": peak_backends,
        "connections_refused": db.refused_since(log_at),
        "peak_rss_mb": {k: round(v, 1) for k, v in peak_rss.items()},
    }


def answer_after_latency(request: RecordedRequest) -> FakeReply:
    return slow(LATENCY_S, reply(f"answer: {request.last_user}"))


async def configuration(server_url: str, c: Configuration, b: Burst) -> dict[str, Any]:
    section(f"{c.label}, {b.name}")
    setup, workers = c.setup, c.workers
    settings = SETUPS[setup] | ({} if c.pool is None else {"db_pool_size": c.pool})
    roles = [settings | {"process_role": "worker"}] * workers + [settings | {"process_role": "web"}]
    # The emulator delivers to the last process started: the web one.
    async with live_bot(server_url, answer_after_latency, *roles) as live, Database(live.database_url) as db:
        max_connections = await db.max_connections()
        tag = f"{setup}_{workers}_{c.pool or 'default'}"
        warm = await burst(live, db, Burst("warm-up", 1, 1), f"{tag}_warm")
        single = await burst(live, db, Burst("single", 1, 1), f"{tag}_single")
        crowd = await burst(live, db, b, f"{tag}_crowd")
    last, alone = crowd["last_answer_s"], single["last_answer_s"]
    crowd["last_vs_single"] = round(last / alone, 2) if last and alone else None
    result = {
        "setup": setup,
        "workers": workers,
        "db_pool_size": c.pool,
        "max_connections": max_connections,
        "warm_up_s": warm["last_answer_s"],
        "single_s": alone,
        "burst": crowd,
        "afterwards": live.afterwards,
    }
    cpu, dbm = crowd["cpu_ms_per_message"], crowd["database_per_message"]
    print(
        f"{crowd['answered_once']}/{b.customers} answered once, last after {last} s ({crowd['last_vs_single']}× the "
        f"single turn's {alone} s), {crowd['messages_per_s']} messages/s; CPU ms per message: web {cpu['web']}, "
        f"workers {cpu['workers']}, Postgres {cpu['postgres']}, this process {cpu['bench_process']}; busy cores "
        f"{crowd['busy_cores']}",
        flush=True,
    )
    print(
        f"database per message: {dbm['xact_commit']} commits, {dbm['xact_rollback']} rollbacks, rows inserted "
        f"{dbm['tup_inserted']}, updated {dbm['tup_updated']}, deleted {dbm['tup_deleted']}, fetched "
        f"{dbm['tup_fetched']}, WAL {dbm['wal_bytes']} bytes in {dbm['wal_records']} records; peak backends "
        f"{crowd['peak_backends']} (max_connections {max_connections}), connections refused "
        f"{crowd['connections_refused']}",
        flush=True,
    )
    print_afterwards(live.afterwards)
    return result


async def run(server_url: str, quick: bool) -> dict[str, Any]:
    configurations, b = plan(quick)
    runs = [await configuration(server_url, c, b) for c in configurations]
    report = {
        "llm_latency_s": LATENCY_S,
        "burst": {"customers": b.customers, "channels": b.channels},
        "settings": {name: {k: str(v) for k, v in s.items()} for name, s in SETUPS.items()},
        "runs": runs,
    }
    section("summary")
    print(scale_table(report).markdown())
    return report


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    return run_benchmark("scale", quick, results, lambda url: run(url, quick))
