"""What the playground's side panel shows: read-only queries over the audit trail, per conversation.

Nothing here writes; the panel polls it, so each call is a handful of indexed queries over the newest
conversations only.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import Address
from agents.db import models as m


@dataclass(frozen=True)
class HandoffView:
    from_agent: str
    to_agent: str
    reason: str | None
    at: str


@dataclass(frozen=True)
class ToolView:
    agent: str
    tool: str
    ok: bool
    duration_ms: float
    at: str


@dataclass(frozen=True)
class EscalationView:
    id: int
    status: str
    """open, claimed, resolved or handed_back."""
    reason: str
    trigger: str
    agent: str
    claimed_by: str | None
    closed_by: str | None
    case_channel: str | None
    case_ts: str | None
    at: str
    claimed_at: str
    closed_at: str
    """Empty until it happens."""


@dataclass(frozen=True)
class ConversationView:
    key: str
    channel: str | None
    thread_ts: str | None
    """The customer thread's root ts, which is how the page finds the conversation of an open thread."""
    mode: str
    active_agent: str
    messages: int
    llm_calls: int
    handoffs: list[HandoffView] = field(default_factory=list)
    tools: list[ToolView] = field(default_factory=list)
    escalations: list[EscalationView] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _iso(at: datetime | None) -> str:
    return at.isoformat() if at is not None else ""


async def recent_conversations(
    sessions: async_sessionmaker[AsyncSession], *, limit: int = 20
) -> list[ConversationView]:
    """The newest Slack conversations with their handoffs, tool calls and escalations, newest first."""
    async with sessions() as s:
        # One snapshot for the several reads: under the default READ COMMITTED a turn committing between them
        # showed a conversation still at triage with its sales answer's calls already counted.
        await s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        rows = (
            await s.scalars(
                select(m.Conversation)
                .where(m.Conversation.key.like(Address.like("slack")))
                .order_by(m.Conversation.id.desc())
                .limit(limit)
            )
        ).all()
        ids = [row.id for row in rows]
        if not ids:
            return []
        handoffs: dict[int, list[HandoffView]] = defaultdict(list)
        for h in await s.scalars(select(m.Handoff).where(m.Handoff.conversation_id.in_(ids)).order_by(m.Handoff.id)):
            handoffs[h.conversation_id].append(HandoffView(h.from_agent, h.to_agent, h.reason, _iso(h.created_at)))
        tools: dict[int, list[ToolView]] = defaultdict(list)
        for t in await s.scalars(select(m.ToolRun).where(m.ToolRun.conversation_id.in_(ids)).order_by(m.ToolRun.id)):
            tools[t.conversation_id].append(ToolView(t.agent, t.tool, t.ok, t.duration_ms, _iso(t.created_at)))
        escalations: dict[int, list[EscalationView]] = defaultdict(list)
        for e in await s.scalars(
            select(m.Escalation).where(m.Escalation.conversation_id.in_(ids)).order_by(m.Escalation.id)
        ):
            escalations[e.conversation_id].append(
                EscalationView(
                    id=e.id,
                    status=e.status,
                    reason=e.reason,
                    trigger=e.trigger,
                    agent=e.agent,
                    claimed_by=e.claimed_by,
                    closed_by=e.closed_by,
                    case_channel=e.case_channel,
                    case_ts=e.case_ts,
                    at=_iso(e.created_at),
                    claimed_at=_iso(e.claimed_at),
                    closed_at=_iso(e.closed_at),
                )
            )
        counted = await s.execute(
            select(m.Message.conversation_id, func.count())
            .where(m.Message.conversation_id.in_(ids), m.Message.role.in_(("user", "assistant")))
            .group_by(m.Message.conversation_id)
        )
        messages: dict[int, int] = {conversation: n for conversation, n in counted}
        counted = await s.execute(
            select(m.LLMCall.conversation_id, func.count())
            .where(m.LLMCall.conversation_id.in_(ids))
            .group_by(m.LLMCall.conversation_id)
        )
        calls: dict[int, int] = {conversation: n for conversation, n in counted if conversation is not None}
    views = []
    for row in rows:
        address = Address.parse(row.key)
        channel, thread_ts = (address.channel, address.thread) if address else (None, None)
        views.append(
            ConversationView(
                key=row.key,
                channel=channel,
                thread_ts=thread_ts,
                mode=row.mode,
                active_agent=row.active_agent,
                messages=messages.get(row.id, 0),
                llm_calls=calls.get(row.id, 0),
                handoffs=handoffs[row.id],
                tools=tools[row.id],
                escalations=escalations[row.id],
            )
        )
    return views
