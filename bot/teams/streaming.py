"""Answers shown in a Teams personal chat while the model writes them: an informative update starts the stream, then
`typing` activities carry the answer so far, at most one a second (Teams answers a faster one 429). A preview only
(`agents.db.models.Preview`): the outbox ends the stream with the answer of record as its final message
(`TeamsMessenger.finish_preview`), so a stream cut short never stays as the answer. Channels and group chats cannot
stream: the typing indicator stays their signal.

What is shown is always Teams' rendering of a prefix of the model's text (`from_markdown`), and each update contains
the one before, as Teams requires: when the rendering of all the text so far no longer starts with what is shown
(a link whose label turned out to hide its target), the stream shows nothing more and the final message puts the
answer in place. Any failure (a 429, the stream over after two minutes, the network) ends the preview quietly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import Address, Platform
from agents.conversations import MessageResult
from agents.language import Language
from agents.logcontext import current_conversation
from agents.loop import Escalate, Event, HandoffRecord, Reply, TextDelta, TurnStarted
from agents.texts import CATALOG, Text, Texts
from bot.channels.messenger import Where
from bot.channels.previews import Notice, Previews, Pumps, Words
from bot.teams.limits import POST_TEXT
from bot.teams.messenger import STREAM_PACE_S, TeamsMessenger, is_personal
from bot.teams.text import from_markdown

log = logging.getLogger(__name__)


class TeamsStreams:
    """The streams of this process's turns (a `bot.runtime.workers.Progress`)."""

    def __init__(
        self,
        messenger: TeamsMessenger,
        sessions: async_sessionmaker[AsyncSession],
        *,
        every_s: float = STREAM_PACE_S,
        texts: Texts | None = None,
        notice: Notice = lambda agent, language: None,
    ) -> None:
        self.messenger = messenger
        self.notice = notice
        self.previews = Previews(sessions)
        self.every_s = every_s
        self.texts = texts or Texts()
        """The progress line the stream starts with (`stream_started`, shown until the first words), in each
        conversation's language."""
        self.pumps = Pumps()

    def turn(self) -> TurnStream:
        return TurnStream(self)

    def run(self, stream: TurnStream) -> None:
        self.pumps.start(stream.pump(), name="teams-stream")

    async def drain(self) -> None:
        await self.pumps.drain()


@dataclass
class TurnStream:
    """One leased run's preview: the words arrive as events and a task sends them, so the model's stream never
    waits for Teams."""

    streams: TeamsStreams
    address: Address | None = None
    language: Language | None = None
    """The conversation's, for the handoff notices that lead the answer."""
    words: Words = field(default_factory=Words)
    shown: str = ""
    sequence: int = 0
    preview: int | None = None
    stream_id: str | None = None
    over: bool = False
    """Nothing more is shown: the answer is written, the run finished, or the stream cannot go on."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    started: bool = False

    async def on_event(self, event: Event) -> None:
        match event:
            case HandoffRecord(to_agent=agent):
                self.words.lead(self.streams.notice(agent, self.language))
            case TurnStarted(language=language):
                self.language = language
                # The informative update goes out as the turn starts: Teams takes one activity a second per stream,
                # so the first words can follow the model's first token at once instead of a second after it.
                self._begin()
            case TextDelta() if not self.over:
                self.words.add(event)
                self._begin()
                self.changed.set()
            case Reply() | Escalate():
                # The answer of record is written: its final message comes through the outbox, which an update
                # sent now would only delay (one activity a second per stream).
                self._stop()

    def _begin(self) -> None:
        if self.started or self.over:
            return
        self.started = True
        address = Address.parse(current_conversation.get())
        if address is None or address.platform != Platform.TEAMS or not is_personal(address.channel):
            self.over = True  # channels and group chats cannot stream: the typing indicator stays their signal
            return
        self.address = address
        self.streams.run(self)

    def finish(self, results: Sequence[MessageResult]) -> None:
        """The run committed (or failed): whatever is owed now goes through the outbox, which finishes the preview."""
        self._stop()

    def _stop(self) -> None:
        self.over = True
        self.changed.set()

    async def pump(self) -> None:
        try:
            if self.over or not await self._start():  # an answer written already needs no preview
                return
            while not self.over:
                await asyncio.sleep(self.streams.every_s)
                await self.changed.wait()
                self.changed.clear()
                if not self.over:
                    await self._update()
        except Exception as exc:
            # A 429, a stream Teams ended, the network: what is shown stays, and the final message replaces it.
            log.info("the preview in %s stopped: %r", self.address, exc)
            self.over = True

    @property
    def informative(self) -> str:
        texts = self.streams.texts
        # Teams refuses an empty update: a line left empty by the operator is the catalog's.
        return (
            texts.get(Text.STREAM_STARTED, self.language)
            or CATALOG[Text.STREAM_STARTED][self.language or texts.default]
        )

    @property
    def where(self) -> Where:
        assert self.address is not None
        return Where(self.address.channel, self.address.thread)

    async def _start(self) -> bool:
        assert self.address is not None
        self.preview = await self.streams.previews.open(self.address)
        if self.preview is None:  # another run's preview is open: the answer finishes that one
            self.over = True
            return False
        if self.over:
            await self._record(state="dropped")
            return False
        try:
            self.stream_id = await self.streams.messenger.stream(
                self.where, self.informative, kind="informative", sequence=self._next_sequence(), stream_id=None
            )
        except Exception as exc:
            # Refused, or no answer: either way no stream to finish, and the answer is posted as usual.
            self.over = True
            await self._record(state="dropped")
            log.info("no preview in %s: %r", self.address.channel, exc)
            return False
        await self._record(stream_id=self.stream_id)
        return True

    async def _update(self) -> None:
        words = from_markdown(self.words.raw)
        if not words.startswith(self.shown) or len(words) > POST_TEXT:
            self.over = True  # Teams refuses an update that drops what it showed; the final message will say it
            return
        if words == self.shown:
            return
        await self.streams.messenger.stream(
            self.where, words, kind="streaming", sequence=self._next_sequence(), stream_id=self.stream_id
        )
        self.shown = words
        await self._record(shown=words)

    def _next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    async def _record(self, **values: str) -> None:
        assert self.preview is not None
        await self.streams.previews.record(self.preview, **values)
