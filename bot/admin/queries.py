"""Read-only answers for `/support`: what the database says about conversations, cases, usage and health."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Float, cast, extract, func, or_, select, true
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import InstrumentedAttribute

from agents.address import DM, Address
from agents.conversations import SET_ASIDE, ResultKind
from agents.db import models as m
from agents.db.deliveries import GIVEN_UP
from agents.identity import Author
from agents.limits import Scope
from agents.offline import OFFLINE
from bot.admin.parse import CaseRef, Listing, Ref, ThreadRef
from escalation.machine import OPEN_CASE, WITH_HUMANS, Mode

LIST_LIMIT = 15
RECENT = 5
"""Failures listed by `/support status` (all are counted)."""
TOOL_CALLS_SHOWN = 10
FAILURE_SHOWN = 80
"""Characters of a failed tool call's output that `/support tools` shows: enough to tell a timeout from a refusal,
too few to turn the admin view into a copy of what the operator's system answered."""


@dataclass(frozen=True)
class ConversationRow:
    id: int
    key: str
    mode: str
    agent: str
    messages: int
    updated_at: datetime


@dataclass(frozen=True)
class Line:
    role: str
    """user, assistant, staff or tool."""
    who: str | None
    """The agent (assistant, tool) or the Slack user (user, staff)."""
    text: str
    at: datetime


@dataclass(frozen=True)
class CaseRow:
    id: int
    conversation_key: str
    status: str
    reason: str
    trigger: str
    agent: str
    claimed_by: str | None
    case_channel: str | None
    case_ts: str | None
    created_at: datetime
    claimed_at: datetime | None
    first_response_at: datetime | None


@dataclass(frozen=True)
class ConversationDetail:
    row: ConversationRow
    created_at: datetime
    lines: tuple[Line, ...]
    handoffs: tuple[tuple[str, str, str | None, datetime], ...]
    cases: tuple[CaseRow, ...]
    tool_runs: int
    history_from: int | None
    feedback: tuple[FeedbackLine, ...] = ()
    csat: tuple[CsatLine, ...] = ()
    """Each case whose customer was asked, the latest first."""


@dataclass(frozen=True)
class Health:
    database_ms: float
    pending_messages: int
    oldest_pending_s: float | None
    unsent_outbox: int
    open_cases: int
    unclaimed_cases: int
    pauses: tuple[tuple[str, str], ...]
    """(label, who paused)"""
    llm_calls_15m: int
    llm_failures_15m: int
    offline_answers_15m: int
    """Answers of the offline stand-in: all of them offline, else one per provider failure it covered."""
    given_up: int
    """Slack calls given up for good."""
    recent_give_ups: tuple[tuple[str, str, str, datetime], ...]
    """(kind, conversation key, error, when), the latest first."""
    set_aside: int
    """Messages set aside after failing every way they can be handled."""
    recent_set_aside: tuple[tuple[int, str, int, datetime], ...]
    """(message id, conversation key, attempts, received), the latest first."""
    held_back: int
    """People over a rate limit now (told so, in a window that has not ended)."""


@dataclass(frozen=True)
class Tally:
    """👍 and 👎 of one agent's answers."""

    name: str
    good: int
    bad: int


@dataclass(frozen=True)
class Score:
    """CSAT ratings of one group (an agent, a trigger, a colleague)."""

    name: str
    rated: int
    mean: float


@dataclass(frozen=True)
class CsatLine:
    case: int
    customer: str
    rating: int | None
    """None while unanswered."""
    comment: str | None
    """The customer's own words (other people's text)."""


@dataclass(frozen=True)
class FeedbackLine:
    user: str
    rating: str
    agent: str | None
    at: datetime


