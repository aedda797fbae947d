"""Durable conversations: every customer message is stored before anything else happens, then turns run one
at a time per conversation, in arrival order, across processes.

    submit()        stores the message (idempotent on external_id) and returns at once
    run_leased()    under the conversation's lease (agents.leases), runs its waiting messages in order: each in
                    one statement, committed by itself, that counts the attempt and reads what the turn needs, the
                    turn itself (LLM and tool calls) outside any transaction, then one short transaction that checks
                    the lease's fence and commits everything the turn produced (with the host's rows)
    process_next()  claims a lease, runs one message, releases it; handle(): submit, then process until this
                    message is done (what the CLI and tests call)

No transaction, row lock or pooled connection is held across a model call. A turn whose lease expired
meanwhile commits nothing (LeaseLost) and is run again by the next holder; a crash leaves the message
unprocessed, to be run again once the lease expires; after `max_attempts` failures the customer gets an apology
and a human instead of silence.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal, Protocol, runtime_checkable

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents import conversation_sql as sql
from agents import limits
from agents.agent import Roster
from agents.attachments import Attachment, AttachmentReader, FileRef, with_attachments
from agents.db import models as m
from agents.db.deliveries import Delivery, Source, rows_json
from agents.db.engine import database_unavailable
from agents.db.statements import Conn, Statement, alone, begun, engine_of
from agents.identity import Author
from agents.language import Language, heard
from agents.leases import Lease, LeaseLost, Leases, process_owner
from agents.limits import NO_LIMITS, Counts, Limit, Limits
from agents.logcontext import current_conversation, current_message
from agents.loop import (
    Escalate,
    EventSink,
    HandoffRecord,
    LLMCallRecord,
    LoopConfig,
    ToolRecord,
    TurnInput,
    TurnResult,
    run_turn,
)
from agents.messages import Message, message_from_json
from agents.model import Model
from agents.router import Router
from agents.summary import Summaries, Summarising
from agents.texts import Text

log = logging.getLogger(__name__)
UNCOUNTED_TIMES = 20
"""How many of a message's failures in the database go uncounted: a failure that only looks like the database's
(and never mends) still ends in the apology, after a longer while."""
UNCOUNTED_KEPT = 10_000
"""At most this many messages remembered as failed by the database (`Conversations._uncounted`)."""

InboundKind = Literal["customer", "staff", "colleague"]
"""Who wrote a stored message: the customer; a colleague in the case thread (relayed to the customer); or a colleague
in the customer's own thread (a Slack Connect channel), which takes the conversation over and is relayed nowhere."""

Route = Literal["bot", "reopen", "human"]
"""Who answers a customer's message: the active agent; the entry agent, from scratch (a closed conversation
reopened); or the humans who have the conversation (the message waits for them)."""


@dataclass(frozen=True)
class OpenCase:
    """The conversation's open case, as the turn's first statement read it."""

    id: int
    claimed_by: str | None
    answered: bool
    """A colleague has replied to the customer."""


@dataclass(frozen=True)
class CaseChange:
    """What a colleague's reply does to the open case, written with the message."""

    status: str
    claimed_by: str | None
    answered: bool


@dataclass(frozen=True)
class ColleagueStep:
    """What a colleague writing in the customer's own thread does: the new mode, and the open case's change, or
    the new case's state when `opens`."""

    mode: str
    change: CaseChange
    opens: bool


class Takeover(Protocol):
    """Human takeover as the engine sees it (escalation.machine implements it). It decides every change of a
    conversation's mode; the engine writes what it decides, with the turn, under the lease."""

    def route(self, mode: str) -> Route: ...

    def after_turn(self, *, escalated: bool) -> str:
        """The mode after a turn the bot ran (escalated: a case was opened)."""
        ...

    def staff_reply(self, mode: str, case: OpenCase | None, author: str | None) -> tuple[str, CaseChange] | None:
        """The mode and the case after a colleague's reply, or None when it is not relayed."""
        ...

    def colleague_wrote(self, mode: str, case: OpenCase | None, author: str | None) -> ColleagueStep:
        """A colleague wrote in the customer's own thread (not the case thread): the conversation is theirs."""
        ...


@dataclass(frozen=True)
class Submitted:
    conversation_id: int
    inbound_id: int
    duplicate: bool
    """True when this external_id was already stored: the caller must not act on it twice."""


