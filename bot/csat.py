"""Customer satisfaction after a resolved case: the question (1 to 5, as Block Kit buttons) is queued through the
outbox in the transaction that resolves the case, so it is posted exactly once, after the "resolved" notice; the
customer's click is stored with the case's agent, trigger and the colleague who resolved it, and a modal (opened
with the click's trigger_id) asks for an optional comment, stored on the same row when the customer submits it.

Asked only where the customer's channel can survey (`Capabilities.surveys`: buttons whose clicks come back as the
customer's), in a sample of cases (`sample_rate`), and at most once per customer per `cooldown`."""

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

from agents.address import Address
from agents.db import models as m
from agents.db.deliveries import CsatAsk, enqueue
from bot.channels.capabilities import Channels
from escalation.views import Message

log = logging.getLogger(__name__)

ACTION_PREFIX = "csat_rate_"
"""The buttons' action ids: `csat_rate_1` to `csat_rate_5`; each button's value is the case's id."""
RATINGS = range(1, 6)
FACES = {1: "😞", 2: "🙁", 3: "😐", 4: "🙂", 5: "😄"}
QUESTION = "How did we do? Please rate the help you got from our team."
THANKS = "Thank you for your rating!"
NOT_YOURS = "Only the customer whose conversation it was can rate it."
COMMENT_CALLBACK = "csat_comment"
"""The comment modal's callback_id; its private_metadata is the case's id."""
COMMENT_BLOCK, COMMENT_INPUT = "csat_comment", "comment"
COMMENT_TITLE = "Thanks for rating us"
COMMENT_LABEL = "Anything we could do better?"
COMMENT_MAX = 2000
"""Characters a comment may have (the input refuses more; a longer one is cut, should it arrive)."""
COMMENT_NOT_YOURS = "Only the customer who rated this case can comment on it."


@dataclass(frozen=True)
class CsatPolicy:
    enabled: bool = True
    sample_rate: float = 1.0
    """The share of resolved cases whose customer is asked (0 to 1)."""
    cooldown: timedelta = timedelta(days=7)
    """No customer is asked twice within this."""
    question: str = QUESTION
    thanks: str = THANKS
    """Said to a customer who rated, when the comment form cannot be shown."""


@dataclass(frozen=True)
class CsatClick:
    escalation_id: int
    rating: int
    user: str
    trigger: str | None = None
    """The click's trigger_id: what opens the comment modal (once, within 3 seconds)."""


def csat_click_of(body: Mapping[str, Any]) -> CsatClick | None:
    """The rating a `block_actions` payload carries, or None for anything else."""
    action = (body.get("actions") or [{}])[0]
    rating = str(action.get("action_id", "")).removeprefix(ACTION_PREFIX)
    user = (body.get("user") or {}).get("id")
    value = str(action.get("value", ""))
    if not (rating.isdigit() and int(rating) in RATINGS and value.isdigit() and user):
        return None
    trigger = body.get("trigger_id")
    return CsatClick(int(value), int(rating), str(user), str(trigger) if trigger else None)


@dataclass(frozen=True)
class CsatComment:
    escalation_id: int
    user: str
    text: str
    """Stripped, never empty."""


def csat_comment_of(body: Mapping[str, Any]) -> CsatComment | None:
    """The comment a `view_submission` of the comment modal carries, or None (another view, or left empty)."""
    view = body.get("view") or {}
    metadata = str(view.get("private_metadata") or "")
    user = (body.get("user") or {}).get("id")
    values = ((view.get("state") or {}).get("values") or {}).get(COMMENT_BLOCK) or {}
    text = str((values.get(COMMENT_INPUT) or {}).get("value") or "").strip()
    if view.get("callback_id") != COMMENT_CALLBACK or not metadata.isdigit() or not user or not text:
        return None
    return CsatComment(int(metadata), str(user), text[:COMMENT_MAX])


def comment_modal(escalation_id: int) -> dict[str, Any]:
    """The modal that thanks the customer for their rating and asks for an optional comment."""
    return {
        "type": "modal",
        "callback_id": COMMENT_CALLBACK,
        "private_metadata": str(escalation_id),
        "title": {"type": "plain_text", "text": COMMENT_TITLE},
        "submit": {"type": "plain_text", "text": "Send"},
        "close": {"type": "plain_text", "text": "Skip"},
        "blocks": [
            {
                "type": "input",
                "block_id": COMMENT_BLOCK,
                "optional": True,
                "label": {"type": "plain_text", "text": COMMENT_LABEL},
                "element": {
                    "type": "plain_text_input",
                    "action_id": COMMENT_INPUT,
                    "multiline": True,
                    "max_length": COMMENT_MAX,
                },
            }
        ],
    }


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
        channels: Channels,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.sessions = sessions
        self.policy = policy
        self.channels = channels
        self.draw = draw
        """A number in [0, 1) per resolved case, compared with the sample rate (tests pass their own)."""

    async def after_resolve(self, s: AsyncSession, conversation: m.Conversation, case: m.Escalation, user: str) -> None:
        """The case desk's hook (`escalation.desk.ResolveHook`): ask, in the resolving transaction, when due."""
        address = Address.parse(conversation.key)
        policy = self.policy
        if not policy.enabled or address is None or not self._surveys(address.platform) or case.customer is None:
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

    def _surveys(self, platform: str) -> bool:
        """Whether `platform` (a key's: the terminal chat's is none) is a channel that can ask."""
        return any(channel.platform == platform and channel.capabilities.surveys for channel in self.channels)

    async def rate(self, click: CsatClick) -> bool:
        """Store the customer's rating (the last click kept); False when the clicker is not the case's customer."""
        async with self.sessions() as s, s.begin():
            rated = await s.scalar(
                update(m.Csat)
                .where(m.Csat.escalation_id == click.escalation_id, m.Csat.customer == click.user)
                .values(rating=click.rating, rated_at=func.now())
                .returning(m.Csat.id)
            )
        return rated is not None

    async def comment(self, comment: CsatComment) -> bool:
        """Store the comment on the row its author rated (the last one kept); False when the author is not the
        case's customer, or has not rated it."""
        async with self.sessions() as s, s.begin():
            stored = await s.scalar(
                update(m.Csat)
                .where(
                    m.Csat.escalation_id == comment.escalation_id,
                    m.Csat.customer == comment.user,
                    m.Csat.rating.is_not(None),
                )
                .values(comment=comment.text)
                .returning(m.Csat.id)
            )
        return stored is not None
