"""Slack's AI-app status ("helpdesk is searching the help articles…") while a turn works on a customer's message.

`assistant.threads.setStatus` (docs.slack.dev, reference/methods/assistant.threads.setStatus) shows a status line
with rotating `loading_messages` (10 at most) under a thread; since 2026-03 it takes the `chat:write` scope and works
in channels too, not only in the assistant split view. Slack clears the status itself when the app posts in the
thread, and after two minutes without a post; an empty status clears it at once. So a turn that ends in a reply
leaves the clearing to the reply (which the outbox posts, exactly once: a status is not a reply and never goes
through it), and a turn that ends without one (the customer waits for a person, a rate limit, a failure) clears it
here.

A status call never holds a turn up: each is a task of its own with a short timeout, whose failure is logged and
counted. Where Slack refuses it for good (a missing scope, a surface that has no status), this process stops asking
for that kind of channel (public, private, direct message) until it restarts; the 👀 and ✅ reactions, which are
posted either way, remain the signal there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from prometheus_client import Counter
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from agents.address import Address, Platform
from agents.conversations import MessageResult, ResultKind
from agents.language import Language
from agents.logcontext import current_conversation
from agents.loop import Event, HandoffRecord, ToolStarted, TurnStarted
from agents.texts import Text, Texts

log = logging.getLogger(__name__)

REFUSED_FOR_GOOD = frozenset(
    {
        "missing_scope",
        "not_allowed_token_type",
        "invalid_auth",
        "not_allowed",
        "no_permission",
        "team_access_not_granted",
    }
)
"""Errors that say status cannot work for this app (its scopes, its token, the workspace's settings): not asked
again. Any other error (a rate limit, a deleted thread, a channel the bot left) concerns that call alone."""
ANSWERED = frozenset({ResultKind.REPLY, ResultKind.ESCALATED})
"""Turns whose outcome posts in the customer's thread, which clears the status."""


class ChannelKind(StrEnum):
    """Where status may or may not be offered, told by the channel id's first letter."""

    PUBLIC = "public"
    PRIVATE = "private"
    DIRECT = "direct"

    @classmethod
    def of(cls, channel: str) -> ChannelKind:
        return {"D": cls.DIRECT, "G": cls.PRIVATE}.get(channel[:1], cls.PUBLIC)


@dataclass(frozen=True)
class Step:
    """What a status shows: the line after the app's name, and the loading messages Slack rotates."""

    status: str
    loading: tuple[str, ...] = ()

    @classmethod
    def said(cls, words: str) -> Step:
        """A step as a `status_` text says it: the status, then a loading message a line (Slack takes 10 at most)."""
        status, *loading = words.split("\n")
        return cls(status, tuple(line for line in loading if line.strip())[:10])


TOOL_STEPS = {
    "search_knowledge": Text.STATUS_SEARCHING,
    "lookup_order": Text.STATUS_CHECKING_ORDER,
    "issue_refund": Text.STATUS_PREPARING_REFUND,
    "find_product": Text.STATUS_LOOKING_IN_CATALOGUE,
    "escalate_to_human": Text.STATUS_FINDING_COLLEAGUE,
}
"""Known tools' steps; any other tool shows `status_working`."""


def step_of(event: Event, title: Callable[[str], str], texts: Texts, language: Language | None) -> Step | None:
    """The status an engine event shows in the conversation's `language`, None for events that change nothing (a
    tool's result, the reply); `title` names an agent as customers see it."""
    match event:
        case TurnStarted():
            return Step.said(texts.get(Text.STATUS_THINKING, language))
        case ToolStarted(call=call):
            if call.name.startswith("transfer_to_"):
                return None  # the handoff record names the agent
            return Step.said(texts.get(TOOL_STEPS.get(call.name, Text.STATUS_WORKING), language))
        case HandoffRecord(to_agent=agent):
            return Step.said(texts.get(Text.STATUS_HANDOFF, language).format(agent=title(agent)))
    return None


class SlackStatus:
    """The status of every Slack thread a turn of this process works in."""

    def __init__(
        self,
        client: AsyncWebClient,
        *,
        failures: Counter,
        title: Callable[[str], str],
        texts: Texts | None = None,
        timeout_s: float = 2.0,
    ) -> None:
        self.client = client
        self.title = title
        """An agent's title by its name."""
        self.texts = texts or Texts()
        """The steps' words, in each conversation's language (the turn's, `TurnStarted.language`)."""
        self.failures = failures
        """Status calls that failed, by error (`helpdesk_status_failures_total`)."""
        self.timeout_s = timeout_s
        self.unavailable: set[ChannelKind] = set()
        """Channel kinds where Slack refused status for good: not asked again by this process."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._last: dict[tuple[str, str], asyncio.Task[None]] = {}
        """Each thread's latest call, which its next one waits for."""

    def turn(self) -> TurnStatus:
        return TurnStatus(self)

    def show(self, address: Address, step: Step) -> None:
        """Set (or, with an empty status, clear) the thread's status in the background."""
        if address.platform != Platform.SLACK or address.thread is None:
            return  # a direct message answered outside a thread has no thread to show it under
        if ChannelKind.of(address.channel) in self.unavailable:
            return
        # One thread's calls go in order: a clear must never overtake the set before it (which would then linger).
        thread = (address.channel, address.thread)
        previous = self._last.get(thread)
        task = asyncio.create_task(self._after(previous, *thread, step), name="slack-status")
        self._last[thread] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda done: self._last.pop(thread, None) if self._last.get(thread) is done else None)

    async def _after(self, previous: asyncio.Task[None] | None, channel: str, thread: str, step: Step) -> None:
        if previous is not None:
            await asyncio.wait({previous})
        await self._call(channel, thread, step)

    async def drain(self) -> None:
        """Wait for the calls in flight (at shutdown, and in tests)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _call(self, channel: str, thread: str, step: Step) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                loading = list(step.loading) or None
                await self.client.assistant_threads_setStatus(
                    channel_id=channel, thread_ts=thread, status=step.status, loading_messages=loading
                )
        except SlackApiError as exc:
            error = str(exc.response.get("error") or "error")
            self.failures.labels(error).inc()
            if error not in REFUSED_FOR_GOOD:
                log.debug("status in %s not shown: %s", channel, error)
                return
            kind = ChannelKind.of(channel)
            if kind not in self.unavailable:
                self.unavailable.add(kind)
                log.warning("Slack refused the AI status in %s channels (%s): the reactions show progress", kind, error)
        except Exception as exc:  # a timeout, a lost connection: the reply does not care
            self.failures.labels(type(exc).__name__).inc()
            log.debug("status in %s not shown: %r", channel, exc)


class TurnStatus:
    """One leased run of a conversation's turns: the engine's events become status steps (an `EventSink`), and
    `finish` clears what no reply will."""

    def __init__(self, status: SlackStatus) -> None:
        self.status = status
        self.address: Address | None = None
        self.language: Language | None = None

    async def on_event(self, event: Event) -> None:
        if isinstance(event, TurnStarted):
            self.language = event.language
        step = step_of(event, self.status.title, self.status.texts, self.language)
        if step is None:
            return
        # The engine names the conversation it runs in this context variable (its log context).
        self.address = Address.parse(current_conversation.get())
        if self.address is not None:
            self.status.show(self.address, step)

    def finish(self, results: Sequence[MessageResult]) -> None:
        """After the run: cleared unless its last turn posts in the thread (an empty run or a failure clears it)."""
        if self.address is None:
            return
        if results and results[-1].kind in ANSWERED and results[-1].reply:
            return
        self.status.show(self.address, Step(""))