class ResultKind(StrEnum):
    REPLY = "reply"
    """An agent answered."""
    ESCALATED = "escalated"
    """The turn ended with a human."""
    HUMAN = "human"
    """A human owns the conversation and the customer's message waits for them."""
    STAFF = "staff"
    """A human colleague's message for the customer."""
    TAKEN_OVER = "taken_over"
    """A colleague wrote in the customer's own thread: humans have the conversation, in a case opened for them
    (`escalation_reason` set) or claimed for them."""
    LIMITED = "limited"
    """Over a rate limit, no agent ran (`reply` is the notice, or None when the customer was told already)."""
    SET_ASIDE = "set_aside"
    """It failed `max_attempts` times and so did the apology: kept for the admins (`/support status`), and the
    conversation moved on."""


SET_ASIDE = text(f"inbound.outcome->>'kind' = '{ResultKind.SET_ASIDE}'")
"""Messages set aside, as the partial index `ix_inbound_set_aside` is written (so that counting them uses it)."""


@dataclass(frozen=True)
class MessageResult:
    """What became of one customer message; stored with it, so any process can read it back."""

    inbound_id: int
    conversation_id: int
    kind: ResultKind
    reply: str | None
    agent: str
    handoffs: tuple[HandoffRecord, ...] = ()
    escalation_reason: str | None = None
    escalation_id: int | None = None
    """The escalation this message opened or belongs to."""
    limited_by: Limit | None = None
    llm_calls: tuple[LLMCallRecord, ...] = field(default=(), compare=False)
    """The model calls its turn committed, for the host's running totals; not stored with the result (they are
    rows of `llm_calls`)."""
    tools: tuple[ToolRecord, ...] = field(default=(), compare=False)
    """The tool calls of the committed turn (metrics count them; the audit trail is `tool_runs`)."""
    sources: tuple[Source, ...] = field(default=(), compare=False)
    """What an agent's reply was grounded in (`TurnResult.sources`), for the host to cite with it; not stored with the
    result (the outbox keeps it with the answer's rows)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "reply": self.reply,
            "agent": self.agent,
            "handoffs": [[h.from_agent, h.to_agent, h.reason] for h in self.handoffs],
            "escalation_reason": self.escalation_reason,
            "escalation_id": self.escalation_id,
            "limited_by": self.limited_by,
        }

    @classmethod
    def from_json(cls, inbound_id: int, conversation_id: int, raw: dict[str, Any]) -> MessageResult:
        return cls(
            inbound_id,
            conversation_id,
            ResultKind(raw["kind"]),
            raw["reply"],
            raw["agent"],
            tuple(HandoffRecord(*h) for h in raw["handoffs"]),
            raw["escalation_reason"],
            raw.get("escalation_id"),
            Limit(raw["limited_by"]) if raw.get("limited_by") else None,
        )


@dataclass(frozen=True)
class ConversationState:
    id: int
    key: str
    mode: str
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
    files: tuple[FileRef, ...] = ()
    """The files it carried, for the host to relay."""
    language: Language | None = None
    """The conversation's language after this message (None: not known, the operator's default): what the host's
    own words to the customer are in."""


TurnHook = Callable[[Conn, TurnCommit], Awaitable[None]]
"""The host's part of a turn's commit: what it writes (an outbox), in the turn's own transaction."""


