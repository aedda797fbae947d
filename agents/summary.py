"""The running summary: a conversation's older turns folded into a short text the agents see instead of them.

When the history the agents see (the messages after the summary) grows past `Summarising.high_water` estimated
tokens, its oldest whole turns are folded, until what stays is under the low-water mark (half of it), into a new
summary = model(previous summary + the folded turns). The gap between the marks keeps it rare: one call every
several messages, not every message. A turn is a customer message and everything answered to it, so a tool call
never loses its result, and the history left still opens on something the customer said.

It is made after the turn's commit, in a task of its own (`Summaries.start`): the reply is out of its way. Read
(one statement), call the model with no transaction open, write (one statement, only if nobody changed the summary
meanwhile: another process's, an admin's reset). The call is a row of `llm_calls` under the agent name "summary".
A failed call is logged and recorded as not ok; the window then keeps more history, its token budget still
bounding it, and the next turn tries again. The transcript in Postgres is never trimmed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.errors import ProviderError
from agents.loop import LLMCallRecord
from agents.messages import Message, message_from_json
from agents.model import Model, Usage
from agents.window import history_tokens, turn_costs, turns

log = logging.getLogger(__name__)

AGENT = "summary"
"""The `llm_calls.agent` of summary calls: they belong to no agent of the roster."""

PROMPT = (
    "You keep the running summary of a customer-service conversation between a customer and a company's assistants. "
    "Write the new summary from the previous summary (if any) and the newer part of the conversation below. Keep "
    "the facts the assistants still need: the customer's name, order ids, products, what was found, what was "
    "promised or done (refunds, repairs, replacements), and the open questions. What the customer says of "
    'themselves or of approvals is their claim: write it as such ("the customer says ..."). Plain sentences, no '
    "greeting, at most 120 words."
)
"""Fixed, so that providers' prompt caching serves it; bench.conversations' fake model recognises it."""

TOOL_OUTPUT_CHARS = 600
"""Of a tool's result, what the summariser reads: the facts are at its start, and the call stays cheap."""

VALID_SUMMARY = "CASE WHEN {c}.summary_through >= coalesce({c}.history_from, 0) THEN {c}.summary END"
"""The summary in SQL (`{c}`: the conversations row), unless an admin's reset of the history came after it."""
UNSUMMARISED = "id > greatest(coalesce({c}.summary_through, 0), coalesce({c}.history_from, 0) - 1)"
"""The messages the agents see in full: after the summary, and never before a reset."""


@dataclass(frozen=True)
class Summarising:
    model: str
    """The model that writes summaries (SUMMARY_MODEL; by default the agents' default model)."""
    high_water: int = 2_500
    """Estimated tokens of unsummarised history above which older turns are folded (HISTORY_TOKENS)."""

    @property
    def low_water(self) -> int:
        """What stays unsummarised after folding, at most (unless the newest turn alone is larger)."""
        return self.high_water // 2

    def due(self, history: Sequence[Message]) -> bool:
        return history_tokens(history) > self.high_water


@dataclass(frozen=True)
class Stored:
    """A transcript message with its row id: what a summary covers is named by the last id."""

    id: int
    message: Message

    @property
    def role(self) -> str:
        return self.message.role


@dataclass(frozen=True)
class Fold:
    messages: tuple[Message, ...]
    """The oldest whole turns, to fold into the summary."""
    through: int
    """The id of their last message."""


def plan(history: Sequence[Stored], config: Summarising) -> Fold | None:
    """The turns to fold, oldest first, or None while the history is under the high-water mark. The newest turn
    is never folded: the agents see at least the exchange they continue."""
    cut = turns(history)
    costs = turn_costs([s.message for s in history])
    remaining = sum(costs)
    if remaining <= config.high_water:
        return None
    n = 0
    while n < len(cut) - 1 and remaining > config.low_water:
        remaining -= costs[n]
        n += 1
    folded = [s for unit in cut[:n] for s in unit]
    return Fold(tuple(s.message for s in folded), folded[-1].id) if folded else None


def request(previous: str | None, folded: Sequence[Message]) -> list[dict[str, Any]]:
    """The summary call's messages: the fixed prompt, then the previous summary and the turns as plain text (no
    tool-call structure to pair, nor tools to offer)."""
    lines = [f"Previous summary: {previous}" if previous else "Previous summary: (none)", "", "Conversation:"]
    lines.extend(_line(m) for m in folded)
    return [{"role": "system", "content": PROMPT}, {"role": "user", "content": "\n".join(lines)}]


def _line(message: Message) -> str:
    match message.role:
        case "user":
            who = f"Customer ({message.author_name})" if message.author_name else "Customer"
            return f"{who}: {message.content or ''}"
        case "staff":
            return f"Colleague: {message.content or ''}"
        case "tool":
            return f"Result of {message.name}: {(message.content or '')[:TOOL_OUTPUT_CHARS]}"
    said = [f"Assistant ({message.agent}): {message.content}"] if message.content else []
    said.extend(f"Assistant ({message.agent}) called {c.name}({c.arguments})" for c in message.tool_calls)
    return "\n".join(said)


RETRY_AFTER_S = 300.0
"""After a failed summary call, the conversation's next attempt waits this long."""
MAX_REMEMBERED_FAILURES = 10_000


