"""Customer satisfaction after a resolved case: the question (1 to 5, as Block Kit buttons) is queued through the
outbox in the transaction that resolves the case, so it is posted exactly once, after the "resolved" notice; the
customer's click is stored with the case's agent, trigger and the colleague who resolved it.

Asked only of Slack customers (the buttons are Slack's), in a sample of cases (`sample_rate`), and at most once
per customer per `cooldown`."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import Address, Platform
from db import models as m
from db.deliveries import CsatAsk, enqueue
from escalation.views import Message

log = logging.getLogger(__name__)

ACTION_PREFIX = "csat_rate_"
"""The buttons' action ids: `csat_rate_1` to `csat_rate_5`; each button's value is the case's id."""
RATINGS = range(1, 6)
FACES = {1: "😞", 2: "🙁", 3: "😐", 4: "🙂", 5: "😄"}
QUESTION = "How did we do? Please rate the help you got from our team."
THANKS = "Thank you for your rating!"
NOT_YOURS = "Only the customer whose conversation it was can rate it."


@dataclass(frozen=True)
class CsatPolicy:
    enabled: bool = True
    sample_rate: float = 1.0
    """The share of resolved cases whose customer is asked (0 to 1)."""
    cooldown: timedelta = timedelta(days=7)
    """No customer is asked twice within this."""
    question: str = QUESTION


@dataclass(frozen=True)
class CsatClick:
    escalation_id: int
    rating: int
    user: str


def csat_click_of(body: Mapping[str, Any]) -> CsatClick | None:
    """The rating a `block_actions` payload carries, or None for anything else."""
    action = (body.get("actions") or [{}])[0]
    rating = str(action.get("action_id", "")).removeprefix(ACTION_PREFIX)
    user = (body.get("user") or {}).get("id")
    value = str(action.get("value", ""))
    if not (rating.isdigit() and int(rating) in RATINGS and value.isdigit() and user):
        return None
    return CsatClick(int(value), int(rating), str(user))


def csat_question(escalation_id: int, question: str) -> Message:
    buttons = [
        {
            "type": "button",
            "action_id": f"{ACTION_PREFIX}{n}",
            "text": {"type": "plain_text", "text": f"{FACES[n]} {n}", "emoji": True},
            "value": str(escalation_id),
        }
        for n in RATINGS
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "plain_text", "text": question}},
        {"type": "actions", "block_id": f"csat_{escalation_id}", "elements": buttons},
    ]
    return Message(question, blocks)


class Csat:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        policy: CsatPolicy,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.sessions = sessions
        self.policy = policy
        self.draw = draw
        """A number in [0, 1) per resolved case, compared with the sample rate (tests pass their own)."""

    async def after_resolve(self, s: AsyncSession, conversation: m.Conversation, case: m.Escalation, user: str) -> None:
        """The case desk's hook (`escalation.desk.ResolveHook`): ask, in the resolving transaction, when due."""
        address = Address.parse(conversation.key)
        policy = self.policy
        if not policy.enabled or address is None or address.platform != Platform.SLACK or case.customer is None:
            return
        if self.draw() >= policy.sample_rate:
            return
        recently = await s.scalar(
            select(func.count()).where(m.Csat.customer == case.customer, m.Csat.asked_at > func.now() - policy.cooldown)
        )
        if recently:
            log.info("case %s: CSAT not asked, %s was asked within %s", case.id, case.customer, policy.cooldown)
            return
        asked = await s.scalar(
            insert(m.Csat)
            .values(
                escalation_id=case.id,
                conversation_id=conversation.id,
                customer=case.customer,
                agent=case.agent,
                trigger=case.trigger,
                resolved_by=user,
            )
            .on_conflict_do_nothing(index_elements=["escalation_id"])
            .returning(m.Csat.id)
        )
        if asked is not None:
            await enqueue(s, [CsatAsk(conversation.id, case.id, address.channel, address.thread, policy.question)])

    async def rate(self, click: CsatClick) -> str:
        """Store the customer's rating (the last click kept); what they are told."""
        async with self.sessions() as s, s.begin():
            rated = await s.scalar(
                update(m.Csat)
                .where(m.Csat.escalation_id == click.escalation_id, m.Csat.customer == click.user)
                .values(rating=click.rating, rated_at=func.now())
                .returning(m.Csat.id)
            )
        return THANKS if rated is not None else NOT_YOURS