@dataclass(frozen=True)
class Usage:
    days: int
    conversations: int
    """Conversations with at least one message in the period."""
    new_conversations: int
    customer_messages: int
    staff_messages: int
    handoffs: tuple[tuple[str, str, int], ...]
    escalations: int
    escalations_by_trigger: tuple[tuple[str, int], ...]
    median_to_claim_s: float | None
    median_to_first_reply_s: float | None
    llm_calls: int
    llm_failures: int
    offline_answers: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    """None when no provider answering in the period said how much its prompt cache served."""
    rate_limited: tuple[tuple[str, int], ...] = ()
    """Customer messages no agent answered, being over a rate limit, by limit."""
    feedback: tuple[Tally, ...] = ()
    """👍/👎 on answers rated in the period, by agent (the rating of each answer and person as it is now)."""
    csat_asked: int = 0
    csat_by_agent: tuple[Score, ...] = ()
    csat_by_trigger: tuple[Score, ...] = ()
    csat_by_staff: tuple[Score, ...] = ()
    """Ratings given in the period, by the agent that escalated, by escalation trigger, by who resolved."""
    csat_comments: tuple[CsatLine, ...] = ()
    """The latest comments of ratings given in the period."""

    @property
    def good(self) -> int:
        return sum(t.good for t in self.feedback)

    @property
    def bad(self) -> int:
        return sum(t.bad for t in self.feedback)

    @property
    def csat(self) -> Score | None:
        """Every rating of the period together."""
        rated = sum(c.rated for c in self.csat_by_agent)
        if not rated:
            return None
        return Score("all", rated, sum(c.mean * c.rated for c in self.csat_by_agent) / rated)


@dataclass(frozen=True)
class ToolTally:
    """One tool from one source over the period."""

    tool: str
    source: str
    """"python", "http", "mcp:<server>", or "unknown" for a name no tool had."""
    calls: int
    failures: int
    p50_ms: float
    p95_ms: float


@dataclass(frozen=True)
class ToolCallLine:
    """One call as the audit trail shows it: never the model's arguments (they may hold a customer's data, and what
    the model wrote proves nothing about who asked); who asked is the author the platform verified."""

    at: datetime
    tool: str
    source: str
    agent: str
    asker: Author | None
    """None when the message is gone or nobody was identified."""
    ok: bool
    duration_ms: float
    failure: str | None
    """The first `FAILURE_SHOWN` characters of a failed call's output; None when it succeeded."""
    cut: bool = False
    """The failure's output was longer than what is shown."""


@dataclass(frozen=True)
class ToolAudit:
    days: int
    tallies: tuple[ToolTally, ...]
    """Every tool and source called in the period, the most called first."""
    recent: tuple[ToolCallLine, ...]
    """The latest calls of the period, the latest first."""

    @property
    def calls(self) -> int:
        return sum(t.calls for t in self.tallies)

    @property
    def failures(self) -> int:
        return sum(t.failures for t in self.tallies)


def _conversation_rows(rows: Sequence[tuple[m.Conversation, int]]) -> list[ConversationRow]:
    return [ConversationRow(c.id, c.key, c.mode, c.active_agent, n, c.updated_at) for c, n in rows]


def _message_count() -> ColumnElement[int]:
    return (
        select(func.count()).where(m.Inbound.conversation_id == m.Conversation.id).correlate(m.Conversation)
    ).scalar_subquery()


