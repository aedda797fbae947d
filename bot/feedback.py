"""👍/👎 on the bot's answers: the click names a posted message (channel and ts), which is the outbox row whose
`result_ts` it is, and so its conversation and the assistant message (and agent) it showed. One rating per answer
per person: the latest click wins (by Slack's action_ts, so a late retry of an older click changes nothing). A 👎
may open a case (`escalate_on_bad`), through the case desk, as if the agent had escalated."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.texts import Text
from escalation.desk import CaseDesk

log = logging.getLogger(__name__)

ACTION_FEEDBACK = "answer_feedback"
"""The action_id of the feedback buttons under every answer."""
TRIGGER = "feedback"
"""The escalation trigger of a case a 👎 opened."""
REASON = "customer rated an answer 👎"


class Rating(StrEnum):
    GOOD = "good"
    BAD = "bad"


@dataclass(frozen=True)
class FeedbackClick:
    channel: str
    message_ts: str
    user: str
    rating: Rating
    action_ts: str


def feedback_click_of(body: Mapping[str, Any]) -> FeedbackClick | None:
    """The click a `block_actions` payload carries, or None when it is not one of ours."""
    action = (body.get("actions") or [{}])[0]
    container = body.get("container") or {}
    user = (body.get("user") or {}).get("id")
    channel, ts = container.get("channel_id"), container.get("message_ts")
    value = action.get("value")
    if action.get("action_id") != ACTION_FEEDBACK or value not in tuple(Rating) or not (user and channel and ts):
        return None
    return FeedbackClick(str(channel), str(ts), str(user), Rating(value), str(action.get("action_ts") or ""))


@dataclass(frozen=True)
class Recorded:
    conversation_id: int
    rating: Rating
    escalation_id: int | None = None
    """The case the 👎 opened."""


class Feedback:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        desk: CaseDesk,
        escalate_on_bad: bool = False,
    ) -> None:
        self.sessions = sessions
        self.desk = desk
        self.escalate_on_bad = escalate_on_bad

    async def record(self, click: FeedbackClick) -> Recorded | None:
        """Store the click; None when the message is not one of the bot's answers."""
        async with self.sessions() as s, s.begin():
            post = (
                await s.execute(
                    select(m.Outbox.id, m.Outbox.conversation_id, m.Outbox.created_at).where(
                        m.Outbox.channel == click.channel, m.Outbox.result_ts == click.message_ts
                    )
                )
            ).first()
            if post is None or post.conversation_id is None:
                log.warning("feedback on %s %s: not an answer the bot posted", click.channel, click.message_ts)
                return None
            # A bystander's or a colleague's click is not a customer's verdict (and must not open their case).
            asked = await s.scalar(
                select(m.Inbound.id)
                .where(
                    m.Inbound.conversation_id == post.conversation_id,
                    m.Inbound.author == click.user,
                    m.Inbound.kind == "customer",
                )
                .limit(1)
            )
            if asked is None:
                log.info("feedback by %s on %s: not a customer of that conversation", click.user, click.message_ts)
                return None
            # The answer's words were queued in the transaction that wrote its assistant message: the latest one
            # written by then is it.
            answer = (
                await s.execute(
                    select(m.Message.id, m.Message.agent)
                    .where(
                        m.Message.conversation_id == post.conversation_id,
                        m.Message.role == "assistant",
                        m.Message.content.is_not(None),
                        m.Message.created_at <= post.created_at,
                    )
                    .order_by(m.Message.id.desc())
                    .limit(1)
                )
            ).first()
            stored = insert(m.AnswerFeedback).values(
                conversation_id=post.conversation_id,
                outbox_id=post.id,
                message_id=answer.id if answer else None,
                agent=answer.agent if answer else None,
                channel=click.channel,
                message_ts=click.message_ts,
                user_id=click.user,
                rating=click.rating,
                action_ts=click.action_ts,
            )
            await s.execute(
                stored.on_conflict_do_update(
                    index_elements=["channel", "message_ts", "user_id"],
                    set_={
                        "rating": stored.excluded.rating,
                        "action_ts": stored.excluded.action_ts,
                        "updated_at": func.now(),
                    },
                    where=m.AnswerFeedback.action_ts <= stored.excluded.action_ts,
                )
            )
            agent = answer.agent if answer else None
        case = None
        if click.rating == Rating.BAD and self.escalate_on_bad:
            case = await self.desk.escalate(
                conversation_id=post.conversation_id,
                reason=REASON,
                trigger=TRIGGER,
                agent=agent,
                customer=click.user,
                notice=Text.ESCALATION_MESSAGE,
            )
        return Recorded(post.conversation_id, click.rating, case)
