"""Durable conversations: every customer message is stored before anything else happens, then turns run one
at a time per conversation, in arrival order, across processes.

    submit()        stores the message (idempotent on external_id) and returns at once
    run_leased()    under the conversation's lease (agents.leases), runs its waiting messages in order: each in
                    a short transaction that counts the attempt and reads what the turn needs, the turn itself
                    (LLM and tool calls) outside any transaction, then one short transaction that checks the
                    lease's fence and commits everything the turn produced
    process_next()  claims a lease, runs one message, releases it; handle(): submit, then process until this
                    message is done (what the CLI and tests call)

No transaction, row lock or pooled connection is held across a model call. A turn whose lease expired
meanwhile commits nothing (LeaseLost) and is run again by the next holder; a crash leaves the message
unprocessed, to be run again once the lease expires; after `max_attempts` failures the customer gets an apology
and a human instead of silence.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from sqlalchemy import func, insert, literal, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.agent import Roster
from agents.leases import Lease, LeaseLost, Leases, fenced, process_owner
from agents.logcontext import current_conversation
from agents.loop import Escalate, EventSink, HandoffRecord, LoopConfig, TurnInput, TurnResult, run_turn
from agents.messages import Message, ToolCall
from agents.model import Model
from db import models as m

log = logging.getLogger(__name__)

Mode = Literal["bot", "awaiting_human", "human", "closed"]
_OLDEST_FIRST = (m.Inbound.order_key.asc().nulls_last(), m.Inbound.id)


@dataclass(frozen=True)
class Submitted:
    conversation_id: int
    inbound_id: int
    duplicate: bool
    """True when this external_id was already stored: the caller must not act on it twice."""


@dataclass(frozen=True)
class MessageResult:
    """What became of one customer message; stored with it, so any process can read it back."""

    inbound_id: int
    conversation_id: int
    kind: Literal["reply", "escalated", "human", "staff"]
    """reply: an agent answered; escalated: the turn ended with a human; human: a human owns the conversation
    and the customer's message waits for them; staff: a human colleague's message for the customer."""
    reply: str | None
    agent: str
    handoffs: tuple[HandoffRecord, ...] = ()
    escalation_reason: str | None = None
    escalation_id: int | None = None
    """The escalation this message opened or belongs to."""

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "reply": self.reply,
            "agent": self.agent,
            "handoffs": [[h.from_agent, h.to_agent, h.reason] for h in self.handoffs],
            "escalation_reason": self.escalation_reason,
            "escalation_id": self.escalation_id,
        }

    @classmethod
    def from_json(cls, inbound_id: int, conversation_id: int, raw: dict[str, Any]) -> MessageResult:
        return cls(
            inbound_id,
            conversation_id,
            raw["kind"],
            raw["reply"],
            raw["agent"],
            tuple(HandoffRecord(*h) for h in raw["handoffs"]),
            raw["escalation_reason"],
            raw.get("escalation_id"),
        )


@dataclass(frozen=True)
class ConversationState:
    id: int
    key: str
    mode: Mode
    agent: str
    context: dict[str, Any]


@dataclass(frozen=True)
class TurnCommit:
    """What a host hears about each processed message, inside the turn's transaction."""

    key: str
    conversation_id: int
    external_id: str | None
    author: str | None
    text: str
    """The message as it came in (a customer's, or a colleague's for `staff` results)."""
    result: MessageResult


TurnHook = Callable[[AsyncSession, TurnCommit], Awaitable[None]]


@dataclass(frozen=True)
class _Planned:
    """A message that needs a turn: what the turn gets, read in the first transaction."""

    input: TurnInput


def _row_to_message(row: m.Message) -> Message:
    return Message(
        role=row.role,  # type: ignore[arg-type]
        content=row.content,
        agent=row.agent,
        tool_calls=tuple(ToolCall(**c) for c in row.tool_calls or ()),
        tool_call_id=row.tool_call_id,
        name=row.name,
        author=row.author,
    )


def _message_row(conversation_id: int, inbound_id: int, msg: Message) -> dict[str, Any]:
    return {
        "conversation_id": conversation_id,
        "inbound_id": inbound_id,
        "role": msg.role,
        "agent": msg.agent,
        "author": msg.author,
        "content": msg.content,
        "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in msg.tool_calls] or None,
        "tool_call_id": msg.tool_call_id,
        "name": msg.name,
    }


