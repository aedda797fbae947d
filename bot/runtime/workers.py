"""Background work of one bot process: a dispatcher that runs up to `max_turns` conversations at once, each
under its lease, and the outbox sender. On start they pick up whatever an earlier process left unfinished:
unprocessed messages (once their leases expire) and unsent replies.

New work reaches every process at once through Postgres LISTEN/NOTIFY (`Wakeups`: the migrations' triggers
notify on each stored message and outbox row); polling every `poll_s` stays as the fallback, so a listener
that is down (or a pooler that cannot LISTEN) costs latency, never messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import asyncpg  # type: ignore[import-untyped]

from agents.conversations import Conversations, MessageResult
from agents.db.notify import SENDS, TURNS
from agents.db.url import libpq_dsn
from agents.leases import Lease, LeaseLost
from agents.loop import Event
from bot import tracing
from bot.delivery.sender import OutboxSender
from bot.metrics import Metrics

log = logging.getLogger(__name__)

CLAIM_BATCH = 50


class LoopLoad:
    """How late this process's event loop runs, from a ticker's oversleep. Acks cannot wait (Slack retries an
    event after 3 s, and a slow ack holds its sender), turns and sends can (their rows are stored): so work that
    can wait is started only while the loop keeps time, and acks come first when the process is saturated."""

    def __init__(self, *, period_s: float = 0.005, late_s: float = 0.015, max_wait_s: float = 1.0) -> None:
        self.period_s = period_s
        self.late_s = late_s
        self.max_wait_s = max_wait_s
        """Waiting is bounded, so a loop that is late for other reasons never stops the work."""
        self.lag_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._tick(), name="loop-load")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.period_s)
            late = loop.time() - before - self.period_s
            # Up at once, down gently: one on-time tick after a stall does not mean the backlog is gone.
            self.lag_s = late if late > self.lag_s else 0.7 * self.lag_s + 0.3 * late

    async def calm(self) -> None:
        """Return once the loop keeps time again (or after `max_wait_s`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s  # by the clock: each sleep overruns by the very lag waited out
        while loop.time() < deadline:
            if self.lag_s <= self.late_s:
                return
            await asyncio.sleep(self.period_s)


class Wakeups:
    """A dedicated connection (outside the pool) that LISTENs for new work and calls back; reconnects after a
    loss. Behind a pooler in transaction mode LISTEN does not work: set `url` to a direct connection there,
    or leave it None to rely on polling."""

    def __init__(self, url: str | None, callbacks: dict[str, Callable[[], None]]) -> None:
        self.url = url
        self.callbacks = callbacks
        self._task: asyncio.Task[None] | None = None
        self.listening = False

    async def start(self) -> None:
        if self.url is not None:
            self._task = asyncio.create_task(self._run(), name="wakeups")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        assert self.url is not None
        dsn = libpq_dsn(self.url)
        while True:
            try:
                conn = await asyncpg.connect(dsn)
            except Exception as exc:
                log.warning("cannot LISTEN for new work (%s); polling meanwhile", exc)
                await asyncio.sleep(5)
                continue
            try:
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _, lost=lost: lost.set())
                for channel, callback in self.callbacks.items():
                    await conn.add_listener(channel, lambda *_, wake=callback: wake())
                self.listening = True
                for callback in self.callbacks.values():
                    callback()  # anything stored while no one listened
                while not lost.is_set():
                    # A connection that died silently (no FIN) is found by using it.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), timeout=30)
                    if not lost.is_set():
                        await asyncio.wait_for(conn.execute("SELECT 1"), timeout=10)
                log.warning("the LISTEN connection was lost; reconnecting")
                await asyncio.sleep(1)  # a server going away drops every new connection too: no tight loop
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("the LISTEN connection failed (%s); reconnecting", exc)
                await asyncio.sleep(1)
            finally:
                self.listening = False
                with contextlib.suppress(Exception):
                    await conn.close()


class TurnProgress(Protocol):
    """One leased run of a conversation's turns, shown while it works."""

    async def on_event(self, event: Event) -> None: ...

    def finish(self, results: Sequence[MessageResult]) -> None:
        """After the run: clear what no reply will."""
        ...


class Progress(Protocol):
    """What shows a turn's progress where the channel can (Slack's AI status, `bot.slack.ai_status`)."""

    def turn(self) -> TurnProgress: ...

    async def drain(self) -> None:
        """Let the last updates go out before the process stops."""
        ...


def _fan_out(shown: Sequence[TurnProgress]) -> Callable[[Event], Awaitable[None]] | None:
    """One event sink for every progress of a run (none for none)."""
    if not shown:
        return None
    if len(shown) == 1:
        return shown[0].on_event

    async def on_event(event: Event) -> None:
        for one in shown:
            await one.on_event(event)

    return on_event


class Doorbell:
    """What wakes this process's workers: rung by what queues work here (intake storing a message, the case desk
    changing a case) and, through NOTIFY, by the other processes. It exists before the workers, so everything that
    rings it can be built first."""

    def __init__(self) -> None:
        self.turns = asyncio.Event()
        self.sends = asyncio.Event()

    def ring_turns(self) -> None:
        # Left set until the dispatcher looks for work, so a ring while it is busy is not lost.
        self.turns.set()

    def ring_sender(self) -> None:
        self.sends.set()

    def ring_all(self) -> None:
        self.ring_turns()
        self.ring_sender()


