"""Answers shown in Slack while the model writes them: `chat.startStream`, then `chat.appendStream` with the words so
far, in the customer's thread. A preview only (`agents.db.models.Preview`): the outbox finishes it in place with the
answer of record (`SlackMessenger.finish_preview`), so a stream cut short never stays as the answer.

What is shown is always the inert rendering of a prefix of the model's text (`inert_markdown`): the new words are
appended only while the rendering of all the text so far starts with what is shown; when it does not (a link whose
label turned out to hide its target), the stream shows nothing more and the finisher puts the answer in place.
Starting costs a Tier 2 call, so a process starts at most `starts_per_minute` streams (Slack's Tier 2 is about 20 a
minute) and shares `appends_per_minute` between them; a stream not started is an answer posted as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import Address, Platform
from agents.conversations import MessageResult
from agents.identity import Author
from agents.logcontext import current_conversation
from agents.loop import Escalate, Event, Reply, TextDelta, TurnStarted
from agents.markup.text import inert_markdown
from bot.channels.previews import Previews, Pumps, Words
from bot.slack.messenger import MAYBE_DONE

log = logging.getLogger(__name__)
STREAM_AFTER_S = 0.3
"""A stream starts once the model has been writing this long: an answer written faster is posted whole, as before,
at the cost of one call instead of a stream's two."""
APPEND_EVERY_S = 1.0
"""A stream's words go out at most this often: a reader sees them arrive, and Slack is asked little."""
MAX_SHOWN = 11_000
"""A preview longer than this stops growing (Slack takes 12,000 characters a call); the answer comes whole."""


class Bucket:
    """At most `per_minute` calls a minute, refilled continuously; `take` never waits."""

    def __init__(self, per_minute: float) -> None:
        self.rate_s, self.capacity = per_minute / 60.0, max(1.0, per_minute / 6)
        self.tokens, self.at = self.capacity, time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate_s)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class SlackStreams:
    """The streams of this process's turns (a `bot.runtime.workers.Progress`)."""

    def __init__(
        self,
        client: AsyncWebClient,
        sessions: async_sessionmaker[AsyncSession],
        *,
        starts_per_minute: float = 20,
        appends_per_minute: float = 100,
    ) -> None:
        self.client = client
        """Retries nothing by itself: a start retried inside the client after a lost answer would show twice."""
        self.previews = Previews(sessions)
        self.starts = Bucket(starts_per_minute)
        self.appends = Bucket(appends_per_minute)
        self.pumps = Pumps()

    def turn(self) -> TurnStream:
        return TurnStream(self)

    def run(self, stream: TurnStream) -> None:
        stream.task = self.pumps.start(stream.pump(), name="slack-stream")

    async def drain(self) -> None:
        await self.pumps.drain()


@dataclass
class TurnStream:
    """One leased run's preview: the words arrive as events and a task sends them, so the model's stream never
    waits for Slack."""

    streams: SlackStreams
    asker: Author | None = None
    address: Address | None = None
    words: Words = field(default_factory=Words)
    shown: str = ""
    preview: int | None = None
    ts: str | None = None
    over: bool = False
    """Nothing more is shown: the run finished, or the stream cannot go on."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    async def on_event(self, event: Event) -> None:
        match event:
            case TurnStarted(asker=asker) if self.asker is None:
                self.asker = asker
            case TextDelta() if not self.over:
                self.words.add(event)
                if self.task is None:
                    address = Address.parse(current_conversation.get())
                    if address is None or address.platform != Platform.SLACK or address.thread is None:
                        self.over = True  # a direct message answered outside a thread has no thread to stream in
                        return
                    self.address = address
                    self.streams.run(self)
                self.changed.set()
            case Reply() | Escalate():
                # The answer of record is written: the outbox finishes the preview with it. A run that goes on to
                # the conversation's next message streams no more (at most one preview is open per conversation).
                self.over = True
                self.changed.set()

    def finish(self, results: Sequence[MessageResult]) -> None:
        """The run committed (or failed): whatever is owed now goes through the outbox, which finishes the preview."""
        self.over = True
        self.changed.set()

    async def pump(self) -> None:
        try:
            await asyncio.sleep(STREAM_AFTER_S)
            while not self.over:
                if self.ts is None:
                    if not await self._start():
                        return
                else:
                    await self._append()
                await asyncio.sleep(APPEND_EVERY_S)
                await self.changed.wait()
                self.changed.clear()
        except Exception:
            log.warning("a preview in %s stopped", self.address, exc_info=True)

    def _next(self) -> str | None:
        """The words to show next, or None when showing more would break what is shown."""
        rendered = inert_markdown(self.words.raw)
        if not rendered.startswith(self.shown) or len(rendered) > MAX_SHOWN:
            return None
        return rendered[len(self.shown) :]

    async def _start(self) -> bool:
        address, words = self.address, self._next()
        assert address is not None and address.thread is not None
        if not words or self.asker is None or not self.streams.starts.take():
            self.over = True
            return False
        self.preview = await self.streams.previews.open(address)
        if self.preview is None:  # another run's preview is open: the answer finishes that one
            self.over = True
            return False
        try:
            response = await self.streams.client.chat_startStream(
                channel=address.channel,
                thread_ts=address.thread,
                markdown_text=words,
                recipient_user_id=self.asker.user,
                recipient_team_id=self.asker.workspace,
            )
        except SlackApiError as exc:
            error = str(exc.response.get("error") or "")
            self.over = True
            if error in MAYBE_DONE:  # it may show: left open without its ts, the finisher looks for it
                return False
            await self._close("dropped")  # refused: nothing shows, and the answer is posted as usual
            log.info("no preview in %s: %s", address.channel, error)
            return False
        self.ts, self.shown = str(response["ts"]), words
        await self._record(stream_id=self.ts, shown=self.shown)
        return True

    async def _append(self) -> None:
        assert self.address is not None and self.ts is not None
        words = self._next()
        if words is None:
            self.over = True
            return
        if not words or not self.streams.appends.take():
            return
        try:
            await self.streams.client.chat_appendStream(channel=self.address.channel, ts=self.ts, markdown_text=words)
        except SlackApiError as exc:
            # Expired, refused or rate-limited: what is shown stays, and the finisher replaces it.
            log.info("preview in %s stopped growing: %s", self.address.channel, exc.response.get("error"))
            self.over = True
            return
        self.shown += words
        await self._record(shown=self.shown)

    async def _record(self, **values: str) -> None:
        assert self.preview is not None
        await self.streams.previews.record(self.preview, **values)

    async def _close(self, state: str) -> None:
        await self._record(state=state)
