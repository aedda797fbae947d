"""Answers shown in Slack while the model writes them: `chat.startStream`, then `chat.appendStream` with the words so
far, in the customer's thread. A preview only (`agents.db.models.Preview`): the outbox finishes it in place with the
answer of record (`SlackMessenger.finish_preview`), so a stream cut short never stays as the answer.

What is shown is always the inert rendering of a prefix of the model's text (`inert_markdown`): the new words are
appended only while the rendering of all the text so far starts with what is shown; when it does not (a link whose
label turned out to hide its target), the stream shows nothing more and the finisher puts the answer in place.
Each tool the turn runs shows as a task card in the stream (a `task_update` chunk per tool call, titled with the step
the AI status shows for it, `bot.slack.ai_status.TOOL_STEPS`): in progress, then complete or failed when its result
comes. A stream starts once the model has written for `STREAM_AFTER_S`, or once a tool has run that long, so a slow
look-up shows as "Checking your order…" in the thread. The stream is in chunks mode from its start (Slack refuses
the other mode afterwards, `streaming_mode_mismatch`): words go as `markdown_text` chunks, the finisher's too. Before
the turn's answer is written, the cards' last states are sent, so the finished message shows every step done.

Starting costs a Tier 2 call, so a process starts at most `starts_per_minute` streams (Slack's Tier 2 is about 20 a
minute) and shares `appends_per_minute` between them; a stream not started is an answer posted as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import Address, Platform
from agents.conversations import MessageResult
from agents.identity import Author
from agents.language import Language
from agents.logcontext import current_conversation
from agents.loop import Escalate, Event, HandoffRecord, Reply, TextDelta, ToolRecord, ToolStarted, TurnStarted
from agents.markup.text import inert_markdown
from agents.texts import Texts
from bot.channels.previews import Notice, Previews, Pumps, Words
from bot.slack.ai_status import step_of
from bot.slack.messenger import MAYBE_DONE

log = logging.getLogger(__name__)
STREAM_AFTER_S = 0.3
"""A stream starts once the model has been writing this long, or a tool running this long: an answer written faster
is posted whole, as before, at the cost of one call instead of a stream's two."""
APPEND_EVERY_S = 1.0
"""A stream's words go out at most this often: a reader sees them arrive, and Slack is asked little."""
MAX_SHOWN = 11_000
"""A preview longer than this stops growing (Slack takes 12,000 characters a call); the answer comes whole."""
SETTLE_S = 2.0
"""How long the turn's answer waits for the stream's last call (the task cards' last states): Slack answers far
sooner; a slower Slack leaves a card as it was, never the answer held up longer."""


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
        notice: Notice = lambda agent, language: None,
        texts: Texts | None = None,
    ) -> None:
        self.client = client
        self.texts = texts or Texts()
        """The tool steps' titles, in each conversation's language."""
        """Retries nothing by itself: a start retried inside the client after a lost answer would show twice."""
        self.previews = Previews(sessions)
        self.starts = Bucket(starts_per_minute)
        self.appends = Bucket(appends_per_minute)
        self.pumps = Pumps()
        self.notice = notice

    def turn(self) -> TurnStream:
        return TurnStream(self)

    def run(self, stream: TurnStream) -> None:
        stream.task = self.pumps.start(stream.pump(), name="slack-stream")

    async def drain(self) -> None:
        await self.pumps.drain()


@dataclass
class Card:
    """A tool call shown as a task card: its status as the turn knows it, and as Slack was last sent it."""

    id: str
    title: str
    status: str = "in_progress"
    sent: str | None = None

    def chunk(self, status: str) -> dict[str, Any]:
        return {"type": "task_update", "id": self.id, "title": self.title, "status": status}


def card_title(event: ToolStarted, texts: Texts, language: Language | None) -> str | None:
    """What the AI status says for the tool, as a task's title ("Checking your order…"), in the conversation's
    `language`; None for a handoff (a `transfer_to_` tool: which agent takes over is not a step the customer waits
    on)."""
    # A tool's step never names an agent, so the title function is never asked.
    step = step_of(event, str, texts, language)
    return None if step is None else (step.loading or (step.status,))[0]