class AdminQueries:
    def __init__(self, *, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def conversations(self, listing: Listing) -> tuple[int, list[ConversationRow]]:
        """(how many match, the most recently active of them)."""
        where = {
            "open": m.Conversation.mode != Mode.CLOSED,
            "human": m.Conversation.mode.in_(WITH_HUMANS),
            "recent": true(),
        }[listing]
        async with self.sessions() as s:
            total = await s.scalar(select(func.count()).select_from(m.Conversation).where(where)) or 0
            rows = await s.execute(
                select(m.Conversation, _message_count())
                .where(where)
                .order_by(m.Conversation.updated_at.desc())
                .limit(LIST_LIMIT)
            )
            return total, _conversation_rows(rows.all())

    async def find(self, s: AsyncSession, ref: Ref, *, team: str | None = None) -> m.Conversation | None:
        """The conversation a link or case number points at: a customer thread (or DM), or a case message.
        With the workspace's `team` the thread's key is looked up exactly (the unique index); without, or when
        the conversation came in through another workspace (an org-wide install), by pattern."""
        if isinstance(ref, CaseRef):
            escalation = await s.get(m.Escalation, ref.escalation_id)
            return None if escalation is None else await s.get(m.Conversation, escalation.conversation_id)
        assert isinstance(ref, ThreadRef)
        exact = [Address("slack", team, ref.channel, thread).key for thread in (ref.ts, None)] if team else []
        for where in (
            m.Conversation.key.in_(exact),
            or_(
                m.Conversation.key.like(Address.like("slack", channel=ref.channel, thread=ref.ts)),
                m.Conversation.key.like(Address.like("slack", channel=ref.channel, thread=DM)),
            ),
        ):
            conversation = await s.scalar(
                select(m.Conversation)
                .where(where)
                .order_by(m.Conversation.key.like("%:dm"))  # a thread before the channel's DM conversation
                .limit(1)
            )
            if conversation is not None:
                return conversation
        case_conversation = (
            select(m.Escalation.conversation_id)
            .where(m.Escalation.case_channel == ref.channel, m.Escalation.case_ts == ref.ts)
            .scalar_subquery()
        )
        return await s.scalar(select(m.Conversation).where(m.Conversation.id == case_conversation))

    async def detail(self, ref: Ref, *, team: str | None = None, lines: int = 10) -> ConversationDetail | None:
        async with self.sessions() as s:
            conversation = await self.find(s, ref, team=team)
            if conversation is None:
                return None
            count = await s.scalar(select(func.count()).where(m.Inbound.conversation_id == conversation.id)) or 0
            messages = (
                await s.scalars(
                    select(m.Message)
                    .where(m.Message.conversation_id == conversation.id)
                    .where(or_(m.Message.content.is_not(None), m.Message.tool_calls.is_not(None)))
                    .where(m.Message.role != "tool")
                    .order_by(m.Message.id.desc())
                    .limit(lines)
                )
            ).all()
            handoffs = await s.execute(
                select(m.Handoff.from_agent, m.Handoff.to_agent, m.Handoff.reason, m.Handoff.created_at)
                .where(m.Handoff.conversation_id == conversation.id)
                .order_by(m.Handoff.id.desc())
                .limit(10)
            )
            cases = await self._cases(s, m.Escalation.conversation_id == conversation.id, limit=3)
            tool_runs = await s.scalar(select(func.count()).where(m.ToolRun.conversation_id == conversation.id))
            feedback = await s.execute(
                select(m.AnswerFeedback.user_id, m.AnswerFeedback.rating, m.AnswerFeedback.agent)
                .add_columns(m.AnswerFeedback.updated_at)
                .where(m.AnswerFeedback.conversation_id == conversation.id)
                .order_by(m.AnswerFeedback.updated_at.desc())
                .limit(10)
            )
            csat = await s.execute(
                select(*CSAT_LINE).where(m.Csat.conversation_id == conversation.id).order_by(m.Csat.id.desc()).limit(3)
            )
            return ConversationDetail(
                row=_conversation_rows([(conversation, count)])[0],
                created_at=conversation.created_at,
                lines=tuple(_line(row) for row in reversed(messages)),
                handoffs=tuple(reversed(handoffs.all())),
                cases=tuple(cases),
                tool_runs=tool_runs or 0,
                history_from=conversation.history_from,
                feedback=tuple(FeedbackLine(*row) for row in feedback),
                csat=tuple(CsatLine(*row) for row in csat),
            )

    async def open_cases(self, *, limit: int = 25) -> tuple[int, list[CaseRow]]:
        """(how many are open, the oldest `limit` of them)."""
        async with self.sessions() as s:
            total = await s.scalar(select(func.count()).where(m.Escalation.status.in_(OPEN_CASE))) or 0
            return total, await self._cases(s, m.Escalation.status.in_(OPEN_CASE), limit=limit, oldest_first=True)

    async def _cases(self, s: AsyncSession, where: object, *, limit: int, oldest_first: bool = False) -> list[CaseRow]:
        order = m.Escalation.id.asc() if oldest_first else m.Escalation.id.desc()
        rows = await s.execute(
            select(m.Escalation, m.Conversation.key)
            .join(m.Conversation, m.Conversation.id == m.Escalation.conversation_id)
            .where(where)  # type: ignore[arg-type]
            .order_by(order)
            .limit(limit)
        )
        return [
            CaseRow(
                e.id,
                key,
                e.status,
                e.reason,
                e.trigger,
                e.agent,
                e.claimed_by,
                e.case_channel,
                e.case_ts,
                e.created_at,
                e.claimed_at,
                e.first_response_at,
            )
            for e, key in rows
        ]

    async def health(self) -> Health:
        started = time.perf_counter()
        async with self.sessions() as s:
            await s.scalar(select(1))
            database_ms = (time.perf_counter() - started) * 1000
            pending, oldest = (
                await s.execute(
                    select(func.count(), extract("epoch", func.now() - func.min(m.Inbound.received_at))).where(
                        m.Inbound.processed_at.is_(None)
                    )
                )
            ).one()
            unsent = await s.scalar(select(func.count()).where(m.Outbox.done_at.is_(None))) or 0
            open_cases, unclaimed = (
                await s.execute(
                    select(func.count(), func.count().filter(m.Escalation.claimed_by.is_(None))).where(
                        m.Escalation.status.in_(OPEN_CASE)
                    )
                )
            ).one()
            pauses = await s.execute(select(m.Pause.label, m.Pause.paused_by).order_by(m.Pause.created_at))
            calls, failures, offline = (
                await s.execute(select(*_llm_counts()).where(m.LLMCall.created_at > func.now() - timedelta(minutes=15)))
            ).one()
            given_up = await s.scalar(select(func.count()).select_from(m.Outbox).where(GIVEN_UP)) or 0
            recent_give_ups = await s.execute(
                select(m.Outbox.kind, func.coalesce(m.Conversation.key, ""), func.coalesce(m.Outbox.last_error, ""))
                .add_columns(m.Outbox.done_at)
                .outerjoin(m.Conversation, m.Conversation.id == m.Outbox.conversation_id)
                .where(GIVEN_UP)
                .order_by(m.Outbox.id.desc())
                .limit(RECENT)
            )
            set_aside = await s.scalar(select(func.count()).select_from(m.Inbound).where(SET_ASIDE)) or 0
            recent_set_aside = await s.execute(
                select(m.Inbound.id, m.Conversation.key, m.Inbound.attempts, m.Inbound.received_at)
                .join(m.Conversation, m.Conversation.id == m.Inbound.conversation_id)
                .where(SET_ASIDE)
                .order_by(m.Inbound.id.desc())
                .limit(RECENT)
            )
            held_back = await s.scalar(
                select(func.count()).where(m.RateCounter.scope == Scope.USER, m.RateCounter.told_until > func.now())
            )
        return Health(
            database_ms,
            pending,
            None if oldest is None else float(oldest),
            unsent,
            open_cases,
            unclaimed,
            tuple(pauses.all()),
            calls,
            failures,
            offline,
            given_up,
            tuple((r[0], r[1], r[2], r[3]) for r in recent_give_ups),
            set_aside,
            tuple((r[0], r[1], r[2], r[3]) for r in recent_set_aside),
            held_back or 0,
        )

    async def usage(self, days: int) -> Usage:
        since = func.now() - timedelta(days=days)
        async with self.sessions() as s:
            active = await s.scalar(
                select(func.count(func.distinct(m.Inbound.conversation_id))).where(m.Inbound.received_at > since)
            )
            new = await s.scalar(select(func.count()).where(m.Conversation.created_at > since))
            customer, staff = (
                await s.execute(
                    select(
                        func.count().filter(m.Inbound.kind == "customer"),
                        func.count().filter(m.Inbound.kind == "staff"),
                    ).where(m.Inbound.received_at > since)
                )
            ).one()
            limited_by = m.Inbound.outcome["limited_by"].astext
            limited = await s.execute(
                select(limited_by, func.count())
                .where(m.Inbound.received_at > since, m.Inbound.outcome["kind"].astext == ResultKind.LIMITED.value)
                .group_by(limited_by)
                .order_by(func.count().desc())
            )
            handoffs = await s.execute(
                select(m.Handoff.from_agent, m.Handoff.to_agent, func.count())
                .where(m.Handoff.created_at > since)
                .group_by(m.Handoff.from_agent, m.Handoff.to_agent)
                .order_by(func.count().desc(), m.Handoff.from_agent, m.Handoff.to_agent)
            )
            triggers = await s.execute(
                select(m.Escalation.trigger, func.count())
                .where(m.Escalation.created_at > since)
                .group_by(m.Escalation.trigger)
                .order_by(func.count().desc())
            )
            to_claim, to_reply = (
                await s.execute(
                    select(
                        _median_seconds(m.Escalation.claimed_at - m.Escalation.created_at),
                        _median_seconds(m.Escalation.first_response_at - m.Escalation.created_at),
                    ).where(m.Escalation.created_at > since)
                )
            ).one()
            llm = (
                await s.execute(
                    select(
                        *_llm_counts(),
                        func.coalesce(func.sum(m.LLMCall.prompt_tokens), 0),
                        func.coalesce(func.sum(m.LLMCall.completion_tokens), 0),
                        func.sum(m.LLMCall.cached_tokens),
                    ).where(m.LLMCall.created_at > since)
                )
            ).one()
            by_agent = func.coalesce(m.AnswerFeedback.agent, "?")
            feedback = await s.execute(
                select(
                    by_agent,
                    func.count().filter(m.AnswerFeedback.rating == "good"),
                    func.count().filter(m.AnswerFeedback.rating == "bad"),
                )
                .where(m.AnswerFeedback.updated_at > since)
                .group_by(by_agent)
                .order_by(by_agent)
            )
            asked = await s.scalar(select(func.count()).where(m.Csat.asked_at > since))
            scores = [await _scores(s, column, since) for column in (m.Csat.agent, m.Csat.trigger, m.Csat.resolved_by)]
            comments = await s.execute(
                select(*CSAT_LINE)
                .where(m.Csat.rated_at > since, m.Csat.comment.is_not(None))
                .order_by(m.Csat.rated_at.desc())
                .limit(CSAT_COMMENTS_SHOWN)
            )
        by_trigger = tuple(triggers.all())
        return Usage(
            days=days,
            conversations=active or 0,
            new_conversations=new or 0,
            customer_messages=customer,
            staff_messages=staff,
            handoffs=tuple(handoffs.all()),
            escalations=sum(n for _, n in by_trigger),
            escalations_by_trigger=by_trigger,
            median_to_claim_s=to_claim,
            median_to_first_reply_s=to_reply,
            llm_calls=llm[0],
            llm_failures=llm[1],
            offline_answers=llm[2],
            prompt_tokens=int(llm[3]),
            completion_tokens=int(llm[4]),
            cached_tokens=None if llm[5] is None else int(llm[5]),
            rate_limited=tuple(limited.all()),
            feedback=tuple(Tally(*row) for row in feedback),
            csat_asked=asked or 0,
            csat_by_agent=scores[0],
            csat_by_trigger=scores[1],
            csat_by_staff=scores[2],
            csat_comments=tuple(CsatLine(*row) for row in comments),
        )

    async def tool_calls(self, days: int) -> ToolAudit:
        """The tool calls of the last `days`: counted and timed by tool and source, and the latest few with who asked
        (the inbound message's verified author). The arguments column is never read."""
        since = func.now() - timedelta(days=days)
        run = m.ToolRun
        async with self.sessions() as s:
            tallies = await s.execute(
                select(
                    run.tool,
                    run.source,
                    func.count(),
                    func.count().filter(run.ok.is_(False)),
                    _percentile(0.5, run.duration_ms),
                    _percentile(0.95, run.duration_ms),
                )
                .where(run.created_at > since)
                .group_by(run.tool, run.source)
                .order_by(func.count().desc(), run.tool, run.source)
            )
            recent = await s.execute(
                select(run.created_at, run.tool, run.source, run.agent, m.Inbound.identity, m.Inbound.author)
                .add_columns(
                    run.ok,
                    run.duration_ms,
                    func.left(run.output, FAILURE_SHOWN),
                    func.length(run.output) > FAILURE_SHOWN,
                )
                .outerjoin(m.Inbound, m.Inbound.id == run.inbound_id)
                .where(run.created_at > since)
                .order_by(run.id.desc())
                .limit(TOOL_CALLS_SHOWN)
            )
            return ToolAudit(
                days=days,
                tallies=tuple(
                    ToolTally(t, src, n, failed, float(p50), float(p95)) for t, src, n, failed, p50, p95 in tallies
                ),
                recent=tuple(
                    ToolCallLine(
                        at=at,
                        tool=tool,
                        source=source,
                        agent=agent,
                        asker=_asker(identity, author),
                        ok=ok,
                        duration_ms=duration_ms,
                        failure=None if ok else output,
                        cut=not ok and bool(longer),
                    )
                    for at, tool, source, agent, identity, author, ok, duration_ms, output, longer in recent
                ),
            )


def _asker(identity: dict[str, Any] | None, author: str | None) -> Author | None:
    """The verified author stored with the message; a message stored before identities were, by its user id only."""
    found = Author.from_json(identity)
    if found is None and author:
        return Author(platform="", workspace=None, user=author)
    return found


def _percentile(fraction: float, column: InstrumentedAttribute[float]) -> ColumnElement[float]:
    return func.percentile_cont(fraction).within_group(column)


CSAT_LINE = (m.Csat.escalation_id, m.Csat.customer, m.Csat.rating, m.Csat.comment)
"""The columns of a `CsatLine`, in its order."""
CSAT_COMMENTS_SHOWN = 5


async def _scores(s: AsyncSession, column: InstrumentedAttribute[Any], since: ColumnElement[Any]) -> tuple[Score, ...]:
    """CSAT ratings given since `since`, grouped by `column`."""
    group = func.coalesce(column, "?")
    rows = await s.execute(
        select(group, func.count(), func.avg(m.Csat.rating))
        .where(m.Csat.rated_at > since)
        .group_by(group)
        .order_by(func.count().desc(), group)
    )
    return tuple(Score(name, n, float(mean)) for name, n, mean in rows)


def _llm_counts() -> tuple[ColumnElement[int], ColumnElement[int], ColumnElement[int]]:
    """(provider calls, failed provider calls, offline answers) over llm_calls rows."""
    provider = m.LLMCall.model != OFFLINE
    return (
        func.count().filter(provider),
        func.count().filter(provider, m.LLMCall.ok.is_(False)),
        func.count().filter(m.LLMCall.model == OFFLINE),
    )


def _median_seconds(interval: ColumnElement[Any]) -> ColumnElement[float]:
    seconds = cast(extract("epoch", interval), Float)
    return func.percentile_cont(0.5).within_group(seconds)


def _line(row: m.Message) -> Line:
    if row.role == "assistant" and not row.content and row.tool_calls:
        names = ", ".join(call["name"] for call in row.tool_calls)
        return Line("tool", row.agent, f"called {names}", row.created_at)
    who = row.agent if row.role == "assistant" else row.author
    return Line(row.role, who, row.content or "", row.created_at)
