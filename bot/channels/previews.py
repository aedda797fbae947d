"""What every channel's preview of an answer shares (`agents.db.models.Preview`): the row that makes it finishable
by the outbox, and the words as the model writes them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import Address
from agents.db import models as m
from agents.language import Language
from agents.loop import TextDelta

_OPEN = text(
    "INSERT INTO previews (conversation_id, platform, channel, thread) "
    "SELECT id, :platform, :channel, :thread FROM conversations WHERE key = :key "
    "ON CONFLICT (conversation_id) WHERE state = 'open' DO NOTHING RETURNING id"
)


class Previews:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def open(self, address: Address) -> int | None:
        """A preview of the run's answer in `address`, unless one is open for the conversation already (a run before
        this one was cut short: the answer finishes that one, and this run shows nothing)."""
        params = {"key": address.key, "platform": address.platform, "channel": address.channel}
        async with self.sessions() as s, s.begin():
            found = await s.scalar(_OPEN, params | {"thread": address.thread})
        return None if found is None else int(found)

    async def record(self, preview: int, **values: str) -> None:
        """What the stream is (`stream_id`), what it showed (`shown`), or that it showed nothing (`state`); never
        on a preview the outbox has finished."""
        shown_at = {"shown_at": func.now()} if "shown" in values or "stream_id" in values else {}
        async with self.sessions() as s, s.begin():
            still_open = update(m.Preview).where(m.Preview.id == preview, m.Preview.state == "open")
            await s.execute(still_open.values(**values, **shown_at))


Notice = Callable[[str, Language | None], str | None]
"""The handoff notice for an agent (by name) in the conversation's language (`TurnStarted.language`), as the customer
is shown it; None: no notice (HANDOFF_NOTICE empty)."""


@dataclass
class Words:
    """A run's text as the model writes it: what a call wrote before asking for tools stays, and the next call's
    follows it after a blank line. Handoff notices that came before the first words lead it, as the answer of
    record then starts with them (`bot.delivery.owed`): the customer watches one message, notice and answer."""

    raw: str = ""
    call: int = 0
    written: bool = False

    def lead(self, notice: str | None) -> None:
        if notice and not self.written:
            self.raw += f"{notice}\n\n"

    def add(self, delta: TextDelta) -> None:
        if delta.call != self.call and self.written:
            self.raw += "\n\n"
        self.call, self.raw, self.written = delta.call, self.raw + delta.text, True


class Pumps:
    """A process's preview tasks: each kept referenced until it is done, all awaited at shutdown (and in tests)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, work: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
