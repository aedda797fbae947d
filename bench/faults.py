"""Faults under load (issue 26): the real bot as `python -m bot serve` against the Slack emulator and the fake
LLM, loopback only, each scenario bounded in time.

    killed worker     N customers write at once, the fake LLM answers each after about a second; the process is
                      killed (SIGKILL) once some answers are out and the rest are mid-turn, holding their leases;
                      a new process starts. Figures: replies per thread (every message answered exactly once),
                      and the seconds from the kill to the last answer (about LEASE_SECONDS: a killed process's
                      conversations wait for their leases to run out).
    provider outage   the fake LLM answers 503 for OUTAGE_S seconds while customers write, one every
                      SPACING_S, then recovers. Every message ends answered or handed to a person (the apology in
                      its thread and a case in the staff channel): none lost, none twice.
    Postgres restart  as for the kill, N customers at once, but the database server is stopped (pg_ctl's fast mode:
                      every connection cut) once some answers are out, and started again DOWN_S later; the bot
                      process stays up. The server is an embedded one of this scenario's own (never the bench's,
                      which BENCH_DATABASE_URL may name). Figures: replies per thread, and the seconds from the
                      server's being back to the last answer (a turn cut mid-commit waits for its lease).
    provider timeout  as for the outage, but the fake LLM answers only after 3 x the bot's OPENAI_TIMEOUT_S
                      (TIMEOUT_S here, 60 s by default) instead of failing: the same outcome is expected.

And, each in a module of its own (runnable alone as `python -m bench.<module>`): Slack answering 5xx and 429
storms and its rate limits (`fault_slack`); a process SIGSTOPped past its lease, and the web and worker processes
killed separately (`fault_processes`); the disk of the database nearly full, and full (`fault_disk`, on a tmpfs it
mounts: root only, else reported as not run).

The last column of the summary counts from the fault's end (the kill, the database back, the provider or Slack
recovered, the disk freed). About 9 minutes (4 with --quick) on 2 cores; `python -m bench faults`.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agents.db.embedded import start_embedded
from bench import fault_disk, fault_processes, fault_slack
from bench.fault_scene import (
    APOLOGY,
    CHANNEL,
    DOWN_S,
    LEASE_SECONDS,
    LLM_LATENCY_S,
    OVERLOADED,
    QUIET_S,
    TIMEOUT_S,
    TOO_LATE,
    answer_to,
    last_post_at,
    mid_wave,
    replies,
    scene,
    tally,
    until,
)
from bench.setup import RESULTS, run_benchmark, section, table
from bench.tables import faults
from fakes.openai_server import FakeReply, RecordedRequest
from harness.bot import STAFF_CHANNEL
from harness.slack import Sent, deliver, write


async def killed_worker(server_url: str, logs: Path, customers: int) -> dict[str, Any]:
    """Kill -9 the only process mid-wave; a new one answers what the first left, each message exactly once."""
    async with scene(server_url, logs) as s:
        s.fake.rule = answer_to
        first = await s.start(lease_seconds=LEASE_SECONDS)
        said, started, acked, answered = await mid_wave(s, "killed-worker", customers)
        await first.kill()
        killed = time.monotonic()
        answered_at_kill, llm_calls_at_kill = answered(), s.fake.calls
        second = await s.start(lease_seconds=LEASE_SECONDS)
        restarted = time.monotonic()
        complete = await until(lambda: answered() == customers, 3 * LEASE_SECONDS + 60)
        await asyncio.sleep(QUIET_S)
        figures = tally(s.slack, said)
        last = last_post_at(s.slack)
        second.check_alive()
    return {
        "customers": customers,
        "acked": acked,
        "lease_seconds": LEASE_SECONDS,
        "llm_latency_s": LLM_LATENCY_S,
        "answered_before_kill": answered_at_kill,
        "llm_calls_before_kill": llm_calls_at_kill,
        **figures,
        "all_answered_in_time": complete,
        "restart_s": round(restarted - killed, 2),
        "kill_to_last_answer_s": None if last is None else round(last - killed, 2),
        "first_event_to_last_answer_s": None if last is None else round(last - started, 2),
    }


@contextmanager
def own_postgres() -> Iterator[tuple[str, Any]]:
    """(URL, pgserver handle) of an embedded Postgres of this scenario's own, in a temporary folder: the restart
    stops and starts only it, never the bench's server (which BENCH_DATABASE_URL may name)."""
    with tempfile.TemporaryDirectory(prefix="helpdesk-faults-pg-") as tmp:
        url, server = start_embedded(Path(tmp), cleanup="delete")
        try:
            yield url, server
        finally:
            server.cleanup()