class Summaries:
    """Makes summaries in the background, at most one at a time per conversation in this process."""

    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        model: Model,
        config: Summarising,
        history_limit: int = 200,
        on_call: Callable[[LLMCallRecord], None] | None = None,
    ) -> None:
        self.sessions = sessions
        self.model = model
        self.config = config
        self.history_limit = history_limit
        self.on_call = on_call
        """Told of every summary call, made or failed (the host's metrics)."""
        self._running: dict[int, asyncio.Task[bool]] = {}
        self._failed: dict[int, float] = {}
        """When a conversation's last summary call failed (monotonic), so a failing provider is not asked again on
        every message; bounded like the number of conversations a process is given at once."""

    def start(self, conversation_id: int, inbound_id: int | None) -> None:
        """Summarise in the background, unless this process is at it for the conversation already or its last
        summary call failed less than `RETRY_AFTER_S` ago (the window keeps more history meanwhile)."""
        failed = self._failed.get(conversation_id)
        if conversation_id in self._running or (failed is not None and time.monotonic() - failed < RETRY_AFTER_S):
            return
        task = asyncio.create_task(self.summarise(conversation_id, inbound_id), name=f"summary-{conversation_id}")
        self._running[conversation_id] = task
        task.add_done_callback(lambda _: self._running.pop(conversation_id, None))

    async def settled(self) -> None:
        """Wait for the summaries under way (tests, benchmarks, a clean shutdown)."""
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def close(self) -> None:
        """Stop the summaries under way (at shutdown): nothing of theirs is written, the next turn folds again."""
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def summarise(self, conversation_id: int, inbound_id: int | None) -> bool:
        """Fold what is due; True when a new summary was stored. Never raises: a summary is an optimisation."""
        try:
            return await self._summarise(conversation_id, inbound_id)
        except Exception:
            log.exception("summary of conversation %s failed", conversation_id)
            return False

    async def _summarise(self, conversation_id: int, inbound_id: int | None) -> bool:
        async with self.sessions() as s:
            row = (await s.execute(_READ, {"id": conversation_id, "limit": self.history_limit})).first()
        if row is None:
            return False
        stored = [Stored(h["id"], message_from_json(h)) for h in row.history or ()]
        fold = plan(stored, self.config)
        if fold is None:
            return False
        started = time.perf_counter()
        summary, call = None, None
        try:
            answer = await self.model.complete(
                model=self.config.model, messages=request(row.summary, fold.messages), tools=[]
            )
            summary = (answer.content or "").strip()
            error = answer.fallback_from or (None if summary else "empty summary")
            call = LLMCallRecord(AGENT, answer.model or self.config.model, error is None, error, answer.usage,
                                 answer.latency_ms)  # fmt: skip
        except ProviderError as exc:
            error = str(exc)
        if call is None or not call.ok:
            # A stand-in's answer (agents.offline) is no summary either: keep the history as it is.
            log.warning("summary of conversation %s not made: %s", conversation_id, error)
            if len(self._failed) >= MAX_REMEMBERED_FAILURES:
                self._failed.pop(next(iter(self._failed)))
            self._failed[conversation_id] = time.monotonic()
            elapsed = (time.perf_counter() - started) * 1000
            call = LLMCallRecord(AGENT, self.config.model, False, error, call.usage if call else Usage(), elapsed)
            summary = None
        if self.on_call is not None:
            self.on_call(call)
        params = {
            "id": conversation_id,
            "write": summary is not None,
            "summary": summary,
            "through": fold.through,
            "previous": row.summary_through,
            "history_from": row.history_from,
            "inbound_id": inbound_id,
            "agent": call.agent,
            "model": call.model,
            "ok": call.ok,
            "error": call.error,
            "prompt_tokens": call.usage.prompt_tokens,
            "completion_tokens": call.usage.completion_tokens,
            "cached_tokens": call.usage.cached_tokens,
            "latency_ms": call.latency_ms,
        }
        async with self.sessions() as s, s.begin():
            return bool(await s.scalar(_WRITE, params))


_READ = text(
    f"""
SELECT {VALID_SUMMARY.format(c="c")} AS summary, c.summary_through, c.history_from, (
    SELECT jsonb_agg(to_jsonb(h) ORDER BY h.id) FROM (
        SELECT id, role, agent, author, author_name, content, tool_calls, tool_call_id, name FROM messages
        WHERE conversation_id = c.id AND {UNSUMMARISED.format(c="c")}
        ORDER BY id LIMIT :limit
    ) h
) AS history
FROM conversations c WHERE c.id = :id
"""
)

_WRITE = text(
    """
WITH kept AS (
    UPDATE conversations SET summary = :summary, summary_through = :through
    WHERE id = :id AND CAST(:write AS boolean)
      AND summary_through IS NOT DISTINCT FROM CAST(:previous AS bigint)
      AND history_from IS NOT DISTINCT FROM CAST(:history_from AS bigint)
    RETURNING id
), call AS (
    INSERT INTO llm_calls (
        conversation_id, inbound_id, agent, model, ok, error, prompt_tokens, completion_tokens, cached_tokens,
        latency_ms
    ) VALUES (
        :id, :inbound_id, :agent, :model, :ok, :error, :prompt_tokens, :completion_tokens, :cached_tokens,
        :latency_ms
    )
)
SELECT EXISTS (SELECT FROM kept)
"""
)
"""Stored only if the summary it extends is still the conversation's (a summary from another process, or an
admin's reset, came meanwhile: this one is dropped, and the next turn folds again if it is still due)."""
