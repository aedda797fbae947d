"""Faults of whole bot processes (issue 26): real `python -m bot serve` processes against the Slack emulator and the
fake LLM, loopback only, each scenario bounded in time.

    process frozen    two processes (PROCESS_ROLE=all) on one database, leases of LEASE_SECONDS. N customers write
                      at once; at the first answer (the rest mid-turn) the process holding the most turn leases
                      (counted in the database) is frozen with SIGSTOP, once it holds a send lease too if that comes
                      within SEND_WAIT_S, for STOP_LEASES x LEASE_SECONDS: its turn and send leases run out and the
                      other process takes its conversations over; then SIGCONT. Slack's events go to the process
                      that is up (as a load balancer's health check would have it). Figures: replies per thread
                      (every message answered exactly once), seconds from the stop to the last answer (about
                      LEASE_SECONDS), what the database held for the frozen process meanwhile (transactions left
                      open, statements waiting behind their locks), and the evidence that its stale work was
                      fenced: its "lost the lease" warnings (turns it had in flight, committed by nobody), the model
                      calls the other made again, in-doubt posts looked for, rows tried twice, what it posted after
                      resuming. A duplicate is traced to its outbox row: the same row posted twice, the second after
                      the resume, its attempt recorded and unsent at the freeze, is the gap `bot/delivery/sender.py`
                      admits.
    worker killed     PROCESS_ROLE=web and PROCESS_ROLE=worker as separate processes (as the Procfile runs them).
                      The worker is killed (SIGKILL) mid-wave; customers keep writing (one every STREAM_SPACING_S)
                      while the web process alone takes Slack's events, for GAP_S and a new worker's start. Every
                      message answered exactly once; nothing answered while no worker runs; the seconds from the kill
                      to the last answer (at most LEASE_SECONDS: the dead worker's leases run out first).
    web killed        the same pair; the web process is killed (SIGKILL) mid-wave while customers keep writing.
                      Deliveries Slack makes while it is down fail; Slack retries a failed delivery at once, then
                      after 1 and 5 minutes (X-Slack-Retry-Num 1, 2, 3): here the immediate retry is made (and
                      fails too), and the one-minute retry is made as soon as the new web process is up (the
                      emulator has no scheduler of its own for retries, so the bench sends them with its `deliver`,
                      the same event id and the retry headers). Every message answered exactly once, those first
                      refused included; the worker answers throughout (answers posted while no web process runs).

The last column of the summary counts from the SIGSTOP, from the worker's kill, and from the new web process's
being up (the redelivery). About 70 s (65 s with --quick) on 2 cores; `python -m bench.fault_processes`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg  # type: ignore[import-untyped]

from agents.db.url import libpq_dsn
from bench.fault_scene import (
    CHANNEL,
    LEASE_SECONDS,
    LLM_LATENCY_S,
    QUIET_S,
    Scene,
    answer_to,
    last_post_at,
    mid_wave,
    replies,
    scene,
    tally,
    until,
)
from bench.setup import RESULTS, run_benchmark, section, table
from bench.tables import FAULT_HEADERS, process_faults
from harness.bot import BotProcess
from harness.slack import Sent, deliver, write

STOP_LEASES = 2.0
"""How many leases long the frozen process stays stopped: long enough for every lease it held to run out and be
taken, not so long that the run drags."""
SEND_WAIT_S = 1.5
"""How long the freeze may wait for the frozen process to hold a send lease as well as turn leases (while it
still holds at least two thirds of its turns)."""
GAP_S = 3.0
"""How long no worker (or no web process) runs before a new one is started (which takes a further 2-3 s)."""
STREAM_SPACING_S = 0.25
"""Customers writing on through a process's absence: one message every this often."""
LEASE_LOST = "lost the lease of conversation"
"""What `bot.runtime.workers` logs (WARNING) for a turn whose lease another process took: its result was not
committed."""
RETRY_REASON = "connection_failed"
"""Slack's X-Slack-Retry-Reason for an events URL it could not connect to."""


async def query(s: Scene, sql: str) -> list[Any]:
    """Rows from the scene's database, read beside the bot (the figures' evidence, never a change)."""
    conn = await asyncpg.connect(libpq_dsn(s.database_url))
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