def restart_postgres(server: Any, down_s: float) -> tuple[float, float]:
    """Stop the server (pg_ctl stop, fast mode: open connections are cut), wait, start it again on the same data
    folder and socket; (stopped at, ready at), monotonic. Blocking: run it in a thread."""
    server.stop()
    stopped = time.monotonic()
    time.sleep(down_s)
    # pgserver's start() would count this process as a second holder of the server (and then never stop it on
    # cleanup): start the postmaster only, under pgserver's lock, as start() does.
    with server._lock:
        server.ensure_postgres_running()
    return stopped, time.monotonic()


async def postgres_restart(logs: Path, customers: int) -> dict[str, Any]:
    """Stop and start the database server mid-wave; every message answered exactly once, none lost."""
    with own_postgres() as (server_url, server):
        async with scene(server_url, logs) as s:
            s.fake.rule = answer_to
            bot = await s.start(lease_seconds=LEASE_SECONDS)
            said, started, acked, answered = await mid_wave(s, "restart", customers)
            answered_at_stop, uri_before = answered(), server.get_uri()
            stopped, ready = await asyncio.to_thread(restart_postgres, server, DOWN_S)
            answered_at_start = answered()
            complete = await until(lambda: answered() == customers, 3 * LEASE_SECONDS + 60)
            await asyncio.sleep(QUIET_S)
            figures = tally(s.slack, said)
            last = last_post_at(s.slack)
            bot.check_alive()
            same_uri = server.get_uri() == uri_before
    return {
        "customers": customers,
        "acked": acked,
        "down_s": DOWN_S,
        "lease_seconds": LEASE_SECONDS,
        "llm_latency_s": LLM_LATENCY_S,
        "same_address_after_restart": same_uri,
        "answered_before_stop": answered_at_stop,
        "answered_while_down": answered_at_start - answered_at_stop,
        **figures,
        "all_answered_in_time": complete,
        "llm_calls": s.fake.calls,
        "stop_to_last_answer_s": None if last is None else round(last - stopped, 2),
        "restart_to_last_answer_s": None if last is None else round(last - ready, 2),
        "first_event_to_last_answer_s": None if last is None else round(last - started, 2),
    }