@runtime_checkable
class KnownOwed(Protocol):
    """A `TurnHook` that can also tell a turn's deliveries without reading anything: those are queued by the turn's
    commit statement itself, which then needs no transaction around it (no BEGIN and COMMIT round trips)."""

    async def __call__(self, conn: Conn, commit: TurnCommit) -> None: ...

    def owed(self, commit: TurnCommit) -> Sequence[Delivery] | None:
        """The deliveries `commit` owes; None when working them out takes a read in the transaction (`__call__`)."""
        ...


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
        takeover: Takeover,
        after_turn: TurnHook | None = None,
        leases: Leases | None = None,
        retry_base_s: float = 0.5,
        limits: Limits = NO_LIMITS,
        attachments: AttachmentReader | None = None,
        summarising: Summarising | None = None,
        on_summary: Callable[[LLMCallRecord], None] | None = None,
        router: Router | None = None,
    ) -> None:
        self.sessions = sessions
        self._engine = engine_of(sessions)
        self._alone = alone(self._engine)
        self._begun = begun(self._engine)
        """For the statements that are a transaction each: storing a message, a turn's start, a result read back."""
        self.router = router
        """Routes a message to another agent without a model call when it is sure (agents.router); None: never."""
        self.attachments = attachments
        """Reads the files customers attach, before their message's turn; None: the model is told only their names."""
        self.takeover = takeover
        self.leases = leases or Leases(sessions, owner=process_owner())
        self.roster = roster
        self.model = model
        self.config = config
        self.history_limit = history_limit
        """Rows loaded per turn; the token window trims further. Bounded so long threads stay cheap."""
        self.max_attempts = max_attempts
        self._uncounted: dict[int, int] = {}
        """Messages whose last attempt here the database failed (a commit cut off, a full disk): their next start in
        this process is not counted, since what failed was not them (a disk full for seconds handed customers
        whose answers were ready to a person), up to UNCOUNTED_TIMES times each. Another process counts it: this is
        a kindness, not a guarantee."""
        self.retry_base_s = retry_base_s
        """A conversation whose message failed is left alone this long, doubled per attempt (at most a minute): a
        poison message costs a handful of tries over seconds, not hundreds, and the others keep the workers."""
        self.after_turn = after_turn
        """Called inside each turn's transaction, so what the host writes (an outbox) commits with the turn."""
        self._known_owed = after_turn if isinstance(after_turn, KnownOwed) else None
        self.limits = limits
        self.summaries = None if summarising is None else Summaries(
            sessions=sessions, model=model, config=summarising, history_limit=history_limit, on_call=on_summary
        )  # fmt: skip
        """Folds older turns into the running summary after a turn's commit (agents.summary); None: never."""

    async def submit(
        self,
        key: str,
        text: str,
        *,
        author: Author | None = None,
        external_id: str | None = None,
        order_key: str | None = None,
    ) -> Submitted:
        params = self.store_params(key, text, author, external_id, order_key)
        async with self._alone() as conn:
            return await _submitted(conn, params)

    async def submit_in(
        self,
        s: AsyncSession,
        key: str,
        text: str,
        *,
        author: Author | None = None,
        external_id: str | None = None,
        order_key: str | None = None,
        kind: InboundKind = "customer",
        files: tuple[FileRef, ...] = (),
    ) -> Submitted:
        """Store a customer message inside the caller's transaction (so it can be one write with the caller's
        own rows). `order_key` orders messages of one conversation when arrival order may differ from the
        order they were written in (Slack's ts); messages without one run in arrival order."""
        params = self.store_params(key, text, author, external_id, order_key, kind, files=files)
        return await _submitted(await s.connection(), params)

    def store_params(
        self,
        key: str,
        text: str,
        author: Author | None = None,
        external_id: str | None = None,
        order_key: str | None = None,
        kind: InboundKind = "customer",
        files: tuple[FileRef, ...] = (),
    ) -> dict[str, Any]:
        """The parameters of STORE_MESSAGE."""
        return {
            "files": json.dumps([f.to_json() for f in files]) if files else None,
            "key": key,
            "entry": self.roster.entry,
            "text": text,
            "author": author.user if author else None,
            "identity": json.dumps(author.to_json()) if author else None,
            "external_id": external_id,
            "order_key": order_key,
            "kind": kind,
        }

    async def handle(
        self,
        key: str,
        text: str,
        *,
        author: Author | None = None,
        external_id: str | None = None,
        on_event: EventSink | None = None,
    ) -> MessageResult:
        submitted = await self.submit(key, text, author=author, external_id=external_id)
        if submitted.duplicate and (done := await self.result_of(submitted.inbound_id)) is not None:
            return done
        while True:
            try:
                result = await self.process_next(submitted.conversation_id, on_event=on_event)
            except Exception:
                log.exception("turn failed; retrying")
                await asyncio.sleep(0.1)
                continue
            if result is not None and result.inbound_id == submitted.inbound_id:
                return result
            if result is None and (done := await self.result_of(submitted.inbound_id)) is not None:
                return done  # run by another process

    async def result_of(self, inbound_id: int) -> MessageResult | None:
        async with self._alone() as conn:
            row = (await _RESULT.run(conn, {"id": inbound_id})).first()
        if row is None or row.outcome is None:
            return None
        return MessageResult.from_json(inbound_id, row.conversation_id, row.outcome)

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
            return ConversationState(row.id, row.key, row.mode, row.active_agent, dict(row.context))

    async def process_next(
        self, conversation_id: int | None = None, *, on_event: EventSink | None = None, wait_s: float = 300.0
    ) -> MessageResult | None:
        """Run the oldest waiting message of one conversation (waiting up to `wait_s` while another holder has
        its lease), or, with no id, of any conversation with waiting messages that nobody runs. None when there
        was nothing to do."""
        started: _Started | None = None
        if conversation_id is None:
            claimed = await self.leases.claim_pending(1)
            if claimed:
                started = await self._start(claimed[0].conversation_id, claimed[0])
        else:
            deadline = asyncio.get_running_loop().time() + wait_s
            # The claim is part of the turn's first statement; while someone else holds the lease, wait.
            while (started := await self._start(conversation_id, None)) is None:
                if asyncio.get_running_loop().time() > deadline:
                    return None
                await asyncio.sleep(0.05)
        if started is None:
            return None
        if started.inbound is None:
            await self.leases.release(started.lease)
            return None
        try:
            with self.leases.kept(started.lease, asyncio.Event()):
                done = await self._run(started, keep=False, on_event=on_event)
        except BaseException:
            assert started.inbound is not None
            await self.leases.release(started.lease, retry_after_s=self._retry_delay_s(started.inbound.attempts) / 5)
            raise
        return done.result

    async def run_leased(self, lease: Lease, *, on_event: EventSink | None = None) -> list[MessageResult]:
        """Every waiting message of the leased conversation, in order, renewing the lease meanwhile; the last
        commit releases it (after a failure, it is kept from everyone for a second, so a failing message is not
        retried in a tight loop). Raises LeaseLost when the lease was taken: what was committed before stays."""
        lost = asyncio.Event()
        results: list[MessageResult] = []
        started: _Started | None = None
        try:
            with self.leases.kept(lease, lost):
                while True:
                    started = await self._start(lease.conversation_id, lease)
                    if started is None:
                        raise LeaseLost(f"conversation {lease.conversation_id}")
                    if started.inbound is None:  # nothing (more) to do
                        await self.leases.release(lease)
                        return results
                    done = await self._run(started, keep=True, on_event=on_event)
                    results.append(done.result)
                    if not done.kept:
                        return results  # released by the commit: nothing else was waiting
                    if lost.is_set():
                        raise LeaseLost(f"conversation {lease.conversation_id}")
        except LeaseLost:
            raise
        except BaseException:
            attempts = started.inbound.attempts if started is not None and started.inbound is not None else 1
            await self.leases.release(lease, retry_after_s=self._retry_delay_s(attempts))
            raise

    async def run_one(self, lease: Lease, *, on_event: EventSink | None = None) -> MessageResult | None:
        """The oldest waiting message under `lease` (held and renewed by the caller), or None when none waits.
        Raises LeaseLost when the lease is gone."""
        started = await self._start(lease.conversation_id, lease)
        if started is None:
            raise LeaseLost(f"conversation {lease.conversation_id}")
        if started.inbound is None:
            return None
        return (await self._run(started, keep=True, on_event=on_event)).result

    async def _read_files(self, started: _Started) -> _Started:
        """The customer's files read, outside any transaction (a download is a network call like the model's)."""
        inbound = started.inbound
        if inbound is None or not inbound.files or inbound.kind != "customer":
            return started
        if self.attachments is None:
            read = tuple(Attachment(f.name, f.mime, problem="files are not read here") for f in inbound.files)
        else:
            read = await self.attachments.read(inbound.files)
        return replace(started, inbound=replace(inbound, attachments=read))

    def _retry_delay_s(self, attempts: int) -> float:
        return min(self.retry_base_s * 2.0**attempts, 60.0)

    # ------------------------------------------------------------------------------------------------ one turn
    # Two statements carry a turn: `_start` (claim or fence the lease, count the attempt, read what the turn
    # needs) and `_finish` (fence, write everything the turn produced, release the lease), each committed on
    # its own; the host's after_turn hook adds its rows to the second transaction.

    async def _start(self, conversation_id: int, lease: Lease | None) -> _Started | None:
        """The turn's first statement, committed before anything that can fail, so a message that keeps
        failing, even by killing the process, gets the apology and a human after `max_attempts`. With no
        `lease`, it also claims one. None: the lease is someone else's."""
        params = {
            "id": conversation_id,
            "owner": self.leases.owner,
            "token": lease.token if lease else 0,
            "ttl": self.leases.ttl_s,
            "history": self.history_limit,
            "uncounted": sorted(i for i, times in self._uncounted.items() if times <= UNCOUNTED_TIMES),
        }
        async with self._alone() as conn:
            row = (await (sql.START_CLAIMING if lease is None else sql.START).run(conn, params)).first()
        if row is None:
            return None
        held = Lease(conversation_id, row.lease_token, self.leases.owner)
        current_conversation.set(row.key)
        current_message.set(row.inbound_id)
        inbound = None
        if row.inbound_id is not None:
            asker = Author.from_json(row.identity)
            files = tuple(FileRef.from_json(f) for f in row.files or ())
            inbound = _Inbound(
                row.inbound_id, row.kind, row.text, row.author, row.external_id, row.attempts, asker, row.deleted, files
            )
        case = OpenCase(row.case_id, row.claimed_by, row.answered) if row.case_id is not None else None
        # A message past its attempts is given up without a turn: what failed may be its history itself.
        giving_up = inbound is not None and inbound.attempts > self.max_attempts
        history = () if giving_up else tuple(message_from_json(h) for h in row.history or ())
        counts = Counts(row.user_minute, row.channel_minute, row.user_day_tokens, row.told)
        return _Started(
            held, row.key, row.mode, row.active_agent, row.context, inbound, row.paused, case, history, counts,
            row.summary, _language(inbound, Language.parse(row.language)),
        )  # fmt: skip

    async def _run(self, started: _Started, *, keep: bool, on_event: EventSink | None) -> _Done:
        try:
            done = await self._run_planned(started, keep=keep, on_event=on_event)
        except Exception as exc:
            if started.inbound is not None and database_unavailable(exc):
                if len(self._uncounted) > UNCOUNTED_KEPT:  # those another process took stay: bounded
                    self._uncounted.clear()
                self._uncounted[started.inbound.id] = self._uncounted.get(started.inbound.id, 0) + 1
            raise
        if started.inbound is not None:
            self._uncounted.pop(started.inbound.id, None)
        return done

    async def _run_planned(self, started: _Started, *, keep: bool, on_event: EventSink | None) -> _Done:
        planned = self._plan(started)
        if isinstance(planned, TurnInput):
            # Files are read only for a message that gets a turn: reading costs a download and a reader process,
            # which a message over a limit, paused or for a person must not spend. The plan is made again with
            # them (`_plan` is pure: the same facts give the same turn).
            started = await self._read_files(started)
            planned = self._plan(started)
        if isinstance(planned, _Commit):
            if planned.told is not None and not await self._tell_once(started, planned.told):
                planned = self._limited(started, planned.told, tell=False)
            return await self._finish(started, planned, keep=keep)
        assert started.inbound is not None
        try:
            turn = await run_turn(
                planned,
                roster=self.roster,
                model=self.model,
                config=self.config,
                db=self.sessions,
                on_event=on_event,
                router=self.router,
            )
        except Exception as exc:
            if started.inbound.attempts < self.max_attempts or database_unavailable(exc):
                raise
            log.exception("turn failed %d times; apologising", started.inbound.attempts)
            reason = Escalate("the bot failed repeatedly on this message", "error")
            apology = self.config.texts.get(Text.PROVIDER_FAILURE_MESSAGE, started.language)
            failed = self._to_human(started, planned.agent, dict(planned.context), reason, apology)
            return await self._finish(started, failed, keep=keep)
        committed = self._turn_commit(started, turn)
        done = await self._finish(started, committed, keep=keep)
        if self.summaries is not None and self.summaries.config.due((*started.history, *committed.messages)):
            self.summaries.start(started.lease.conversation_id, started.inbound.id)
        return done

    def _plan(self, started: _Started) -> _Commit | TurnInput:
        """What becomes of the message: a commit decided without a turn (staff, human, paused, given up, set
        aside, over a rate limit), or the turn's input."""
        inbound = started.inbound
        assert inbound is not None
        route = self.takeover.route(started.mode)
        # A customer's message for the bot gets one more attempt, the apology; any other has no such fallback.
        apologises = inbound.kind == "customer" and route != "human"
        if inbound.attempts > self.max_attempts + apologises:
            return self._set_aside(started, inbound)
        if inbound.kind == "staff":
            return self._staff_message(started, inbound)
        if inbound.kind == "colleague":
            return self._colleague_message(started, inbound)
        user = inbound.message()
        if route == "human":
            case_id = started.case.id if started.case else None
            result = MessageResult(inbound.id, 0, ResultKind.HUMAN, None, started.agent, escalation_id=case_id)
            return _Commit(result, started.mode, started.agent, started.context, (user,))
        agent, context = (self.roster.entry, {}) if route == "reopen" else (started.agent, dict(started.context))
        if inbound.attempts > self.max_attempts:
            reason = Escalate("the bot failed repeatedly on this message", "error")
            return self._to_human(started, agent, context, reason, self._told(Text.PROVIDER_FAILURE_MESSAGE, started))
        if started.paused:
            reason = Escalate("the bot is paused here by an admin", "paused")
            return self._to_human(started, agent, context, reason, self._told(Text.PAUSED_MESSAGE, started))
        if (limit := self.limits.exceeded(started.counts)) is not None:
            return self._limited(started, limit, tell=not started.counts.told)
        history = (*started.history, user)
        return TurnInput(
            started.lease.conversation_id, inbound.id, agent, context, history, inbound.asker, started.summary,
            started.language,
        )  # fmt: skip

    def _told(self, key: Text, started: _Started) -> str:
        return self.config.texts.get(key, started.language)

    def _set_aside(self, started: _Started, inbound: _Inbound) -> _Commit:
        """A message that failed every way it can be handled: marked done as set aside, with nothing else written
        (no transcript line, no host rows, since what failed may be any of them), so the conversation moves on.
        The admins see it in /support status and /metrics."""
        log.error("message %s failed %d times; set aside", inbound.id, inbound.attempts)
        result = MessageResult(inbound.id, 0, ResultKind.SET_ASIDE, None, started.agent)
        return _Commit(result, started.mode, started.agent, started.context, ())

    def _turn_commit(self, started: _Started, turn: TurnResult) -> _Commit:
        assert started.inbound is not None
        escalation = turn.outcome if isinstance(turn.outcome, Escalate) else None
        result = MessageResult(
            started.inbound.id,
            0,
            ResultKind.ESCALATED if escalation else ResultKind.REPLY,
            turn.reply,
            turn.agent,
            turn.handoffs,
            escalation.reason if escalation else None,
            llm_calls=turn.llm_calls,
            tools=turn.tools,
            sources=turn.sources,
        )
        user = started.inbound.message()
        mode = self.takeover.after_turn(escalated=escalation is not None)
        return _Commit(result, mode, turn.agent, turn.context, (user, *turn.messages), turn, escalation)

    def _to_human(self, started: _Started, agent: str, context: dict[str, Any], reason: Escalate, text: str) -> _Commit:
        """End the turn without an agent: the customer is told `text` and a human gets the case."""
        inbound = started.inbound
        assert inbound is not None
        user = inbound.message()
        notice = Message("assistant", text, agent=agent)
        result = MessageResult(inbound.id, 0, ResultKind.ESCALATED, text, agent, (), reason.reason)
        mode = self.takeover.after_turn(escalated=True)
        return _Commit(result, mode, agent, context, (user, notice), escalate=reason)

    def _limited(self, started: _Started, limit: Limit, *, tell: bool) -> _Commit:
        """No turn: the message joins the transcript (the agents read it with the next one they answer), and the
        customer is told if `tell` (once per window of the limit: a flood gets one notice)."""
        inbound = started.inbound
        assert inbound is not None
        user = inbound.message()
        notice = self.config.texts.limited(limit.window, started.language) if tell else None
        said = (Message("assistant", notice, agent=started.agent),) if notice else ()
        result = MessageResult(inbound.id, 0, ResultKind.LIMITED, notice, started.agent, limited_by=limit)
        told = limit if tell else None
        return _Commit(result, started.mode, started.agent, started.context, (user, *said), told=told)

    async def _tell_once(self, started: _Started, limit: Limit) -> bool:
        """Whether this message is the one to tell its author of `limit`: of several conversations of one person
        limited at once, only the first to get here is (a short statement, only when a notice is due)."""
        lease, inbound = started.lease, started.inbound
        assert inbound is not None
        params = {"id": lease.conversation_id, "token": lease.token, "owner": lease.owner}
        async with self._alone() as conn:
            row = await limits.TELL.run(conn, params | {"author": inbound.author, "limit": limit})
            return row.first() is not None

    def _staff_message(self, started: _Started, inbound: _Inbound) -> _Commit:
        """A colleague's reply: kept in the transcript (so agents know what was said after a hand back) and
        relayed, as human takeover decides (it may claim the case for its author)."""
        step = None if inbound.deleted else self.takeover.staff_reply(started.mode, started.case, inbound.author)
        if step is None or started.case is None:  # deleted, handed back or closed meanwhile: nothing to relay
            result = MessageResult(inbound.id, 0, ResultKind.HUMAN, None, started.agent)
            return _Commit(result, started.mode, started.agent, started.context, ())
        mode, change = step
        result = MessageResult(
            inbound.id, 0, ResultKind.STAFF, inbound.text, started.agent, escalation_id=started.case.id
        )
        staff = Message("staff", inbound.text, author=inbound.author)
        return _Commit(result, mode, started.agent, started.context, (staff,), case_change=change)

    def _colleague_message(self, started: _Started, inbound: _Inbound) -> _Commit:
        """A colleague wrote in the customer's own thread: the bot stops answering there, and the case is theirs
        (opened for them when there is none). Their words join the transcript as staff's; the customer saw them
        in the thread already, so nothing is relayed."""
        step = self.takeover.colleague_wrote(started.mode, started.case, inbound.author)
        reason = Escalate("a colleague answered in the customer's thread", "colleague") if step.opens else None
        case_id = None if started.case is None else started.case.id
        result = MessageResult(
            inbound.id, 0, ResultKind.TAKEN_OVER, None, started.agent,
            escalation_reason=reason.reason if reason else None, escalation_id=case_id,
        )  # fmt: skip
        # The case is the customer's, not the colleague's who opened it: the last customer who wrote here.
        customer = next((h.author for h in reversed(started.history) if h.role == "user" and h.author), None)
        name = inbound.asker.name if inbound.asker else None
        staff = Message("staff", inbound.text, author=inbound.author, author_name=name)
        return _Commit(
            result, step.mode, started.agent, started.context, (staff,),
            escalate=reason, case_change=step.change, customer=customer,
        )  # fmt: skip

    async def _finish(self, started: _Started, commit: _Commit, *, keep: bool) -> _Done:
        """The turn's one commit, fenced: nothing is written unless the lease still holds. The lease is
        released with it, unless `keep` and another message waits."""
        inbound = started.inbound
        assert inbound is not None
        lease = started.lease
        turn = commit.turn
        escalate = commit.escalate
        change = commit.case_change
        result = replace(commit.result, conversation_id=lease.conversation_id)
        params = {
            "id": lease.conversation_id,
            "token": lease.token,
            "owner": lease.owner,
            "ttl": self.leases.ttl_s,
            "keep": keep,
            "inbound_id": inbound.id,
            "mode": str(commit.mode),
            "agent": commit.agent,
            "context": json.dumps(commit.context),
            "outcome": json.dumps(result.to_json()),
            "messages": json.dumps([_message_json(msg) for msg in commit.messages]),
            "handoffs": json.dumps(_handoffs_json(turn)),
            "tools": json.dumps(_tools_json(turn)),
            "llm_calls": json.dumps(_llm_calls_json(turn)),
            "escalate": escalate is not None,
            "reason": escalate.reason if escalate else None,
            "trigger": escalate.trigger if escalate else None,
            "customer": commit.customer or inbound.author,
            "case_id": started.case.id if change and started.case else None,
            "case_status": str(change.status) if change else None,
            "claimed_by": change.claimed_by if change else None,
            "key": started.key,
            "counters": json.dumps(self.limits.counters(turn)),
            "language": str(started.language) if started.language else None,
        }
        hook = self.after_turn if commit.messages else None

        def heard(result: MessageResult) -> TurnCommit:
            return TurnCommit(
                started.key,
                lease.conversation_id,
                inbound.external_id,
                inbound.author,
                inbound.text,
                result,
                inbound.files,
                started.language,
            )

        # The host's rows commit with the turn's. Known before the commit (no case to open, whose id they would
        # carry), they are queued by the turn's statement, a transaction by itself; otherwise the host writes them
        # in a transaction around it.
        owed = None
        if hook is not None and self._known_owed is not None and escalate is None:
            owed = self._known_owed.owed(heard(result))
        params["outbox"] = "[]" if owed is None else rows_json(owed)
        one_statement = hook is None or owed is not None
        async with self._alone() if one_statement else self._begun() as conn:
            row = (await sql.FINISH.run(conn, params)).first()
            if row is None:
                raise LeaseLost(f"conversation {lease.conversation_id}")
            if row.escalation_id is not None:
                result = replace(result, escalation_id=row.escalation_id)
            if not one_statement:
                assert hook is not None
                await hook(conn, heard(result))
        return _Done(result, kept=bool(row.kept))