class Conversations:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        roster: Roster,
        model: Model,
        config: LoopConfig,
        history_limit: int = 200,
        max_attempts: int = 3,
        after_turn: TurnHook | None = None,
        leases: Leases | None = None,
    ) -> None:
        self.sessions = sessions
        self.leases = leases or Leases(sessions, owner=process_owner())
        self.roster = roster
        self.model = model
        self.config = config
        self.history_limit = history_limit
        """Rows loaded per turn; the token window trims further. Bounded so long threads stay cheap."""
        self.max_attempts = max_attempts
        self.after_turn = after_turn
        """Called inside each turn's transaction, so what the host writes (an outbox) commits with the turn."""

    async def submit(
        self,
        key: str,
        text: str,
        *,
        author: str | None = None,
        external_id: str | None = None,
        order_key: str | None = None,
    ) -> Submitted:
        async with self.sessions() as s, s.begin():
            return await self.submit_in(s, key, text, author=author, external_id=external_id, order_key=order_key)

    async def submit_in(
        self,
        s: AsyncSession,
        key: str,
        text: str,
        *,
        author: str | None = None,
        external_id: str | None = None,
        order_key: str | None = None,
        kind: Literal["customer", "staff"] = "customer",
    ) -> Submitted:
        """Store a customer message inside the caller's transaction (so it can be one write with the caller's
        own rows). `order_key` orders messages of one conversation when arrival order may differ from the
        order they were written in (Slack's ts); messages without one run in arrival order."""
        # A plain read first: an INSERT that meets the existing row (even with ON CONFLICT DO NOTHING) waits for
        # any transaction that has updated it, such as a running turn, and storing must never wait for a turn.
        conversation_id = await s.scalar(select(m.Conversation.id).where(m.Conversation.key == key))
        if conversation_id is None:
            conversation_id = await s.scalar(
                pg_insert(m.Conversation)
                .values(key=key, active_agent=self.roster.entry)
                .on_conflict_do_nothing(index_elements=["key"])
                .returning(m.Conversation.id)
            ) or await s.scalar(select(m.Conversation.id).where(m.Conversation.key == key))
        assert conversation_id is not None
        inbound_id = await s.scalar(
            pg_insert(m.Inbound)
            .values(
                conversation_id=conversation_id,
                text=text,
                author=author,
                external_id=external_id,
                order_key=order_key,
                kind=kind,
            )
            .on_conflict_do_nothing(index_elements=["conversation_id", "external_id"])
            .returning(m.Inbound.id)
        )
        if inbound_id is not None:
            return Submitted(conversation_id, inbound_id, duplicate=False)
        existing = await s.scalar(
            select(m.Inbound.id).where(
                m.Inbound.conversation_id == conversation_id, m.Inbound.external_id == external_id
            )
        )
        assert existing is not None
        return Submitted(conversation_id, existing, duplicate=True)

    async def handle(
        self,
        key: str,
        text: str,
        *,
        author: str | None = None,
        external_id: str | None = None,
        on_event: EventSink | None = None,
    ) -> MessageResult:
        submitted = await self.submit(key, text, author=author, external_id=external_id)
        while (result := await self.result_of(submitted.inbound_id)) is None:
            try:
                await self.process_next(submitted.conversation_id, on_event=on_event)
            except Exception:
                log.exception("turn failed; retrying")
                await asyncio.sleep(0.1)
        return result

    async def result_of(self, inbound_id: int) -> MessageResult | None:
        async with self.sessions() as s:
            row = await s.get(m.Inbound, inbound_id)
            if row is None or row.outcome is None:
                return None
            return MessageResult.from_json(row.id, row.conversation_id, row.outcome)

    async def pending_conversations(self) -> list[int]:
        """Conversations with unprocessed messages, oldest first: what to resume after a restart."""
        async with self.sessions() as s:
            rows = await s.execute(
                select(m.Inbound.conversation_id)
                .where(m.Inbound.processed_at.is_(None))
                .group_by(m.Inbound.conversation_id)
                .order_by(func.min(m.Inbound.id))
            )
            return [r[0] for r in rows]

    async def state(self, key: str) -> ConversationState | None:
        async with self.sessions() as s:
            row = await s.scalar(select(m.Conversation).where(m.Conversation.key == key))
            if row is None:
                return None
            return ConversationState(row.id, row.key, row.mode, row.active_agent, dict(row.context))  # type: ignore[arg-type]

    async def process_next(
        self, conversation_id: int | None = None, *, on_event: EventSink | None = None, wait_s: float = 300.0
    ) -> MessageResult | None:
        """Run the oldest waiting message of one conversation (waiting up to `wait_s` while another holder has
        its lease), or, with no id, of any conversation with waiting messages that nobody runs. None when there
        was nothing to do."""
        if conversation_id is None:
            claimed = await self.leases.claim_pending(1)
            lease = claimed[0] if claimed else None
        else:
            lease = await self.leases.wait_for(conversation_id, timeout_s=wait_s)
        if lease is None:
            return None
        failed = False
        keeper = asyncio.create_task(self.leases.keep(lease, asyncio.Event()), name="lease-keeper")
        try:
            return await self.run_one(lease, on_event=on_event)
        except Exception:
            failed = True
            raise
        finally:
            keeper.cancel()
            await self.leases.release(lease, retry_after_s=0.2 if failed else 0.0)

    async def run_leased(self, lease: Lease, *, on_event: EventSink | None = None) -> list[MessageResult]:
        """Every waiting message of the leased conversation, in order, renewing the lease meanwhile; released at
        the end (after a failure, kept from everyone for a second, so a failing message is not retried in a
        tight loop). Raises LeaseLost when the lease was taken: what was committed before stays."""
        lost = asyncio.Event()
        keeper = asyncio.create_task(self.leases.keep(lease, lost), name=f"lease-{lease.conversation_id}")
        results: list[MessageResult] = []
        retry_after = 0.0
        try:
            while (result := await self.run_one(lease, on_event=on_event)) is not None:
                results.append(result)
                if lost.is_set():
                    raise LeaseLost(f"conversation {lease.conversation_id}")
        except Exception:
            retry_after = 1.0
            raise
        finally:
            keeper.cancel()
            await self.leases.release(lease, retry_after_s=retry_after)
        return results

    async def run_one(self, lease: Lease, *, on_event: EventSink | None = None) -> MessageResult | None:
        """The oldest waiting message of the leased conversation, or None when there is none."""
        # The attempt is counted in its own committed statement, before anything that can fail: a message that
        # keeps failing, even by killing the process, gets the apology and a human after `max_attempts`.
        counted = await self._count_attempt(lease)
        if counted is None:
            return None
        inbound_id, attempt = counted
        async with self.sessions() as s, s.begin():
            if not await fenced(s, lease, ttl_s=self.leases.ttl_s):
                raise LeaseLost(f"conversation {lease.conversation_id}")
            conv = await s.get(m.Conversation, lease.conversation_id)
            inbound = await s.get(m.Inbound, inbound_id)
            assert conv is not None and inbound is not None
            current_conversation.set(conv.key)
            planned = await self._plan(s, conv, inbound, give_up=attempt > self.max_attempts)
            if isinstance(planned, MessageResult):
                return planned  # decided without a turn (staff, human, paused, given up): committed here
        try:
            turn = await run_turn(
                planned.input, roster=self.roster, model=self.model, config=self.config, db=self.sessions,
                on_event=on_event,
            )  # fmt: skip
        except Exception:
            if attempt < self.max_attempts:
                raise
            log.exception("turn failed %d times; apologising", attempt)
            return await self._finish(lease, planned, None)
        return await self._finish(lease, planned, turn)

    async def _finish(self, lease: Lease, planned: _Planned, turn: TurnResult | None) -> MessageResult:
        """The turn's one commit: nothing unless the lease still holds."""
        async with self.sessions() as s, s.begin():
            if not await fenced(s, lease, ttl_s=self.leases.ttl_s):
                raise LeaseLost(f"conversation {lease.conversation_id}")
            conv = await s.get(m.Conversation, lease.conversation_id)
            inbound = await s.get(m.Inbound, planned.input.inbound_id)
            assert conv is not None and inbound is not None
            user = planned.input.history[-1]
            if turn is None:
                reason = Escalate("the bot failed repeatedly on this message", "error")
                apology = self.config.texts.provider_failure
                return await self._to_human(
                    s, conv, inbound, user, planned.input.agent, dict(planned.input.context), reason, apology
                )
            return await self._commit_turn(s, conv, inbound, user, turn)

    async def _count_attempt(self, lease: Lease) -> tuple[int, int] | None:
        """(message, its attempt number) for the oldest waiting message, counted; None when none waits.
        Raises LeaseLost when the lease is gone."""
        async with self.sessions() as s, s.begin():
            if not await fenced(s, lease, ttl_s=self.leases.ttl_s):
                raise LeaseLost(f"conversation {lease.conversation_id}")
            oldest = (
                select(m.Inbound.id)
                .where(m.Inbound.conversation_id == lease.conversation_id, m.Inbound.processed_at.is_(None))
                .order_by(*_OLDEST_FIRST)
                .limit(1)
                .scalar_subquery()
            )
            row = (
                await s.execute(
                    update(m.Inbound)
                    .where(m.Inbound.id == oldest)
                    .values(attempts=m.Inbound.attempts + 1)
                    .returning(m.Inbound.id, m.Inbound.attempts)
                )
            ).first()
            return (int(row[0]), int(row[1])) if row else None

    async def _plan(
        self, s: AsyncSession, conv: m.Conversation, inbound: m.Inbound, *, give_up: bool
    ) -> MessageResult | _Planned:
        """Within the first transaction: the outcome when no turn is needed, else what the turn needs."""
        if inbound.kind == "staff":
            return await self._staff_message(s, conv, inbound)
        user = Message("user", inbound.text, author=inbound.author)
        if conv.mode == "closed":
            # Reopened with the bot (written to the row with the turn's results).
            agent, context, reopened = self.roster.entry, {}, True
        else:
            agent, context, reopened = conv.active_agent, dict(conv.context), False
        if conv.mode != "bot" and not reopened:
            escalation = await self._open_escalation(s, conv.id)
            result = MessageResult(
                inbound.id,
                conv.id,
                "human",
                None,
                conv.active_agent,
                escalation_id=escalation.id if escalation else None,
            )
            await self._store(s, conv, inbound, [user], result)
            return result
        if give_up:
            reason = Escalate("the bot failed repeatedly on this message", "error")
            apology = self.config.texts.provider_failure
            return await self._to_human(s, conv, inbound, user, agent, context, reason, apology)
        if await self._paused(s, conv.key):
            reason = Escalate("the bot is paused here by an admin", "paused")
            return await self._to_human(s, conv, inbound, user, agent, context, reason, self.config.texts.paused)
        history = await self._history(s, conv.id, conv.history_from)
        return _Planned(TurnInput(conv.id, inbound.id, agent, context, (*history, user)))

    async def _commit_turn(
        self, s: AsyncSession, conv: m.Conversation, inbound: m.Inbound, user: Message, turn: TurnResult
    ) -> MessageResult:
        escalated = isinstance(turn.outcome, Escalate)
        result = MessageResult(
            inbound.id,
            conv.id,
            "escalated" if escalated else "reply",
            turn.reply,
            turn.agent,
            turn.handoffs,
            turn.outcome.reason if isinstance(turn.outcome, Escalate) else None,
        )
        conv.mode, conv.active_agent, conv.context = "bot", turn.agent, turn.context
        if isinstance(turn.outcome, Escalate):
            result = replace(result, escalation_id=await self._escalate(s, conv, inbound, turn.outcome, turn.agent))
        await self._audit(s, conv.id, inbound.id, turn)
        await self._store(s, conv, inbound, [user, *turn.messages], result)
        return result

    async def _to_human(
        self,
        s: AsyncSession,
        conv: m.Conversation,
        inbound: m.Inbound,
        user: Message,
        agent: str,
        context: dict[str, Any],
        reason: Escalate,
        text: str,
    ) -> MessageResult:
        """End the turn without an agent: the customer is told `text` and a human gets the case."""
        notice = Message("assistant", text, agent=agent)
        result = MessageResult(inbound.id, conv.id, "escalated", text, agent, (), reason.reason)
        conv.active_agent, conv.context = agent, context
        result = replace(result, escalation_id=await self._escalate(s, conv, inbound, reason, agent))
        await self._store(s, conv, inbound, [user, notice], result)
        return result

    async def _paused(self, s: AsyncSession, key: str) -> bool:
        paused = await s.scalar(select(func.count()).select_from(m.Pause).where(literal(key).like(m.Pause.scope)))
        return bool(paused)

    async def _history(self, s: AsyncSession, conversation_id: int, history_from: int | None) -> list[Message]:
        rows = await s.scalars(
            select(m.Message)
            .where(m.Message.conversation_id == conversation_id, m.Message.id >= (history_from or 0))
            .order_by(m.Message.id.desc())
            .limit(self.history_limit)
        )
        return [_row_to_message(r) for r in reversed(rows.all())]

    async def _store(
        self, s: AsyncSession, conv: m.Conversation, inbound: m.Inbound, messages: list[Message], result: MessageResult
    ) -> None:
        # render_nulls: one batched INSERT, instead of one per pattern of NULL columns.
        rows = [_message_row(conv.id, inbound.id, msg) for msg in messages]
        await s.execute(insert(m.Message).execution_options(render_nulls=True), rows)
        conv.updated_at = func.now()
        inbound.processed_at = func.now()
        inbound.outcome = result.to_json()
        if self.after_turn is not None:
            await self.after_turn(
                s, TurnCommit(conv.key, conv.id, inbound.external_id, inbound.author, inbound.text, result)
            )

    async def _escalate(
        self, s: AsyncSession, conv: m.Conversation, inbound: m.Inbound, outcome: Escalate, agent: str
    ) -> int:
        conv.mode = "awaiting_human"
        escalation = m.Escalation(
            conversation_id=conv.id,
            inbound_id=inbound.id,
            reason=outcome.reason,
            trigger=outcome.trigger,
            agent=agent,
            customer=inbound.author,
        )
        s.add(escalation)
        await s.flush()
        return escalation.id

    async def _open_escalation(self, s: AsyncSession, conversation_id: int) -> m.Escalation | None:
        return await s.scalar(
            select(m.Escalation)
            .where(m.Escalation.conversation_id == conversation_id, m.Escalation.status.in_(("open", "claimed")))
            .order_by(m.Escalation.id.desc())
            .limit(1)
        )

    async def _staff_message(self, s: AsyncSession, conv: m.Conversation, inbound: m.Inbound) -> MessageResult:
        """A colleague's reply: kept in the transcript (so agents know what was said after a hand back) and
        relayed; the first one claims the case for its author if nobody has."""
        escalation = await self._open_escalation(s, conv.id)
        if escalation is None or conv.mode not in ("awaiting_human", "human"):
            # The case was handed back or closed meanwhile: nothing to relay any more.
            result = MessageResult(inbound.id, conv.id, "human", None, conv.active_agent)
            inbound.processed_at, inbound.outcome = func.now(), result.to_json()
            return result
        conv.mode = "human"
        now = func.now()
        if escalation.claimed_by is None:
            escalation.claimed_by, escalation.claimed_at, escalation.status = inbound.author, now, "claimed"
        if escalation.first_response_at is None:
            escalation.first_response_at = now
        result = MessageResult(
            inbound.id, conv.id, "staff", inbound.text, conv.active_agent, escalation_id=escalation.id
        )
        staff = Message("staff", inbound.text, author=inbound.author)
        await self._store(s, conv, inbound, [staff], result)
        return result

    async def _audit(self, s: AsyncSession, conversation_id: int, inbound_id: int, turn: TurnResult) -> None:
        ids = {"conversation_id": conversation_id, "inbound_id": inbound_id}
        if turn.handoffs:
            await s.execute(
                insert(m.Handoff),
                [
                    {**ids, "from_agent": h.from_agent, "to_agent": h.to_agent, "reason": h.reason}
                    for h in turn.handoffs
                ],
            )
        if turn.tools:
            await s.execute(
                insert(m.ToolRun),
                [
                    {
                        **ids,
                        "agent": t.agent,
                        "call_id": t.call.id,
                        "tool": t.call.name,
                        "arguments": t.call.arguments,
                        "ok": t.ok,
                        "output": t.output,
                        "duration_ms": t.duration_ms,
                    }
                    for t in turn.tools
                ],
            )
        if turn.llm_calls:
            await s.execute(
                insert(m.LLMCall),
                [
                    {
                        **ids,
                        "agent": c.agent,
                        "model": c.model,
                        "ok": c.ok,
                        "error": c.error,
                        "prompt_tokens": c.usage.prompt_tokens,
                        "completion_tokens": c.usage.completion_tokens,
                        "cached_tokens": c.usage.cached_tokens,
                        "latency_ms": c.latency_ms,
                    }
                    for c in turn.llm_calls
                ],
            )