async def provider_outage(
    server_url: str,
    logs: Path,
    customers: int,
    outage_s: float,
    failure: FakeReply = OVERLOADED,
    **settings: Any,
) -> dict[str, Any]:
    """`failure` (503s, or replies too slow for the bot's timeout) for `outage_s` seconds while customers write,
    spread over a bit more than the outage; then answers."""
    spacing_s = (outage_s + 5) / customers
    async with scene(server_url, logs) as s:
        ends = time.monotonic() + outage_s

        def rule(request: RecordedRequest) -> FakeReply:
            return failure if time.monotonic() < ends else answer_to(request)

        s.fake.rule = rule
        # The bot's own retry policy (OPENAI_MAX_RETRIES unset), not the harness's none.
        bot = await s.start(openai_max_retries=None, **settings)
        ends = time.monotonic() + outage_s  # from the bot's being ready
        started = time.monotonic()
        said: list[Sent] = []
        sent_in_outage = 0
        for i in range(customers):
            message = write(s.slack, CHANNEL, f"outage question {i:03d}")
            sent_in_outage += time.monotonic() < ends
            said.append(await deliver(s.slack, message))
            await asyncio.sleep(max(0.0, started + (i + 1) * spacing_s - time.monotonic()))
        complete = await until(lambda: all(replies(s.slack, said)), 60 + LLM_LATENCY_S * customers)
        await asyncio.sleep(QUIET_S)
        threads = replies(s.slack, said)
        cases = [p for p in s.slack.posts(STAFF_CHANNEL) if not p.thread_ts]
        last = last_post_at(s.slack)
        bot.check_alive()
    answered = sum(r == [f"answer: {m.text}"] for r, m in zip(threads, said, strict=True))
    apologised = sum(r == [APOLOGY] for r in threads)
    # A case names its customer's message in its transcript (CASE_SUMMARY=transcript): one case per apology.
    cases_per_message = [sum(m.text in c.text for c in cases) for m in said]
    return {
        "customers": customers,
        "acked": sum(m.status == 200 for m in said),
        "outage_s": outage_s,
        "spacing_s": round(spacing_s, 2),
        "sent_during_outage": sent_in_outage,
        "answered": answered,
        "handed_to_a_person": apologised,
        "cases": len(cases),
        "cases_naming_their_message": sum(c == 1 for c in cases_per_message),
        "messages_in_two_cases": sum(c > 1 for c in cases_per_message),
        "lost": sum(not r for r in threads),
        "twice_or_more": sum(len(r) > 1 for r in threads),
        "other_replies": sum(bool(r) for r in threads) - answered - apologised,
        "all_settled_in_time": complete,
        "llm_calls": s.fake.calls,
        "recovery_to_last_reply_s": None if last is None else round(last - ends, 2),
        "replies_per_thread": dict(Counter(len(r) for r in threads)),
    }


async def run(server_url: str, quick: bool, logs: Path) -> dict[str, Any]:
    section("a worker killed (SIGKILL) while holding many leases")
    kill = await killed_worker(server_url, logs / "killed", 20 if quick else 50)
    print(kill, flush=True)
    section("the database server stopped and started again mid-wave (a server of this scenario's own)")
    restart = await postgres_restart(logs / "restart", 20 if quick else 100)
    print(restart, flush=True)
    section("the LLM provider failing (503) for a while")
    outage = await provider_outage(server_url, logs / "outage", 10 if quick else 40, 8.0 if quick else 60.0)
    print(outage, flush=True)
    section(f"the LLM provider answering too late (bot timeout {TIMEOUT_S:.0f} s) for a while")
    timeout = await provider_outage(
        server_url, logs / "timeout", 6 if quick else 30, 5.0 if quick else 60.0, TOO_LATE, openai_timeout_s=TIMEOUT_S
    )
    timeout["openai_timeout_s"] = TIMEOUT_S
    timeout["late_reply_after_s"] = TOO_LATE.delay
    print(timeout, flush=True)
    slack = await fault_slack.run(server_url, quick, logs / "slack")
    processes = await fault_processes.run(server_url, quick, logs / "processes")
    disk = await fault_disk.run(logs / "disk", quick)
    own = {"killed_worker": kill, "postgres_restart": restart, "provider_outage": outage, "provider_timeout": timeout}
    result = own | slack | processes | disk
    section("summary")
    summary = faults(result)
    print(table(summary.headers, summary.rows))
    for label, r in (("503s", outage), ("timeouts", timeout)):
        print(f"({label}: {r['cases']} cases in the staff channel for {r['handed_to_a_person']} hand-overs)")
    return result


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="helpdesk-faults-") as tmp:
        return run_benchmark("faults", quick, results, lambda url: run(url, quick, Path(tmp)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smaller run to check that it works")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args()
    main(quick=args.quick, results=args.results)