_DUPLICATE = Statement("SELECT id FROM inbound WHERE conversation_id = :conversation_id AND external_id = :external_id")
_RESULT = Statement("SELECT conversation_id, outcome FROM inbound WHERE id = :id")


async def _submitted(conn: Conn, params: dict[str, Any]) -> Submitted:
    """Store a message (`Conversations.store_params`), or find it stored already under its external_id."""
    row = (await sql.SUBMIT.run(conn, params)).one()
    if row.inbound_id is not None:
        return Submitted(row.conversation_id, row.inbound_id, duplicate=False)
    found = {"conversation_id": row.conversation_id, "external_id": params["external_id"]}
    existing = (await _DUPLICATE.run(conn, found)).scalar()
    assert existing is not None
    return Submitted(row.conversation_id, existing, duplicate=True)


# ---------------------------------------------------------------------------------------------------- values


NOT_READ = "not read, as the assistant did not answer this message"
"""Why a file of a message that got no turn (over a limit, paused, with a person) was not read."""


@dataclass(frozen=True)
class _Inbound:
    id: int
    kind: str
    text: str
    author: str | None
    external_id: str | None
    attempts: int
    asker: Author | None
    """Its author as the edge verified and stored it."""
    deleted: bool = False
    """A colleague's message deleted (or edited into a note) before it was processed."""
    files: tuple[FileRef, ...] = ()
    attachments: tuple[Attachment, ...] = ()
    """Its files as read for this turn (`Conversations._read_files`)."""

    def message(self) -> Message:
        """The customer's message in the transcript: its text and what its files say; images for this turn only.
        Files not read (the message got no turn) are named as such, so that the agents know they were sent."""
        attachments = self.attachments or tuple(Attachment(f.name, f.mime, problem=NOT_READ) for f in self.files)
        images = tuple(a.image for a in attachments if a.image is not None)
        name = self.asker.name if self.asker else None
        content = with_attachments(self.text, attachments)
        return Message("user", content, author=self.author, author_name=name, images=images)


