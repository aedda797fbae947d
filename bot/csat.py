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
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import Address
from agents.db import models as m
from agents.db.deliveries import CsatAsk, enqueue
from agents.language import Language
from agents.texts import Text, Texts
from bot.channels.capabilities import Channels
from escalation.views import Message

log = logging.getLogger(__name__)

ACTION_PREFIX = "csat_rate_"
"""The buttons' action ids: `csat_rate_1` to `csat_rate_5`; each button's value is the case's id."""
RATINGS = range(1, 6)
FACES = {1: "😞", 2: "🙁", 3: "😐", 4: "🙂", 5: "😄"}
"""The buttons are faces and numbers, words of no language."""
COMMENT_CALLBACK = "csat_comment"
"""The comment modal's callback_id; its private_metadata is the case's id."""
COMMENT_BLOCK, COMMENT_INPUT = "csat_comment", "comment"
COMMENT_MAX = 2000
"""Characters a comment may have (the input refuses more; a longer one is cut, should it arrive)."""


@dataclass(frozen=True)
class CsatPolicy:
    enabled: bool = True
    sample_rate: float = 1.0
    """The share of resolved cases whose customer is asked (0 to 1)."""
    cooldown: timedelta = timedelta(days=7)
    """No customer is asked twice within this."""
    texts: Texts = field(default_factory=Texts)
    """The question, the thanks (said when the comment form cannot be shown) and the form's words, in the
    conversation's language."""


@dataclass(frozen=True)
class Rated:
    """A rating stored: the customer's language, for what thanks them."""

    language: Language | None


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


def comment_modal(escalation_id: int, texts: Texts, language: Language | None) -> dict[str, Any]:
    """The modal that thanks the customer for their rating and asks for an optional comment, in their language."""

    def said(key: Text) -> dict[str, str]:
        return {"type": "plain_text", "text": texts.get(key, language)}

    return {
        "type": "modal",
        "callback_id": COMMENT_CALLBACK,
        "private_metadata": str(escalation_id),
        "title": said(Text.CSAT_COMMENT_TITLE),
        "submit": said(Text.CSAT_COMMENT_SEND),
        "close": said(Text.CSAT_COMMENT_SKIP),
        "blocks": [
            {
                "type": "input",
                "block_id": COMMENT_BLOCK,
                "optional": True,
                "label": said(Text.CSAT_COMMENT_LABEL),
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
            question = policy.texts.get(Text.CSAT_QUESTION, Language.parse(conversation.language))
            await enqueue(s, [CsatAsk(conversation.id, case.id, address.channel, address.thread, question)])

    def _surveys(self, platform: str) -> bool:
        """Whether `platform` (a key's: the terminal chat's is none) is a channel that can ask."""
        return any(channel.platform == platform and channel.capabilities.surveys for channel in self.channels)

    async def rate(self, click: CsatClick) -> Rated | None:
        """Store the customer's rating (the last click kept); None when the clicker is not the case's customer."""
        spoken = select(m.Conversation.language).where(m.Conversation.id == m.Csat.conversation_id)
        async with self.sessions() as s, s.begin():
            rated = (
                await s.execute(
                    update(m.Csat)
                    .where(m.Csat.escalation_id == click.escalation_id, m.Csat.customer == click.user)
                    .values(rating=click.rating, rated_at=func.now())
                    .returning(m.Csat.id, spoken.scalar_subquery().label("language"))
                )
            ).first()
        return None if rated is None else Rated(Language.parse(rated.language))

    async def language(self, escalation_id: int) -> Language | None:
        """The language of the case's conversation, for what is said to whoever clicked its rating or sent its
        comment (a refusal, a failure); None when unknown or unreadable."""
        try:
            async with self.sessions() as s:
                spoken = await s.scalar(
                    select(m.Conversation.language)
                    .join(m.Csat, m.Csat.conversation_id == m.Conversation.id)
                    .where(m.Csat.escalation_id == escalation_id)
                )
        except Exception:  # the database that failed the rating: the refusal goes out in the default language
            log.warning("no language for case %s", escalation_id, exc_info=True)
            return None
        return Language.parse(spoken)

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