@dataclass
class TurnStream:
    """One leased run's preview: the words and tool steps arrive as events and a task sends them, so the model's
    stream never waits for Slack."""

    streams: SlackStreams
    asker: Author | None = None
    language: Language | None = None
    """The conversation's, for the handoff notices that lead the answer."""
    address: Address | None = None
    words: Words = field(default_factory=Words)
    cards: dict[str, Card] = field(default_factory=dict)
    """By tool call id, in the order the tools started."""
    shown: str = ""
    still: bool = False
    """The words shown can grow no more (the rest would change what is shown): only steps are sent."""
    preview: int | None = None
    ts: str | None = None
    over: bool = False
    """Nothing more is shown: the run finished, or the stream cannot go on."""
    refused: bool = False
    """Slack refused an append (expired, rate-limited): nothing more is sent to the stream."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Words or steps came since the pump last looked."""
    urgent: asyncio.Event = field(default_factory=asyncio.Event)
    """A step changed or the run is over: sent without waiting for the words' next turn."""
    task: asyncio.Task[None] | None = None

    async def on_event(self, event: Event) -> None:
        match event:
            case TurnStarted(asker=asker, language=language) if self.asker is None:
                self.asker, self.language = asker, language
            case HandoffRecord(to_agent=agent):
                self.words.lead(self.streams.notice(agent, self.language))
            case TextDelta() if not self.over:
                self.words.add(event)
                self._begin()
                self.changed.set()
            case ToolStarted(call=call) if (
                not self.over and (title := card_title(event, self.streams.texts, self.language)) is not None
            ):
                self.cards[call.id] = Card(call.id, title)
                self._begin()
                self._step()
            case ToolRecord(call=call, ok=ok) if not self.over and (card := self.cards.get(call.id)) is not None:
                card.status = "complete" if ok else "error"
                self._step()
            case Reply() | Escalate():
                # The answer of record is written: the outbox finishes the preview with it. A run that goes on to
                # the conversation's next message streams no more (at most one preview is open per conversation).
                self._end()
                if self.task is not None:
                    # The cards' last states go before the answer is committed, so that the finisher's stop comes
                    # after them and the finished message shows the steps done.
                    await asyncio.wait({self.task}, timeout=SETTLE_S)

    def finish(self, results: Sequence[MessageResult]) -> None:
        """The run committed (or failed): whatever is owed now goes through the outbox, which finishes the preview."""
        self._end()

    def _begin(self) -> None:
        """The pump starts with the turn's first words or step, in the customer's thread."""
        if self.task is not None or self.over:
            return
        address = Address.parse(current_conversation.get())
        if address is None or address.platform != Platform.SLACK or address.thread is None:
            self.over = True  # a direct message answered outside a thread has no thread to stream in
            return
        self.address = address
        self.streams.run(self)

    def _step(self) -> None:
        self.changed.set()
        self.urgent.set()

    def _end(self) -> None:
        self.over = True
        self._step()

    async def pump(self) -> None:
        try:
            await self._pause(STREAM_AFTER_S, until_over_only=True)
            while self.ts is None and not self.over:
                if self._worth_starting():
                    if not await self._start():
                        return
                    break
                # Only steps already done to show (a quick look-up): the next words or step must last as long.
                self.changed.clear()
                await self.changed.wait()
                await self._pause(STREAM_AFTER_S, until_over_only=True)
            while not self.over:
                await self._pause(APPEND_EVERY_S)
                await self.changed.wait()
                self.changed.clear()
                if not self.over:
                    await self._append()
            if self.ts is not None and not self.refused:
                await self._append(last=True)
        except Exception:
            log.warning("a preview in %s stopped", self.address, exc_info=True)

    async def _pause(self, seconds: float, *, until_over_only: bool = False) -> None:
        """Wait `seconds`, less when the run ends (or, unless `until_over_only`, a step changes)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                while not self.over:
                    await self.urgent.wait()
                    if not until_over_only:
                        break
                    self.urgent.clear()
        self.urgent.clear()

    def _worth_starting(self) -> bool:
        return self.words.written or any(card.status == "in_progress" for card in self.cards.values())

    def _next(self) -> str | None:
        """The words to show next, or None when showing more would break what is shown."""
        rendered = inert_markdown(self.words.raw)
        if not rendered.startswith(self.shown) or len(rendered) > MAX_SHOWN:
            return None
        return rendered[len(self.shown) :]

    def _pending(self, *, last: bool = False) -> list[tuple[Card, str]]:
        """Cards whose status Slack has not been sent, with that status. At the end a tool whose result never came
        (a look-up the engine dropped when it failed) shows as failed: no card stays spinning on a finished answer."""
        if last:
            for card in self.cards.values():
                if card.status == "in_progress":
                    card.status = "error"
        return [(card, card.status) for card in self.cards.values() if card.status != card.sent]

    async def _start(self) -> bool:
        address, words = self.address, self._next()
        assert address is not None and address.thread is not None
        if words is None or self.asker is None or not self.streams.starts.take():
            self.over = True
            return False
        self.preview = await self.streams.previews.open(address)
        if self.preview is None:  # another run's preview is open: the answer finishes that one
            self.over = True
            return False
        cards = self._pending()
        chunks = _chunks(cards, words)
        if not chunks:
            self.over = True
            await self._close("dropped")
            return False
        try:
            response = await self.streams.client.chat_startStream(
                channel=address.channel,
                thread_ts=address.thread,
                chunks=chunks,
                task_display_mode="timeline",
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
        _sent(cards)
        self.ts, self.shown = str(response["ts"]), words
        await self._record(stream_id=self.ts, shown=self.shown)
        return True

    async def _append(self, *, last: bool = False) -> None:
        """The new words and steps; `last`: the steps' final states, whatever the budget (one call, and a card left
        in progress on the finished answer would be wrong)."""
        assert self.address is not None and self.ts is not None
        words = None if last or self.still else self._next()
        if words is None:
            self.still, words = True, ""
        cards = self._pending(last=last)
        if not words and not cards:
            return
        if not last and not self.streams.appends.take():
            return
        try:
            await self.streams.client.chat_appendStream(
                channel=self.address.channel, ts=self.ts, chunks=_chunks(cards, words)
            )
        except SlackApiError as exc:
            # Expired, refused or rate-limited: what is shown stays, and the finisher replaces it.
            log.info("preview in %s stopped growing: %s", self.address.channel, exc.response.get("error"))
            self.over = self.refused = True
            return
        _sent(cards)
        if words:
            self.shown += words
            await self._record(shown=self.shown)

    async def _record(self, **values: str) -> None:
        assert self.preview is not None
        await self.streams.previews.record(self.preview, **values)

    async def _close(self, state: str) -> None:
        await self._record(state=state)


def _chunks(cards: Sequence[tuple[Card, str]], words: str) -> list[dict[str, Any]]:
    """Steps first: a step that started after words were shown still shows after them, as the stream keeps order."""
    chunks = [card.chunk(status) for card, status in cards]
    return chunks + ([{"type": "markdown_text", "text": words}] if words else [])


def _sent(cards: Sequence[tuple[Card, str]]) -> None:
    for card, status in cards:
        card.sent = status