@dataclass(frozen=True)
class _Started:
    """What the first statement read, under the lease it holds."""

    lease: Lease
    key: str
    mode: str
    agent: str
    context: dict[str, Any]
    inbound: _Inbound | None
    """The oldest waiting message (its attempt counted), or None when none waits."""
    paused: bool
    case: OpenCase | None
    history: tuple[Message, ...]
    """The messages after the summary."""
    counts: Counts
    summary: str | None = None
    language: Language | None = None
    """The conversation's language with this message (`_language`), written by the turn's commit."""


@dataclass(frozen=True)
class _Commit:
    """Everything one message comes to, written by `_finish` in one fenced statement."""

    result: MessageResult
    mode: str
    agent: str
    context: Mapping[str, Any]
    messages: tuple[Message, ...]
    turn: TurnResult | None = None
    """For the audit rows: handoffs, tool runs, model calls."""
    escalate: Escalate | None = None
    """Open a case."""
    case_change: CaseChange | None = None
    """Change the open case (a colleague's reply), or with `escalate` the state the new case opens in."""
    customer: str | None = None
    """Whose case `escalate` opens, when not the message's author (a colleague opening it)."""
    told: Limit | None = None
    """The customer is told they are over this limit."""


@dataclass(frozen=True)
class _Done:
    result: MessageResult
    kept: bool
    """The lease is still held: another message waits."""