class Workers:
    def __init__(
        self,
        *,
        conversations: Conversations,
        sender: OutboxSender,
        metrics: Metrics,
        max_turns: int = 256,
        poll_s: float = 1.0,
        listen_url: str | None = None,
        housekeeping: list[tuple[Callable[[], Awaitable[object]], float]] | None = None,
        enabled: bool = True,
        progress: Sequence[Progress] = (),
        doorbell: Doorbell | None = None,
    ) -> None:
        self.conversations = conversations
        self.sender = sender
        self.metrics = metrics
        self.max_turns = max_turns
        """Conversations this process runs at once; independent of the connection pool, since no turn holds a
        connection while its model answers."""
        self.poll_s = poll_s
        self.doorbell = doorbell or Doorbell()
        self._turns, self._sends = self.doorbell.turns, self.doorbell.sends
        self.wakeups = Wakeups(listen_url, {TURNS: self.wake_turns, SENDS: self.wake_sender})
        self.housekeeping = housekeeping or []
        """Periodic jobs and their period in seconds (event-id pruning, case reminders)."""
        self._stopping = asyncio.Event()
        self.load = LoopLoad()
        self._tasks: list[asyncio.Task[None]] = []
        self._running: set[asyncio.Task[None]] = set()
        self.enabled = enabled
        """False in a process that only receives (PROCESS_ROLE=web): nothing runs here, the workers elsewhere
        are woken by the database (NOTIFY)."""
        self.ready = False
        self.progress = tuple(progress)
        """What shows a turn while it works (Slack's AI status, the answer streamed); none: the reactions or typing
        alone do."""

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def wake_turns(self) -> None:
        self.doorbell.ring_turns()

    def wake_all(self) -> None:
        self.doorbell.ring_all()

    def wake_sender(self) -> None:
        self.doorbell.ring_sender()

    async def start(self) -> None:
        if not self.enabled:
            self.ready = True
            return
        await self.wakeups.start()
        self.load.start()
        self._tasks = [
            asyncio.create_task(self._dispatch_loop(), name="turns"),
            asyncio.create_task(self._send_loop(), name="outbox"),
        ]
        for job, every_s in self.housekeeping:
            self._tasks.append(asyncio.create_task(self._housekeeping_loop(job, every_s), name="housekeeping"))
        self.ready = True

    async def stop(self, *, grace_s: float = 10.0) -> None:
        """Let running turns and sends finish and leave; cancel only after the grace period (a cancelled turn
        commits nothing; its message runs again once the lease expires)."""
        self.ready = False
        self._stopping.set()
        await self.wakeups.stop()
        await self.load.stop()
        deadline = asyncio.get_running_loop().time() + grace_s
        for group in (self._tasks, self._running):  # the dispatcher first: it starts no turn after this
            tasks = list(group)
            if not tasks:
                continue
            remaining = max(0.0, deadline - asyncio.get_running_loop().time())
            _, late = await asyncio.wait(tasks, timeout=remaining)
            for task in late:
                task.cancel()
            for task in late:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for shown in self.progress:
            await shown.drain()

    async def _sleep(self, event: asyncio.Event, seconds: float) -> None:
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self._stopping.wait())]
        _, pending = await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        for waiter in pending:
            waiter.cancel()

    async def _dispatch_loop(self) -> None:
        while not self._stopping.is_set():
            self._turns.clear()
            await self.load.calm()
            free = self.max_turns - len(self._running)
            # A batch of turns starting at once is a burst of CPU: smaller ones while the loop is busy.
            batch = CLAIM_BATCH if self.load.lag_s < self.load.late_s / 3 else CLAIM_BATCH // 10
            claimed: list[Lease] = []
            if free > 0:
                try:
                    claimed = await self.conversations.leases.claim_pending(min(free, batch))
                except Exception:
                    log.exception("claiming conversations failed")
            if self._stopping.is_set():  # claimed while stopping: give them back at once
                for lease in claimed:
                    await self.conversations.leases.release(lease)
                return
            for lease in claimed:
                task = asyncio.create_task(self._run(lease), name=f"turn-{lease.conversation_id}")
                self._running.add(task)
            if claimed and len(claimed) == min(free, batch):
                continue  # there may be more waiting
            await self._sleep(self._turns, self.poll_s)

    async def _run(self, lease: Lease) -> None:
        started = time.perf_counter()
        shown = [progress.turn() for progress in self.progress]
        results: list[MessageResult] = []
        try:
            with tracing.conversation_run(lease.conversation_id, _fan_out(shown)) as on_event:
                results = await self.conversations.run_leased(lease, on_event=on_event)
        except LeaseLost:
            log.warning("lost the lease of conversation %s: its turn was not committed", lease.conversation_id)
            results = []
        except Exception:
            log.exception("turn failed; the message stays queued")
            results = []
        finally:
            self._running.discard(asyncio.current_task())
            # A place is free, and a message stored for this conversation just before its lease was released (after
            # the turn's last look for more) is found now rather than at the next poll.
            self.wake_turns()
            for one in shown:
                one.finish(results)
        for result in results:
            self.metrics.processed.labels(result.kind).inc()
            if result.limited_by is not None:
                self.metrics.rate_limited.labels(result.limited_by).inc()
            self.metrics.count_llm_calls(result.llm_calls)
            self.metrics.count_tool_calls(result.tools)
        if results:
            self.metrics.turn_seconds.observe((time.perf_counter() - started) / len(results))
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
                sent = await self.sender.send_pending(pace=self.load.calm)
            except Exception:
                log.exception("outbox pass failed")
                sent = 0
            self.metrics.outbox_sent.inc(sent)
            if sent == 0:
                await self._sleep(self._sends, self.poll_s / 2)
