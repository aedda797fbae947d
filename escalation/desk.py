"""The staff side of a case, in the database: claim, resolve, hand back, reminders, and the outbox rows that
tell Slack about each. Every change locks the conversation row like a turn does, so it never interleaves
with one."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from db import models as m
from escalation.policy import EscalationPolicy

log = logging.getLogger(__name__)

Action = Literal["claim", "resolve", "hand_back"]
OPEN = ("open", "claimed")


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    message: str
    """What the colleague who pressed the button is told (ephemerally)."""


def customer_thread(key: str) -> tuple[str, str | None] | None:
    """(channel, thread) of a Slack conversation key; DMs answer outside threads."""
    parts = key.split(":")
    if len(parts) != 4 or parts[0] != "slack":
        return None
    return parts[2], None if parts[3] == "dm" else parts[3]


class CaseDesk:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        policy: EscalationPolicy,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.sessions = sessions
        self.policy = policy
        self.on_change = on_change

    async def act(self, *, escalation_id: int, action: Action, user: str, channel: str | None) -> ActionResult:
        if channel != self.policy.staff_channel:
            log.warning("case action %s by %s from channel %s refused", action, user, channel)
            return ActionResult(False, "Case buttons work only in the staff channel.")
        async with self.sessions() as s, s.begin():
            escalation = await s.get(m.Escalation, escalation_id)
            if escalation is None:
                return ActionResult(False, f"There is no case #{escalation_id}.")
            conversation = await s.scalar(
                select(m.Conversation)
                .where(m.Conversation.id == escalation.conversation_id)
                .with_for_update(key_share=True)
            )
            await s.refresh(escalation, with_for_update=True)
            if conversation is None or escalation.status not in OPEN:
                return ActionResult(False, f"Case #{escalation_id} is already {escalation.status.replace('_', ' ')}.")
            now = func.now()
            rows: list[dict[str, object]] = []
            thread = customer_thread(conversation.key)
            match action:
                case "claim":
                    if escalation.claimed_by is not None:
                        return ActionResult(
                            False, f"Case #{escalation_id} is already claimed by <@{escalation.claimed_by}>."
                        )
                    escalation.claimed_by, escalation.claimed_at, escalation.status = user, now, "claimed"
                    conversation.mode = "human"
                    message = f"You have claimed case #{escalation_id}."
                case "resolve" | "hand_back":
                    escalation.status = "resolved" if action == "resolve" else "handed_back"
                    escalation.closed_by, escalation.closed_at = user, now
                    # Handed back: the last AI agent picks up again, with the human exchange in its transcript.
                    conversation.mode = "closed" if action == "resolve" else "bot"
                    notice = self.policy.resolved_message if action == "resolve" else self.policy.handed_back_message
                    if thread is not None and notice:
                        rows.append(_post(conversation.id, thread[0], thread[1], notice))
                    message = (
                        f"Case #{escalation_id} {'resolved' if action == 'resolve' else 'handed back to the bot'}."
                    )
            rows.append(_case_update(conversation.id, escalation_id))
            await s.execute(insert(m.Outbox), rows)
        self.on_change()
        return ActionResult(True, message)

    async def remind(self, *, now: datetime) -> int:
        """Post a reminder for each case nobody claimed or answered in time (at most `max_reminders` each).
        `now` is a parameter so that tests control the clock."""
        after = timedelta(seconds=self.policy.reminder_after_s)
        sent = 0
        async with self.sessions() as s, s.begin():
            due = await s.scalars(
                select(m.Escalation)
                .where(
                    m.Escalation.status == "open",
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
                minutes = int(waited.total_seconds() // 60)
                text = (
                    f":alarm_clock: Case #{escalation.id} has waited {minutes} min for a colleague. "
                    "Can someone take it?"
                )
                await s.execute(
                    insert(m.Outbox).values(
                        conversation_id=escalation.conversation_id,
                        kind="reminder",
                        channel=escalation.case_channel,
                        escalation_id=escalation.id,
                        text=text,
                    )
                )
                sent += 1
        if sent:
            self.on_change()
        return sent


def _post(conversation_id: int, channel: str, thread_ts: str | None, text: str) -> dict[str, object]:
    return {
        "conversation_id": conversation_id,
        "kind": "post",
        "channel": channel,
        "thread_ts": thread_ts,
        "text": text,
    }


def _case_update(conversation_id: int, escalation_id: int) -> dict[str, object]:
    return {"conversation_id": conversation_id, "kind": "update_case", "channel": "", "escalation_id": escalation_id}
