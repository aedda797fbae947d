"""What the agent messaging experience (the manifests' `agent_view`) shows beside the answers in a customer's DM with
the app: the prompts offered when they open it, and the title of each thread the bot answers in.

Decoration only: each call runs as a task of its own with a short timeout, after the event's acknowledgement and
never in a turn's way, and a failure is logged and forgotten.

Prompts are the operator's (the declaration's `suggested_prompts`); without them nothing is called and the
manifest's own prompts show. Slack says a DM was opened with `app_home_opened` on the "messages" tab under
agent_view, and with `assistant_thread_started` under the assistant_view it replaces. Only the latter names the
thread: under agent_view a call that names one "will silently fail" (docs.slack.dev,
assistant.threads.setSuggestedPrompts).

A title is set once per thread, from the customer's first message in it (when intake first stores that message),
where the bot answers in a DM thread (every DM conversation is one, as `bot.slack.events` keys them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

from slack_sdk.web.async_client import AsyncWebClient

from agents.markup.limits import clip
from agents.markup.text import escape
from bot.channels.incoming import CustomerMessage

log = logging.getLogger(__name__)

TITLE_CHARS = 80
"""A thread's title is a line in the app's history: the start of the customer's question."""
CALL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Prompt:
    title: str
    message: str


class AgentView:
    def __init__(self, client: AsyncWebClient, *, prompts: Sequence[Prompt] = ()) -> None:
        self.client = client
        self.prompts = tuple(prompts)
        self._tasks: set[asyncio.Task[None]] = set()

    def opened(self, channel: str, *, thread: str | None = None) -> None:
        """A customer opened their DM with the app (`thread`: the assistant thread Slack started, assistant_view
        only)."""
        if not self.prompts or not channel.startswith("D"):
            return
        prompts = [{"title": p.title, "message": p.message} for p in self.prompts]
        self._run(
            self.client.assistant_threads_setSuggestedPrompts(channel_id=channel, thread_ts=thread, prompts=prompts),
            f"suggested prompts in {channel}",
        )

    def stored(self, message: CustomerMessage) -> None:
        """A customer's message intake stored for the first time: the title of the DM thread it starts."""
        thread = message.address.thread
        if not message.is_dm or thread is None or message.ts != thread:
            return
        title = clip(escape(" ".join(message.text.split())), TITLE_CHARS)
        if not title:
            return
        self._run(
            self.client.assistant_threads_setTitle(channel_id=message.channel, thread_ts=thread, title=title),
            f"the title of {message.channel} {thread}",
        )

    def _run(self, call: Awaitable[object], what: str) -> None:
        task = asyncio.create_task(self._call(call, what), name="slack-agent-view")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, call: Awaitable[object], what: str) -> None:
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                await call
        except Exception as exc:  # a missing scope, a rate limit, a timeout: the conversation goes on without it
            log.info("%s not set: %r", what, exc)

    async def drain(self) -> None:
        """Wait for the calls in flight (at shutdown, and in tests)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
