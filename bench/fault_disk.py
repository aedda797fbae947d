"""Faults under load (issue 26): the disk of the database nearly full, or full. The real bot (`python -m bot serve`)
against the Slack emulator and the fake LLM, loopback only; Postgres is an embedded one of the scenario's own whose
data folder is on a small tmpfs mounted for it (TMPFS_MB), so that only that file system is ever filled.

    disk nearly full  the bot runs; a filler file takes the tmpfs until FREE_KB are left; then CUSTOMERS write,
                      spread over SPREAD_S, the fake LLM answering each after about a second; the filler is
                      deleted FREE_AT_S after the first message. Postgres refuses to extend its tables once the
                      few pages left are used ("could not extend file", SQLSTATE 53100: an ERROR, the server
                      stays up), and the bot's writes fail: storing events, a turn's statements, the outbox's.
    disk full, PANIC  the same wave, but PANIC_AT_S into it the tmpfs is filled to the last byte and a WAL segment
                      switch (pg_switch_wal) makes the next WAL write need a new segment file: Postgres PANICs,
                      its crash recovery fails for want of space and the server shuts down, with turns mid-way.
                      Once the filler is deleted the bench starts it again, as a supervisor (systemd, a
                      container's restart policy) would; the bot process is never touched.

Slack's side is played as Slack does it, compressed in time: an event answered non-2xx (or not within 3 s) is sent
again at once (X-Slack-Retry-Num 1); the retries Slack makes after 1 and 5 minutes are made here right after the
disk is freed (and the server up again) and RETRY_GAP_S later. A message still refused after those is lost.

Figures: messages, acked the first time, refused and redelivered, answered, handed to a person, exactly once,
twice or more, lost; the seconds from freeing the disk to the last answer; what /healthz (monitoring port) said
during the fault; the bot's warning and error log lines (how many, the first one, the commonest).
The mount needs root and a kernel that allows it: where it cannot be made, each scenario reports
"not run: <reason>", never a pass. About 45 s a scenario, 90 s in all; `python -m bench.fault_disk`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from agents.db.embedded import start_embedded
from bench.fault_scene import (
    APOLOGY,
    CHANNEL,
    LEASE_SECONDS,
    LLM_LATENCY_S,
    QUIET_S,
    Scene,
    answer_to,
    last_post_at,
    replies,
    scene,
    until,
)
from bench.setup import RESULTS, run_benchmark, section, table
from bench.tables import FAULT_HEADERS, disk_faults
from harness.bot import STAFF_CHANNEL, BotProcess
from harness.database import admin
from harness.slack import Sent, write

TMPFS_MB = 160
"""initdb and the migrations take about 45 MB, one WAL segment 16 MB: room for max_wal_size between checkpoints."""
WAL_SETTINGS = {"min_wal_size": "32MB", "max_wal_size": "64MB"}
"""Lowered from 80 MB and 1 GB (ALTER SYSTEM, reloaded), so that WAL kept between checkpoints fits the tmpfs."""
FREE_KB = 64
CUSTOMERS = 30
SPREAD_S = 15.0
FREE_AT_S = 17.0
"""From the wave's start to the filler's deletion: the whole wave, and its immediate retries, meet the fault."""
PANIC_AT_S = 4.0
"""Into the wave, when the disk is filled in the PANIC scenario: some turns are then mid-way (the model answering)."""
ACK_WITHIN_S = 3.0
"""Slack counts a delivery unanswered after 3 s as failed, and retries it."""
RETRY_GAP_S = 3.0
"""Between the two later retries (Slack: 1 minute, then 5)."""
HEALTH_EVERY_S = 0.5
QUOTED = re.compile(r'"[^"]*"')
DISK_WORDS = ("no space left", "diskfull", "could not extend", "could not write")


class NotRun(Exception):
    """The scenario cannot be set up on this machine (no root, no tmpfs mount): reported, never passed."""


@dataclass
class Tmpfs:
    path: Path

    def free(self) -> int:
        return shutil.disk_usage(self.path).free

    def fill(self, filler: Path, leave: int) -> int:
        """Write `filler` until `leave` bytes are free (or the file system says none are); what is left."""
        if filler.parent != self.path or not _is_our_tmpfs(self.path):
            raise RuntimeError(f"refusing to fill {filler}: not on the scenario's own tmpfs")
        chunk = b"\0" * (1 << 20)
        with filler.open("ab") as out:
            while (room := self.free() - leave) > 0:
                try:
                    out.write(chunk[: min(len(chunk), room)])
                    out.flush()
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        return self.free()


def _is_our_tmpfs(path: Path) -> bool:
    with open("/proc/mounts") as mounts:
        return any(f"{line.split()[1]} {line.split()[2]}" == f"{path} tmpfs" for line in mounts)


def _mount(path: Path, size_mb: int) -> None:
    if os.geteuid() != 0:
        raise NotRun("mounting a tmpfs needs root")
    if shutil.which("mount") is None:
        raise NotRun("no mount command")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(path)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise NotRun(f"mount -t tmpfs failed: {said[0] if said else done.returncode}")
    if not _is_our_tmpfs(path):
        raise NotRun(f"{path} is not a tmpfs after mounting it")


def _unmount(path: Path) -> None:
    for _ in range(10):
        if not _is_our_tmpfs(path):
            return
        if subprocess.run(["umount", str(path)], capture_output=True, timeout=30).returncode == 0:
            return
        time.sleep(0.5)  # a postgres process still closing its files
    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


@contextlib.contextmanager
def postgres_on_tmpfs(size_mb: int = TMPFS_MB) -> Iterator[tuple[str, Any, Tmpfs]]:
    """(URL, pgserver handle, the tmpfs) of an embedded Postgres of the scenario's own, its data folder on a tmpfs
    mounted here; stopped and unmounted on the way out, whatever happened."""
    folder = Path(tempfile.mkdtemp(prefix="helpdesk-faults-disk-"))
    server: Any = None
    try:
        _mount(folder, size_mb)
        url, server = start_embedded(folder, cleanup="delete")
        settings = "".join(f"ALTER SYSTEM SET {k} = '{v}';" for k, v in WAL_SETTINGS.items())
        server.psql(f"{settings} SELECT pg_reload_conf();")
        yield url, server, Tmpfs(folder)
    finally:
        with contextlib.suppress(FileNotFoundError):
            (folder / "filler").unlink()
        if server is not None:
            server.cleanup()
        _unmount(folder)
        with contextlib.suppress(OSError):
            folder.rmdir()


def postmaster_running(server: Any) -> bool:
    info = server.get_postmaster_info()
    return bool(info.is_running()) and (Path(server.pgdata) / "postmaster.pid").exists()


def start_again(server: Any) -> float:
    """Start the postmaster on the same data folder, as a supervisor would (see faults.restart_postgres: under
    pgserver's lock, without counting this process as a second holder); when it was ready, monotonic."""
    with server._lock:
        server.ensure_postgres_running()
    return time.monotonic()


@dataclass
class Customer:
    sent: Sent
    statuses: list[int] = field(default_factory=list)
    """One per delivery of its event: the first, then Slack's retries; 0 for no answer within ACK_WITHIN_S."""

    @property
    def acked(self) -> bool:
        return bool(self.statuses) and 200 <= self.statuses[-1] < 300


async def send(s: Scene, customer: Customer, retry: int) -> None:
    """One delivery of the customer's event, as Slack makes it (retries carry the same event_id)."""
    extra: dict[str, Any] = {} if retry == 0 else {"retry_num": retry, "retry_reason": "http_error"}
    try:
        result = await asyncio.wait_for(s.slack.deliver(customer.sent.envelope, **extra), ACK_WITHIN_S)
        customer.statuses.append(result.status)
    except (aiohttp.ClientError, TimeoutError):
        customer.statuses.append(0)


async def watch_health(bot: BotProcess, samples: list[tuple[float, int, str]], stop: asyncio.Event) -> None:
    """/healthz every HEALTH_EVERY_S: (when, HTTP status, its `database` field), until `stop`."""
    timeout = aiohttp.ClientTimeout(total=2)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while not stop.is_set():
            at = time.monotonic()
            try:
                async with http.get(f"{bot.monitoring_url}/healthz") as answer:
                    body = json.loads(await answer.text())
                    samples.append((at, answer.status, str(body.get("database"))))
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                samples.append((at, 0, f"no answer: {type(exc).__name__}"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), HEALTH_EVERY_S)


def health_figures(samples: list[tuple[float, int, str]], fault: float, freed: float) -> dict[str, Any]:
    during = [(status, db) for at, status, db in samples if fault <= at < freed]
    unhealthy = [at for at, status, _ in samples if at >= fault and status != 200]
    healthy_after = [at for at, status, _ in samples if at >= freed and status == 200]
    return {
        "samples_during_fault": len(during),
        # File names left out, so that one error reads as one: the first in full.
        "during_fault": dict(Counter(f"{status} database=" + QUOTED.sub("<file>", db) for status, db in during)),
        "first_unhealthy": next((f"{status} database={db}" for status, db in during if status != 200), None),
        "first_unhealthy_after_fault_s": round(unhealthy[0] - fault, 2) if unhealthy else None,
        "healthy_again_after_free_s": round(healthy_after[0] - freed, 2) if healthy_after else None,
    }


def log_figures(log: Path, since: float) -> dict[str, Any]:
    """The bot's WARNING and ERROR records (LOG_FORMAT=json) from `since` (time.time(): records carry UTC times)."""
    records: list[dict[str, Any]] = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("level") in ("WARNING", "ERROR", "CRITICAL"):
                records.append(record)

    def at(record: dict[str, Any]) -> float:
        return datetime.fromisoformat(str(record.get("time", "")).replace("Z", "+00:00")).timestamp()

    records = [r for r in records if at(r) >= since]

    def last_line(record: dict[str, Any]) -> str:
        """The message, and the last line of its traceback that says what went wrong (SQLAlchemy ends with a
        link, and wraps the driver's error in its own)."""
        trace = [t for t in str(record.get("exc_info") or "").strip().splitlines() if t and not t.startswith("(")]
        said = next((t for t in reversed(trace) if any(w in t.lower() for w in DISK_WORDS)), trace[-1] if trace else "")
        return f"{record.get('message')}" + (f" | {said.strip()[:240]}" if said else "")

    about_disk = [r for r in records if any(w in last_line(r).lower() for w in DISK_WORDS)]
    return {
        "warnings_and_errors": len(records),
        "naming_the_disk": len(about_disk),
        "first": last_line(records[0]) if records else None,
        "first_naming_the_disk": last_line(about_disk[0]) if about_disk else None,
        "commonest": Counter(str(r.get("message"))[:90] for r in records).most_common(5),
    }


async def disk_fault(logs: Path, *, panic: bool, customers: int = CUSTOMERS) -> dict[str, Any]:
    """Fill the database's disk (leaving FREE_KB, or nothing and forcing a WAL PANIC) while customers write; free
    it; every message answered or handed to a person, exactly once, none lost."""
    label = "disk-full" if panic else "disk-nearly-full"
    try:
        with postgres_on_tmpfs() as (server_url, server, disk):
            return await _disk_fault(server_url, server, disk, logs, label, panic, customers)
    except NotRun as exc:
        return {"customers": customers, "not_run": str(exc)}


async def _disk_fault(
    server_url: str, server: Any, disk: Tmpfs, logs: Path, label: str, panic: bool, customers: int
) -> dict[str, Any]:
    async with scene(server_url, logs) as s:
        s.fake.rule = answer_to
        bot = await s.start(lease_seconds=LEASE_SECONDS, log_format="json")
        samples: list[tuple[float, int, str]] = []
        stop_health = asyncio.Event()
        health = asyncio.create_task(watch_health(bot, samples, stop_health))
        free_before = disk.free()
        said = [write(s.slack, CHANNEL, f"{label} question {i:03d}") for i in range(customers)]
        wave = [Customer(m) for m in said]
        fault_at = PANIC_AT_S if panic else 0.0

        async def first_and_immediate(customer: Customer, at: float) -> None:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            await send(s, customer, 0)
            if not customer.acked:
                await send(s, customer, 1)

        started = time.monotonic()
        spacing = SPREAD_S / customers
        sending = asyncio.gather(*(first_and_immediate(c, started + i * spacing) for i, c in enumerate(wave)))
        await asyncio.sleep(fault_at)
        fault, wall_fault = time.monotonic(), time.time()
        answered_before_fault = sum(bool(r) for r in replies(s.slack, said))
        left = await asyncio.to_thread(disk.fill, disk.path / "filler", 0 if panic else FREE_KB * 1024)
        panic_error = await force_wal_panic(server_url) if panic else None
        await sending
        answered_in_fault = sum(bool(r) for r in replies(s.slack, said))
        postmaster_down = panic and not await asyncio.to_thread(postmaster_running, server)
        await asyncio.sleep(max(0.0, started + FREE_AT_S - time.monotonic()))
        (disk.path / "filler").unlink()
        freed = time.monotonic()
        restarted_at = await asyncio.to_thread(start_again, server) if postmaster_down else None
        for retry in (2, 3):  # Slack's after-1-minute and after-5-minutes retries, compressed
            await asyncio.gather(*(send(s, c, retry) for c in wave if not c.acked))
            await asyncio.sleep(RETRY_GAP_S)

        def settled() -> int:
            return sum(bool(r) for r in replies(s.slack, said))

        complete = await until(lambda: settled() == customers, 3 * LEASE_SECONDS + 30)
        await asyncio.sleep(QUIET_S)
        # /healthz stays unready a few seconds past the last refused write (agents.db.engine.WriteHealth.window_s).
        await until(lambda: bool(samples) and samples[-1][1] == 200, 20)
        stop_health.set()
        await health
        cases = [p for p in s.slack.posts(STAFF_CHANNEL) if not p.thread_ts]
        threads = replies(s.slack, said)
        last = last_post_at(s.slack)
        alive = bot.proc.returncode is None
        bot.check_alive()
    answered = sum(r == [f"answer: {m.text}"] for r, m in zip(threads, said, strict=True))
    apologised = sum(r == [APOLOGY] for r in threads)
    first = [c.statuses[0] for c in wave]
    return {
        "customers": customers,
        "tmpfs_mb": TMPFS_MB,
        "wal_settings": WAL_SETTINGS,
        "free_before_fill_mb": round(free_before / 2**20, 1),
        "free_after_fill_kb": left // 1024,
        "fault_began_s_into_wave": fault_at,
        "fault_s": round(freed - fault, 1),
        "spread_s": SPREAD_S,
        "llm_latency_s": LLM_LATENCY_S,
        "lease_seconds": LEASE_SECONDS,
        "panic": panic_error,
        "postmaster_exited": postmaster_down,
        "restarted_by_bench_s_after_free": None if restarted_at is None else round(restarted_at - freed, 2),
        "acked_first_time": sum(200 <= st < 300 for st in first),
        "first_answers": dict(Counter(str(st) for st in first)),
        "acked_on_immediate_retry": sum(c.acked and len(c.statuses) == 2 for c in wave),
        "refused_until_disk_freed": sum(len(c.statuses) > 2 for c in wave),
        "acked_after_disk_freed": sum(c.acked and len(c.statuses) > 2 for c in wave),
        "never_acked": sum(not c.acked for c in wave),
        "deliveries": sum(len(c.statuses) for c in wave),
        "answered_before_fault": answered_before_fault,
        "answered_by_end_of_wave": answered_in_fault,
        "answered": answered,
        "handed_to_a_person": apologised,
        "cases": len(cases),
        "exactly_once": sum(len(r) == 1 for r in threads),
        "twice_or_more": sum(len(r) > 1 for r in threads),
        "lost": sum(not r for r in threads),
        "other_replies": sum(bool(r) for r in threads) - answered - apologised,
        "all_settled_in_time": complete,
        "bot_alive": alive,
        "llm_calls": s.fake.calls,
        "freed_to_last_answer_s": None if last is None else round(last - freed, 2),
        "health": health_figures(samples, fault, freed),
        "bot_log": log_figures(bot.log, wall_fault),
        "replies_per_thread": dict(Counter(len(r) for r in threads)),
    }


async def force_wal_panic(server_url: str) -> str | None:
    """With the disk full: a WAL record, then a segment switch, so that the next WAL write needs a new segment file
    and cannot create it. Up to a few switches, for segments kept from earlier checkpoints (recycled, already
    there); the first error is what Postgres said (None: it never failed)."""
    for _ in range(6):
        try:
            await admin(server_url, "SELECT pg_logical_emit_message(false, 'disk-full', 'x', true)")
            await admin(server_url, "SELECT pg_switch_wal()")
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return None


async def run(logs: Path, quick: bool) -> dict[str, Any]:
    customers = 12 if quick else CUSTOMERS
    section(f"the database's disk nearly full ({FREE_KB} KB left on its own {TMPFS_MB} MB tmpfs)")
    nearly = await disk_fault(logs / "nearly-full", panic=False, customers=customers)
    print(json.dumps(nearly, indent=1), flush=True)
    section("the database's disk full, a WAL write PANICs")
    full = await disk_fault(logs / "full", panic=True, customers=customers)
    print(json.dumps(full, indent=1), flush=True)
    result = {"disk_nearly_full": nearly, "disk_full": full}
    section("summary")
    print(table(FAULT_HEADERS, disk_faults(result)))
    return result


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    # The bench's own server (BENCH_DATABASE_URL or an embedded one) is started by run_benchmark and left alone:
    # these scenarios fill only a server of their own.
    with tempfile.TemporaryDirectory(prefix="helpdesk-faults-disk-logs-") as tmp:
        return run_benchmark("faults-disk", quick, results, lambda _url: run(Path(tmp), quick))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.fault_disk", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer customers, to check that it works")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args()
    main(quick=args.quick, results=args.results)