def owner_pid(owner: str) -> int:
    """The process id in a lease owner's name (`agents.leases.process_owner`: host:pid:nonce)."""
    return int(owner.rsplit(":", 2)[1])


async def leases_held(conn: Any) -> dict[int, dict[str, int]]:
    """Live turn and send leases, by the process id holding them (`conn`: an asyncpg connection)."""
    held: dict[int, dict[str, int]] = {}
    turns = "SELECT lease_owner AS owner, count(*) AS n FROM conversations WHERE lease_until > now() GROUP BY 1"
    sends = "SELECT owner, count(*) AS n FROM send_leases WHERE until > now() GROUP BY 1"
    for kind, sql in (("turns", turns), ("sends", sends)):
        for row in await conn.fetch(sql):
            if row["owner"]:
                held.setdefault(owner_pid(row["owner"]), {"turns": 0, "sends": 0})[kind] = row["n"]
    return held


def reactions(s: Scene, said: Sequence[Sent]) -> dict[str, int]:
    """The customers' messages as they end up: ✅ on each, 👀 on none (a courtesy, not a reply: counted, not failed)."""
    shown = [msg.reactions if (msg := s.slack.message(CHANNEL, m.ts)) is not None else {} for m in said]
    return {
        "without_done_reaction": sum("white_check_mark" not in r for r in shown),
        "working_reaction_left": sum("eyes" in r for r in shown),
    }


def reactions_settled(s: Scene, said: Sequence[Sent]) -> bool:
    return not any(reactions(s, said).values())


def answered_by(s: Scene, said: Sequence[Sent]) -> int:
    return sum(bool(r) for r in replies(s.slack, said))


def posts_by_outbox_row(s: Scene) -> dict[int, list[float]]:
    """When each outbox row was posted (successful chat.postMessage calls, by the row id in their metadata)."""
    posted: dict[int, list[float]] = {}
    for call in s.slack.calls:
        if call.method != "chat.postMessage" or call.failed:
            continue
        metadata = call.params.get("metadata")
        payload = metadata.get("event_payload") if isinstance(metadata, dict) else None
        if isinstance(payload, dict) and isinstance(payload.get("outbox_id"), int):
            posted.setdefault(payload["outbox_id"], []).append(call.at)
    return posted


def in_doubt_lookups(s: Scene) -> int:
    """Times a sender looked for a post whose attempt was recorded but never confirmed (`SlackMessenger.find`
    reads with include_all_metadata, which nothing else asks for)."""
    reads = ("conversations.replies", "conversations.history")
    return sum(
        c.method in reads and str(c.params.get("include_all_metadata")).lower() in ("1", "true") for c in s.slack.calls
    )


def log_lines(bot: BotProcess, needle: str) -> int:
    return sum(needle in line for line in bot.log.read_text(errors="replace").splitlines())


def all_answered_at(s: Scene, said: Sequence[Sent]) -> float | None:
    """When the last of `said` got its first answer (a duplicate posted later does not count here)."""
    first: dict[str, float] = {}
    for c in s.slack.calls:
        if c.method == "chat.postMessage" and not c.failed and (thread := c.params.get("thread_ts")) is not None:
            first.setdefault(str(thread), c.at)
    times = [first.get(m.ts) for m in said]
    return None if None in times else max(t for t in times if t is not None)


def last_reaction_at(s: Scene) -> float | None:
    """When the last 👀 or ✅ went on or off: they follow the answer in each conversation's outbox."""
    changes = [c.at for c in s.slack.calls if c.method.startswith("reactions.") and not c.failed]
    return max(changes) if changes else None


def seconds(at: float | None, since: float) -> float | None:
    return None if at is None else round(at - since, 2)


async def first_answers(s: Scene, label: str, customers: int) -> tuple[list[Sent], float, int, Callable[[], int]]:
    """`mid_wave`, but back at the first answer: with two processes running turns, by the time a fifth are
    answered the turns may all be over (on 2 cores), and a freeze then would hold no turn lease."""
    said = [write(s.slack, CHANNEL, f"{label} question {i:03d}") for i in range(customers)]
    started = time.monotonic()
    await asyncio.gather(*(deliver(s.slack, m) for m in said))

    def answered() -> int:
        return answered_by(s, said)

    await until(answered, 60, poll_s=0.005)
    return said, started, sum(m.status == 200 for m in said), answered


