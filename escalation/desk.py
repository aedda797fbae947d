"""The staff side of a case, in the database: claim, resolve, hand back, reminders, and the deliveries that tell
staff and the customer about each (queued in the same transaction). Every change holds the conversation's lease,
as a turn does (agents.leases), so it never interleaves with one: it waits for a running turn to commit, and sees
what that turn did."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import Address
from agents.db import models as m
from agents.db.deliveries import CasePost, CaseUpdate, Post, Reminder, enqueue
from agents.language import Language
from agents.leases import LeaseLost, Leases, fenced, process_owner
from agents.texts import Text
from escalation.machine import OPEN_CASE, TAKEOVER, CaseStatus, Mode, Moved, Refused, StaffAction
from escalation.policy import EscalationPolicy
from escalation.views import reminder_text

log = logging.getLogger(__name__)

Action = StaffAction
ResolveHook = Callable[[AsyncSession, m.Conversation, m.Escalation, str], Awaitable[None]]
"""Called in the transaction that resolves a case (the conversation's lease held), with the colleague who did it:
what it queues goes out after the customer is told (the CSAT question, `bot.csat`)."""


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    message: str
    """What the colleague who pressed the button is told (ephemerally)."""


class CaseDesk:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        policy: EscalationPolicy,
        on_change: Callable[[], None] = lambda: None,
        leases: Leases | None = None,
        wait_s: float = 300.0,
        after_resolve: ResolveHook | None = None,
    ) -> None:
        self.after_resolve = after_resolve
        self.sessions = sessions
        self.policy = policy
        self.on_change = on_change
        self.leases = leases or Leases(sessions, owner=process_owner())
        self.wait_s = wait_s
        """How long an action waits for a running turn of its conversation (a turn's model calls included)."""

    @asynccontextmanager
    async def _exclusive(self, conversation_id: int) -> AsyncIterator[tuple[AsyncSession, m.Conversation | None]]:
        """The conversation, under its lease, in a transaction that commits only while the lease holds."""
        async with self.sessions() as s:
            if await s.get(m.Conversation, conversation_id) is None:
                yield s, None
                return
        lease = await self.leases.wait_for(conversation_id, timeout_s=self.wait_s)
        if lease is None:
            raise TimeoutError(f"conversation {conversation_id} stayed busy for {self.wait_s:.0f} s")
        try:
            async with self.sessions() as s, s.begin():
                if not await fenced(s, lease, ttl_s=self.leases.ttl_s):
                    raise LeaseLost(f"conversation {conversation_id}")
                yield s, await s.get(m.Conversation, conversation_id)
        finally:
            await self.leases.release(lease)

    async def act(self, *, escalation_id: int, action: Action, user: str, channel: str | None) -> ActionResult:
        if channel != self.policy.staff_channel:
            log.warning("case action %s by %s from channel %s refused", action, user, channel)
            return ActionResult(False, "Case buttons work only in the staff channel.")
        return await self.apply(escalation_id=escalation_id, action=action, user=user)

    async def apply(self, *, escalation_id: int, action: Action, user: str) -> ActionResult:
        """The action itself, for whoever may take it (a case button in the staff channel, an admin command)."""
        async with self.sessions() as s:
            found = await s.get(m.Escalation, escalation_id)
            if found is None:
                return ActionResult(False, f"There is no case #{escalation_id}.")
            conversation_id = found.conversation_id
        async with self._exclusive(conversation_id) as (s, conversation):
            escalation = await s.get(m.Escalation, escalation_id, with_for_update=True)
            if conversation is None or escalation is None:
                return ActionResult(False, f"Case #{escalation_id} has no conversation any more.")
            result = await self._apply_locked(s, conversation, escalation, action, user)
        if result.ok:
            self.on_change()
        return result

    async def on_conversation(
        self, *, conversation_id: int, action: Literal["hand_back", "close"], user: str
    ) -> ActionResult:
        """Hand back or close a conversation, whatever its case. The case is looked up under the conversation's
        lease, so one that a running turn is opening right now is seen (and resolved, or handed back)."""
        async with self._exclusive(conversation_id) as (s, conversation):
            if conversation is None:
                return ActionResult(False, "That conversation no longer exists.")
            escalation = await s.scalar(
                select(m.Escalation)
                .where(m.Escalation.conversation_id == conversation_id, m.Escalation.status.in_(OPEN_CASE))
                .order_by(m.Escalation.id.desc())
                .limit(1)
                .with_for_update()
            )
            if escalation is not None:
                case_action: Action = "resolve" if action == "close" else "hand_back"
                result = await self._apply_locked(s, conversation, escalation, case_action, user)
            elif action == "hand_back":
                where = "closed" if conversation.mode == Mode.CLOSED else "with the bot"
                return ActionResult(False, f"That conversation is already {where}; there is nothing to hand back.")
            else:
                closed = TAKEOVER.close(conversation.mode)
                if isinstance(closed, Refused):
                    return ActionResult(False, closed.message)
                conversation.mode = closed
                await self._tell_customer(s, conversation, Text.RESOLVED_MESSAGE)
                result = ActionResult(True, "Conversation closed.")
        self.on_change()
        return result

    async def escalate(
        self, *, conversation_id: int, reason: str, trigger: str, agent: str | None, customer: str, notice: Text
    ) -> int | None:
        """Open a case for a conversation the bot has, as a turn that escalated would (the customer told `notice`,
        in their language; the case posted for staff); None when people have it already or it is closed."""
        async with self._exclusive(conversation_id) as (s, conversation):
            if conversation is None or TAKEOVER.route(conversation.mode) != "bot":
                return None
            escalation = m.Escalation(
                conversation_id=conversation_id,
                reason=reason,
                trigger=trigger,
                agent=agent or conversation.active_agent,
                customer=customer,
            )
            s.add(escalation)
            await s.flush()
            conversation.mode = TAKEOVER.after_turn(escalated=True)
            await self._tell_customer(s, conversation, notice)
            if self.policy.staff_channel:
                await enqueue(s, [CasePost(conversation_id, escalation.id, self.policy.staff_channel)])
            case_id = escalation.id
        self.on_change()
        return case_id

    async def reset(self, *, conversation_id: int, user: str, entry_agent: str) -> ActionResult:
        """Back to the entry agent with the context cleared: earlier messages stay in the transcript but leave
        the agents' prompt. An open case is resolved, and a customer who was with a person is told."""
        async with self._exclusive(conversation_id) as (s, conversation):
            if conversation is None:
                return ActionResult(False, "That conversation no longer exists.")
            last = await s.scalar(select(func.max(m.Message.id)).where(m.Message.conversation_id == conversation_id))
            mode, tell = TAKEOVER.reset(conversation.mode)
            if tell:
                await self._tell_customer(s, conversation, Text.HANDED_BACK_MESSAGE)
            conversation.mode, conversation.active_agent, conversation.context = mode, entry_agent, {}
            conversation.history_from = (last or 0) + 1
            cases = await s.scalars(
                select(m.Escalation)
                .where(m.Escalation.conversation_id == conversation_id, m.Escalation.status.in_(OPEN_CASE))
                .with_for_update()
            )
            for escalation in cases:
                escalation.status, escalation.closed_by, escalation.closed_at = CaseStatus.RESOLVED, user, func.now()
                await enqueue(s, [CaseUpdate(conversation_id, escalation.id)])
        self.on_change()
        return ActionResult(True, f"Conversation reset: back to {entry_agent}, context cleared.")

    async def _apply_locked(
        self, s: AsyncSession, conversation: m.Conversation, escalation: m.Escalation, action: Action, user: str
    ) -> ActionResult:
        moved = TAKEOVER.act(
            action, status=escalation.status, claimed_by=escalation.claimed_by, user=user, case_id=escalation.id
        )
        if isinstance(moved, Refused):
            return ActionResult(False, moved.message)
        self._move(conversation, escalation, moved, user)
        if moved.tell_customer is not None:
            notice = {"resolved": Text.RESOLVED_MESSAGE, "handed_back": Text.HANDED_BACK_MESSAGE}
            await self._tell_customer(s, conversation, notice[moved.tell_customer])
        if moved.tell_customer == "resolved" and self.after_resolve is not None:
            await self.after_resolve(s, conversation, escalation, user)
        await enqueue(s, [CaseUpdate(conversation.id, escalation.id)])
        return ActionResult(True, moved.message)

    @staticmethod
    def _move(conversation: m.Conversation, escalation: m.Escalation, moved: Moved, user: str) -> None:
        """Write what the machine decided."""
        now = func.now()
        conversation.mode = moved.mode
        if moved.claimed_by is not None and escalation.claimed_by is None:
            escalation.claimed_by, escalation.claimed_at = moved.claimed_by, now
        escalation.status = moved.status
        if moved.closed:
            escalation.closed_by, escalation.closed_at = user, now

    async def _tell_customer(self, s: AsyncSession, conversation: m.Conversation, key: Text) -> None:
        address = Address.parse(conversation.key)
        text = self.policy.texts.get(key, Language.parse(conversation.language))
        if address is not None and text:
            await enqueue(s, [Post(conversation.id, address.channel, address.thread, text)])

    async def remind(self, *, now: datetime) -> int:
        """Post a reminder for each case nobody claimed or answered in time (at most `max_reminders` each).
        `now` is a parameter so that tests control the clock."""
        after = timedelta(seconds=self.policy.reminder_after_s)
        sent = 0
        async with self.sessions() as s, s.begin():
            due = await s.scalars(
                select(m.Escalation)
                .where(
                    m.Escalation.status == CaseStatus.OPEN,
                    m.Escalation.first_response_at.is_(None),
                    m.Escalation.case_ts.is_not(None),
                    m.Escalation.reminders_sent < self.policy.max_reminders,
                )
                .with_for_update(skip_locked=True)
            )
            for escalation in due:
                waited = now - escalation.created_at
                if waited < after * (escalation.reminders_sent + 1):
                    continue
                escalation.reminders_sent += 1
                text = reminder_text(escalation.id, int(waited.total_seconds() // 60))
                await enqueue(s, [Reminder(escalation.conversation_id, escalation.id, text)])
                sent += 1
        if sent:
            self.on_change()
        return sent