def _language(inbound: _Inbound | None, stored: Language | None) -> Language | None:
    """The conversation's language once `inbound` is read: the customer's words where they tell it (`heard`: a
    short "thank you" keeps a Spanish conversation Spanish), else what was known, else the locale their platform
    gave. A colleague's words change nothing."""
    if inbound is None or inbound.kind != "customer":
        return stored
    locale = Language.parse(inbound.asker.locale) if inbound.asker is not None else None
    return heard(inbound.text, stored) or locale


def _message_json(msg: Message) -> dict[str, Any]:
    return {
        "role": msg.role,
        "agent": msg.agent,
        "author": msg.author,
        "author_name": msg.author_name,
        "content": msg.content,
        "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in msg.tool_calls] or None,
        "tool_call_id": msg.tool_call_id,
        "name": msg.name,
    }


def _handoffs_json(turn: TurnResult | None) -> list[dict[str, Any]]:
    handoffs = turn.handoffs if turn else ()
    return [{"from_agent": h.from_agent, "to_agent": h.to_agent, "reason": h.reason} for h in handoffs]


def _tools_json(turn: TurnResult | None) -> list[dict[str, Any]]:
    return [
        {
            "agent": t.agent,
            "call_id": t.call.id,
            "tool": t.call.name,
            "arguments": t.call.arguments,
            "ok": t.ok,
            "output": t.output,
            "duration_ms": t.duration_ms,
            "source": t.source,
        }
        for t in (turn.tools if turn else ())
    ]


def _llm_calls_json(turn: TurnResult | None) -> list[dict[str, Any]]:
    return [
        {
            "agent": c.agent,
            "model": c.model,
            "ok": c.ok,
            "error": c.error,
            "prompt_tokens": c.usage.prompt_tokens,
            "completion_tokens": c.usage.completion_tokens,
            "cached_tokens": c.usage.cached_tokens,
            "latency_ms": c.latency_ms,
        }
        for c in (turn.llm_calls if turn else ())
    ]