async def stopped_process(server_url: str, logs: Path, customers: int) -> dict[str, Any]:
    """SIGSTOP the process holding the most turn leases past its leases, then SIGCONT it: the other process answers
    what it held, each message exactly once, and whatever the resumed process still had in hand is fenced."""
    async with scene(server_url, logs) as s:
        s.fake.rule = answer_to
        bots = [await s.start(lease_seconds=LEASE_SECONDS) for _ in range(2)]
        receiver = bots[-1]  # the emulator delivers to the last started
        said, started, acked, answered = await first_answers(s, "frozen", customers)
        conn = await asyncpg.connect(libpq_dsn(s.database_url))
        try:
            held = await leases_held(conn)

            def holds(bot: BotProcess) -> dict[str, int]:
                return held.get(bot.proc.pid, {"turns": 0, "sends": 0})

            # The one with the most turns in flight: its leases are the ones that must run out and be taken over.
            # On a tie, the one not taking events, so the events URL need not move.
            victim = max(bots, key=lambda b: (holds(b)["turns"], b is not receiver))
            survivor = bots[1 - bots.index(victim)]
            # Frozen while it is sending too (answers of its finished turns going out), if it comes to that soon:
            # then send leases run out as well, and it may be frozen in the middle of a post.
            deadline, turns = time.monotonic() + SEND_WAIT_S, holds(victim)["turns"]
            while not holds(victim)["sends"] and 3 * holds(victim)["turns"] > 2 * turns:
                if time.monotonic() >= deadline:
                    break
                held = await leases_held(conn)
            at_stop = {"stopped": holds(victim), "other": holds(survivor)}
            s.slack.events_url = survivor.events_url
            answered_at_stop, llm_calls_at_stop = answered(), s.fake.calls
            os.kill(victim.proc.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                # Anything it wrote before the stop reaches the emulator within milliseconds.
                await asyncio.sleep(0.5)
                exposed = await frozen_mid_post(conn, victim.proc.pid, posts_by_outbox_row(s))
                blocked = await held_up_while(conn, stopped + STOP_LEASES * LEASE_SECONDS)
                answered_at_resume, llm_calls_at_resume = answered(), s.fake.calls
                held_at_resume = await leases_held(conn)
            finally:
                os.kill(victim.proc.pid, signal.SIGCONT)
        finally:
            await conn.close()
        resumed = time.monotonic()
        complete = await until(lambda: answered() == customers, 3 * LEASE_SECONDS + 30)
        settled = await until(lambda: reactions_settled(s, said), LEASE_SECONDS + 10)
        await asyncio.sleep(QUIET_S)
        figures = tally(s.slack, said)
        last = last_post_at(s.slack)
        for bot in bots:
            bot.check_alive()
        posted = posts_by_outbox_row(s)
        answer_rows = await query(
            s, "SELECT id, attempts, outcome, attempted_at IS NOT NULL AS in_doubt FROM outbox WHERE kind = 'answer'"
        )
        unprocessed = (await query(s, "SELECT count(*) AS n FROM inbound WHERE processed_at IS NULL"))[0]["n"]
        duplicates = traced_duplicates(s, said, posted, {r["id"]: r for r in answer_rows}, stopped, resumed)
        for duplicate in duplicates:
            duplicate["frozen_between_attempt_and_request"] = [i for i in duplicate["outbox_rows"] if i in exposed]
    return {
        "customers": customers,
        "acked": acked,
        "lease_seconds": LEASE_SECONDS,
        "llm_latency_s": LLM_LATENCY_S,
        "stopped_s": round(resumed - stopped, 2),
        "stopped_process": "the one taking events" if victim is receiver else "the one not taking events",
        "leases_at_stop": at_stop,
        "leases_of_stopped_at_resume": held_at_resume.get(victim.proc.pid, {"turns": 0, "sends": 0}),
        "answered_before_stop": answered_at_stop,
        "answered_while_stopped": answered_at_resume - answered_at_stop,
        "llm_calls_before_stop": llm_calls_at_stop,
        "llm_calls_while_stopped": llm_calls_at_resume - llm_calls_at_stop,
        "llm_calls": s.fake.calls,
        "turns_redone_by_other": s.fake.calls - customers,
        **figures,
        "all_answered_in_time": complete,
        "reactions_settled_in_time": settled,
        "stop_to_last_reaction_s": seconds(last_reaction_at(s), stopped),
        "stop_to_last_answer_s": seconds(last, stopped),
        "stop_to_all_answered_s": seconds(all_answered_at(s, said), stopped),
        "resume_to_last_answer_s": seconds(last, resumed),
        "first_event_to_last_answer_s": seconds(last, started),
        "posts_while_stopped": posts_between(s, stopped, resumed),
        # By the resumed process, or late ones by the other: the duplicates below say which mattered.
        "posts_after_resume": posts_between(s, resumed, float("inf")),
        # A reaction is not fenced (it is safe to repeat): the resumed process may still make the ones it had read.
        "reaction_calls_after_resume": sum(
            c.method.startswith("reactions.") and c.at >= resumed for c in s.slack.calls
        ),
        "stale_turns_fenced": log_lines(victim, LEASE_LOST),
        # Frozen mid-commit: the server ended its transaction (agents.db.engine.IDLE_IN_TRANSACTION_S), nothing
        # committed.
        "stale_turns_failed": log_lines(victim, "turn failed"),
        "lease_lost_in_other": log_lines(survivor, LEASE_LOST),
        "errors_in_logs": sum(log_lines(b, "ERROR") + log_lines(b, "Traceback") for b in bots),
        "in_doubt_lookups": in_doubt_lookups(s),
        "answer_rows": len(answer_rows),
        "answer_rows_tried_twice": sum(r["attempts"] > 1 for r in answer_rows),
        "answer_rows_not_sent": sum(r["outcome"] != "sent" for r in answer_rows),
        "answer_rows_posted_twice": sum(len(posted.get(r["id"], ())) > 1 for r in answer_rows),
        "inbound_unprocessed": unprocessed,
        # Attempts it had recorded and not sent when it froze: each is posted by the other process, which finds
        # nothing; the frozen one's request then goes out on SIGCONT (`bot/delivery/sender.py`'s admitted gap).
        "rows_frozen_between_attempt_and_request": len(exposed),
        "answers_first_posted_after_resume": sum(min(times) >= resumed for times in posted.values()),
        "database_while_stopped": blocked,
        "duplicates": duplicates,
        **reactions(s, said),
    }


async def frozen_mid_post(conn: Any, pid: int, posted: dict[int, list[float]]) -> list[int]:
    """Outbox rows whose post attempt the frozen process (`pid`, holding their send leases) has recorded but whose
    request never reached Slack."""
    rows = await conn.fetch(
        "SELECT o.id FROM outbox o JOIN send_leases l ON l.conversation_id = o.conversation_id "
        "WHERE o.attempted_at IS NOT NULL AND o.done_at IS NULL AND split_part(l.owner, ':', 2) = $1",
        str(pid),
    )
    return [r["id"] for r in rows if r["id"] not in posted]


BLOCKED = """
SELECT left(w.query, 80) AS waiting, b.state AS holder_state, left(b.query, 80) AS holder_query,
       extract(epoch FROM now() - b.state_change)::float AS holder_idle_s
FROM pg_stat_activity w CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS blocker(pid)
JOIN pg_stat_activity b ON b.pid = blocker.pid
WHERE w.datname = current_database() AND w.wait_event_type = 'Lock'
"""


OPEN = """
SELECT state, left(query, 80) AS query FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
  AND (state LIKE 'idle in transaction%' OR wait_event = 'ClientRead') AND now() - state_change > interval '1 second'
"""


async def held_up_while(conn: Any, until_s: float, every_s: float = 0.5) -> dict[str, Any]:
    """Until `until_s` (monotonic): transactions left open (a frozen process's: its connection stays up, so the
    server keeps them, and their row locks, however long ago its leases ran out), and the bot's statements waiting
    on a row lock, with what holds it."""
    most_open, most_waiting, waited, longest = 0, 0, 0.0, 0.0
    opened, waits = set[str](), set[str]()
    while (left := until_s - time.monotonic()) > 0:
        await asyncio.sleep(min(every_s, left))
        still, blocked = await conn.fetch(OPEN), await conn.fetch(BLOCKED)
        most_open, most_waiting = max(most_open, len(still)), max(most_waiting, len(blocked))
        waited += every_s if blocked else 0.0
        opened |= {f"{r['state']}: {r['query']}" for r in still}
        for r in blocked:
            longest = max(longest, r["holder_idle_s"])
            waits.add(f"{r['waiting']} <- {r['holder_state']}: {r['holder_query']}")
    return {
        "most_transactions_left_open": most_open,
        "their_last_statements": sorted(opened),
        "most_statements_waiting": most_waiting,
        "seconds_with_a_statement_waiting": waited,
        "longest_holder_idle_s": round(longest, 1),
        "waits": sorted(waits),
    }


def traced_duplicates(
    s: Scene,
    said: Sequence[Sent],
    posted: dict[int, list[float]],
    rows: dict[int, Any],
    stopped: float,
    resumed: float,
) -> list[dict[str, Any]]:
    """Each thread answered more than once, traced to its outbox rows: one row posted twice is a sender's
    duplicate (after the resume: the frozen process's request, sent after the other had looked and posted: the gap
    `bot/delivery/sender.py` admits); two rows are two committed turns (the turn fence failed)."""
    traced = []
    for m in said:
        answers = s.slack.posts(CHANNEL, m.ts)
        if len(answers) < 2:
            continue
        ids = [int(p.metadata["event_payload"]["outbox_id"]) if p.metadata else -1 for p in answers]
        distinct = sorted(set(ids))
        times = {i: [round(at - stopped, 2) for at in posted.get(i, [])] for i in distinct}
        if len(distinct) > 1:
            cause = "two turns committed for one message: the turn fence failed"
        elif any(at >= resumed for at in posted.get(distinct[0], [])):
            cause = "one outbox row posted twice, once after the SIGCONT: the frozen sender's request (outbox gap)"
        else:
            cause = "one outbox row posted twice while the process was stopped or before: not the admitted gap"
        traced.append(
            {
                "message": m.text,
                "outbox_rows": distinct,
                "posted_s_after_stop": times,
                "attempts": {i: rows[i]["attempts"] for i in distinct if i in rows},
                "cause": cause,
            }
        )
    return traced


@dataclass
class Customer:
    """A message delivered as Slack delivers events: retried after a failure (X-Slack-Retry-Num)."""

    sent: Sent
    tries: list[int] = field(default_factory=list)
    """Each delivery's HTTP status, 0 when it could not connect."""

    @property
    def refused(self) -> bool:
        return not self.tries or self.tries[0] != 200

    @property
    def acked(self) -> bool:
        return 200 in self.tries

    async def deliver(self, s: Scene) -> None:
        if not self.tries:
            self.tries.append((await deliver(s.slack, self.sent)).status)
            return
        try:
            retry = len(self.tries)
            self.tries.append(
                (await s.slack.deliver(self.sent.envelope, retry_num=retry, retry_reason=RETRY_REASON)).status
            )
        except (aiohttp.ClientError, TimeoutError):
            self.tries.append(0)


async def stream(s: Scene, label: str, written: list[Customer], until_set: asyncio.Event) -> None:
    """Customers writing one after another into `written`, each failed delivery retried at once (as Slack's first
    retry is), until `until_set`."""
    while not until_set.is_set():
        customer = Customer(write(s.slack, CHANNEL, f"{label} question {len(written):03d}"))
        written.append(customer)
        await customer.deliver(s)
        if not customer.acked:
            await customer.deliver(s)
        await asyncio.sleep(STREAM_SPACING_S)


def posts_between(s: Scene, since: float, before: float) -> int:
    """Successful chat.postMessage calls in that window (the bot's answers: nothing else posts in these scenes)."""
    return sum(c.method == "chat.postMessage" and not c.failed and since < c.at < before for c in s.slack.calls)


async def worker_killed(server_url: str, logs: Path, customers: int) -> dict[str, Any]:
    """PROCESS_ROLE=web and =worker apart; kill -9 the worker mid-wave while customers keep writing to the web
    process; a new worker answers everything, once."""
    async with scene(server_url, logs) as s:
        s.fake.rule = answer_to
        web = await s.start(process_role="web", lease_seconds=LEASE_SECONDS)
        worker = await s.start(events=False, process_role="worker", lease_seconds=LEASE_SECONDS)
        own_monitoring = worker.monitoring_url not in (worker.url, web.monitoring_url)
        events_at_worker = await post_status(worker.events_url)
        said, started, acked, answered = await mid_wave(s, "worker-killed", customers)
        await worker.kill()
        killed = time.monotonic()
        answered_at_kill = answered()
        done, gap = asyncio.Event(), list[Customer]()
        writing = asyncio.create_task(stream(s, "worker-gap", gap, done))
        await asyncio.sleep(GAP_S)
        second = await s.start(events=False, process_role="worker", lease_seconds=LEASE_SECONDS)
        restarted = time.monotonic()
        done.set()
        await writing
        everyone = [*said, *(c.sent for c in gap)]
        for c in gap:
            if not c.acked:  # none expected: the web process was up throughout; Slack would retry them
                await c.deliver(s)
        complete = await until(lambda: answered_by(s, everyone) == len(everyone), 3 * LEASE_SECONDS + 30)
        settled = await until(lambda: reactions_settled(s, everyone), LEASE_SECONDS + 10)
        await asyncio.sleep(QUIET_S)
        figures = tally(s.slack, everyone)
        last = last_post_at(s.slack)
        web.check_alive()
        second.check_alive()
    return {
        "customers": len(everyone),
        "at_once": customers,
        "written_while_no_worker": len(gap),
        "acked": acked + sum(c.acked for c in gap),
        "refused_first": sum(c.refused for c in gap),
        "lease_seconds": LEASE_SECONDS,
        "worker_monitoring_port_of_its_own": own_monitoring,
        "worker_events_endpoint_status": events_at_worker,
        "answered_before_kill": answered_at_kill,
        "posts_while_no_worker": posts_between(s, killed, restarted),
        **figures,
        "all_answered_in_time": complete,
        "reactions_settled_in_time": settled,
        "kill_to_last_reaction_s": seconds(last_reaction_at(s), killed),
        "no_worker_s": round(restarted - killed, 2),
        "kill_to_last_answer_s": seconds(last, killed),
        "restart_to_last_answer_s": seconds(last, restarted),
        "first_event_to_last_answer_s": seconds(last, started),
        "errors_in_logs": sum(log_lines(b, "ERROR") + log_lines(b, "Traceback") for b in (web, second)),
        **reactions(s, everyone),
    }


async def post_status(url: str) -> int:
    """The status a POST gets there: a worker has no /slack/events (404), so nothing can deliver to it by mistake."""
    async with aiohttp.ClientSession() as http, http.post(url, data=b"{}") as response:
        return response.status


async def web_killed(server_url: str, logs: Path, customers: int) -> dict[str, Any]:
    """PROCESS_ROLE=web and =worker apart; kill -9 the web process mid-wave while customers keep writing; the
    deliveries it missed are retried once a new one is up; the worker answers throughout."""
    async with scene(server_url, logs) as s:
        s.fake.rule = answer_to
        web = await s.start(process_role="web", lease_seconds=LEASE_SECONDS)
        worker = await s.start(events=False, process_role="worker", lease_seconds=LEASE_SECONDS)
        # Customers write on one after another while the wave's turns are mid-way, and while it dies.
        done, written = asyncio.Event(), list[Customer]()
        writing = asyncio.create_task(stream(s, "web-gap", written, done))
        said, started, acked, answered = await mid_wave(s, "web-killed", customers)
        await web.kill()
        killed = time.monotonic()
        answered_at_kill, llm_calls_at_kill = answered(), s.fake.calls
        await asyncio.sleep(GAP_S)
        second = await s.start(process_role="web", lease_seconds=LEASE_SECONDS)
        restarted = time.monotonic()
        answered_at_restart, llm_calls_at_restart = answered(), s.fake.calls
        await asyncio.sleep(1.0)  # and go on writing once it is back
        done.set()
        await writing
        # Slack's next retry (a minute after the first) comes once the new process is up.
        missed = [c for c in written if not c.acked]
        await asyncio.gather(*(c.deliver(s) for c in missed))
        redelivered = time.monotonic()
        everyone = [*said, *(c.sent for c in written)]
        complete = await until(lambda: answered_by(s, everyone) == len(everyone), 3 * LEASE_SECONDS + 30)
        settled = await until(lambda: reactions_settled(s, everyone), LEASE_SECONDS + 10)
        await asyncio.sleep(QUIET_S)
        figures = tally(s.slack, everyone)
        last = last_post_at(s.slack)
        worker_up = worker.proc.returncode is None
        worker.check_alive()
        second.check_alive()
        missed_answered = sum(bool(r) for r in replies(s.slack, [c.sent for c in missed]))
    return {
        "customers": len(everyone),
        "at_once": customers,
        "written_around_the_kill": len(written),
        "acked_first_time": acked + sum(not c.refused for c in written),
        "refused_first": sum(c.refused for c in written),
        "refused_by_immediate_retry_too": sum(len(c.tries) > 1 and c.tries[1] != 200 for c in written),
        "redelivered_after_restart": len(missed),
        "redelivery_acked": sum(c.tries[-1] == 200 for c in missed),
        "refused_then_answered": missed_answered,
        "not_acked_at_all": sum(not c.acked for c in written),
        "lease_seconds": LEASE_SECONDS,
        "answered_before_kill": answered_at_kill,
        "answered_while_no_web": answered_at_restart - answered_at_kill,
        "posts_while_no_web": posts_between(s, killed, restarted),
        "llm_calls_while_no_web": llm_calls_at_restart - llm_calls_at_kill,
        "worker_never_exited": worker_up,
        **figures,
        "all_answered_in_time": complete,
        "reactions_settled_in_time": settled,
        "kill_to_last_reaction_s": seconds(last_reaction_at(s), killed),
        "no_web_s": round(restarted - killed, 2),
        "kill_to_last_answer_s": seconds(last, killed),
        "redelivery_to_last_answer_s": seconds(last, redelivered),
        "restart_to_last_answer_s": seconds(last, restarted),
        "first_event_to_last_answer_s": seconds(last, started),
        "errors_in_logs": sum(log_lines(b, "ERROR") + log_lines(b, "Traceback") for b in (worker, second)),
        **reactions(s, everyone),
    }


async def run(server_url: str, quick: bool, logs: Path) -> dict[str, Any]:
    section("a process frozen (SIGSTOP) past its leases, then resumed; another process on the same database")
    frozen = await stopped_process(server_url, logs / "stopped", 20 if quick else 40)
    print(frozen, flush=True)
    section("PROCESS_ROLE=web and =worker apart: the worker killed (SIGKILL) while customers write")
    worker = await worker_killed(server_url, logs / "worker", 15 if quick else 30)
    print(worker, flush=True)
    section("PROCESS_ROLE=web and =worker apart: the web process killed (SIGKILL) while customers write")
    web = await web_killed(server_url, logs / "web", 15 if quick else 30)
    print(web, flush=True)
    result = {"stopped_process": frozen, "worker_killed": worker, "web_killed": web}
    section("summary")
    print(table(FAULT_HEADERS, process_faults(result)))
    return result


def main(*, quick: bool = False, results: Path = RESULTS, logs: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="helpdesk-faults-") as tmp:
        folder = logs or Path(tmp)
        return run_benchmark("faults-processes", quick, results, lambda url: run(url, quick, folder))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.fault_processes", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smaller run to check that it works")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder for the JSON results")
    parser.add_argument("--logs", type=Path, help="keep the bot processes' logs in this folder (the evidence)")
    args = parser.parse_args()
    main(quick=args.quick, results=args.results, logs=args.logs)
