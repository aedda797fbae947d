"""Background work of one bot process: turn workers draining the inbox, and the outbox sender. On start they
pick up whatever an earlier process left unfinished: unprocessed messages and unsent replies."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from agents.conversations import Conversations
from bot.metrics import Metrics
from bot.outbox import OutboxSender

log = logging.getLogger(__name__)


class Workers:
    def __init__(
        self,
        *,
        conversations: Conversations,
        sender: OutboxSender,
        metrics: Metrics,
        turn_workers: int = 4,
        poll_s: float = 1.0,
        housekeeping: list[tuple[Callable[[], Awaitable[object]], float]] | None = None,
    ) -> None:
        self.conversations = conversations
        self.sender = sender
        self.metrics = metrics
        self.turn_workers = turn_workers
        self.poll_s = poll_s
        """Wake-ups reach this process only; other processes' work is found by polling this often."""
        self._turns = asyncio.Event()
        self._sends = asyncio.Event()
        self.housekeeping = housekeeping or []
        """Periodic jobs and their period in seconds (event-id pruning, case reminders)."""
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.ready = False

    def wake_turns(self) -> None:
        # Left set until a loop starts looking for work, so a wake-up that comes while every loop is busy is
        # not lost until the next poll.
        self._turns.set()

    def wake_all(self) -> None:
        self.wake_turns()
        self.wake_sender()

    def wake_sender(self) -> None:
        self._sends.set()

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._turn_loop(), name=f"turns-{i}") for i in range(self.turn_workers)]
        self._tasks.append(asyncio.create_task(self._send_loop(), name="outbox"))
        for job, every_s in self.housekeeping:
            self._tasks.append(asyncio.create_task(self._housekeeping_loop(job, every_s), name="housekeeping"))
        self.ready = True

    async def stop(self, *, grace_s: float = 10.0) -> None:
        """Let each loop finish what it is doing (a turn, a send) and leave; cancel only after the grace
        period. Cancelling mid-transaction is safe for the data, but a driver interrupted mid-query can take
        its connection down with it."""
        self.ready = False
        self._stopping.set()
        if not self._tasks:
            return
        _, late = await asyncio.wait(self._tasks, timeout=grace_s)
        for task in late:
            task.cancel()
        for task in late:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _sleep(self, event: asyncio.Event, seconds: float) -> None:
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._stopping.wait())]
        _, pending = await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        for waiter in pending:
            waiter.cancel()

    async def _turn_loop(self) -> None:
        while not self._stopping.is_set():
            started = time.perf_counter()
            self._turns.clear()
            try:
                result = await self.conversations.process_next()
            except Exception:
                log.exception("turn failed; the message stays queued")
                await self._sleep(self._stopping, self.poll_s)
                continue
            if result is None:
                await self._sleep(self._turns, self.poll_s)
                continue
            self.metrics.processed.labels(result.kind).inc()
            self.metrics.turn_seconds.observe(time.perf_counter() - started)
            self.wake_sender()

    async def _housekeeping_loop(self, job: Callable[[], Awaitable[object]], every_s: float) -> None:
        while not self._stopping.is_set():
            try:
                await job()
            except Exception:
                log.exception("housekeeping failed")
            await self._sleep(self._stopping, every_s)

    async def _send_loop(self) -> None:
        while not self._stopping.is_set():
            self._sends.clear()
            try:
                sent = await self.sender.send_pending()
            except Exception:
                log.exception("outbox pass failed")
                sent = 0
            self.metrics.outbox_sent.inc(sent)
            if sent == 0:
                await self._sleep(self._sends, self.poll_s / 2)
