"""Intake, written once for every channel: a delivery (Slack's event, Teams' activity) is stored, or recognised as
a duplicate, before the platform gets its answer, and a case button is acted on within its ack window; the work
happens afterwards in the workers.

A channel's edge only parses: it turns its payload into `bot.channels.incoming` values and hands them over with what
only it can do, behind two small protocols: `Writers` (who wrote a customer's message, from the platform's
directory) and `Presser` (how the colleague who pressed a case button is answered). What the platform can do
(reactions, typing) is asked of its `Channels` entry, never of its name."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.conversation_sql import STORE_MESSAGE
from agents.conversations import Conversations, InboundKind
from agents.db import models as m
from agents.db.deliveries import AddReaction, RelayDelete, RelayEdit, StaffNotice, Typing, enqueue
from agents.db.statements import Conn, Statement, alone, engine_of
from agents.identity import Author, vouched
from bot.channels.capabilities import Channels, ReplyStyle
from bot.channels.incoming import (
    ACK_WITHIN_S,
    CASE_ACTIONS,
    CaseAction,
    CustomerMessage,
    Delivery,
    Ignored,
    Incoming,
    StaffDelete,
    StaffEdit,
    StaffReply,
)
from bot.metrics import Metrics
from bot.staff import ACTION_REFUSED, REPLY_REFUSED, Colleagues, Member, StaffGate, Standing, refusal
from escalation.desk import Action, ActionResult, CaseDesk
from escalation.machine import OPEN_CASE
from escalation.policy import EscalationPolicy

log = logging.getLogger(__name__)

IDENTIFY_WITHIN_S = 1.0
"""How long the acknowledgement may wait for a profile not cached yet (Slack allows 3 s). Past it the message is
stored with what the delivery carried (the signed ids; Teams' activity also the name): its tools find no orders for
it, and the writer's next message tries again."""
STAFF_CHECK_S = 2.0
"""How long a staff reply's ack may wait for the platform to say who wrote it; longer, and the platform gets a 503
and retries."""
NO_STANDING = "Could not check whether you are on the support team just now; please try again."
CHANGE_FAILED = "That did not work (the conversation stayed busy); please try again."


@dataclass(frozen=True)
class Writer:
    """Who wrote a customer's message, as the platform's directory holds them."""

    author: Author
    """With the name and email the directory holds; the email is intake's to keep or drop (`vouched`)."""
    organisation: str | None
    """The organisation the platform vouches holds the account: the one whose word the email is."""
    ours: str
    """Our own organisation, as the channel names it where the message was written."""
    member: Member | None = None
    """Their guest and organisation flags, where the channel has them (Slack): what tells a colleague writing in a
    customer's thread from a customer. None: a customer."""


class Writers(Protocol):
    async def writer(self, message: CustomerMessage) -> Writer | None:
        """The message's writer as the platform's directory has them, or None when it does not know them. Raises
        when the directory cannot be asked: the message is then stored with what the delivery carried."""
        ...


class Presser(Protocol):
    """The colleague who pressed a case button, as their channel answers them."""

    async def answer(self, *, held: bool) -> None:
        """The platform's answer to the click, given once the change is made or ACK_WITHIN_S has passed; `held`: a
        running turn holds the change, which follows."""
        ...

    async def tell(self, words: str) -> None:
        """Words for the presser alone: why nothing changed."""
        ...


class Intake:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        conversations: Conversations,
        channels: Channels,
        style: ReplyStyle,
        escalation: EscalationPolicy,
        metrics: Metrics,
        on_stored: Callable[[], None],
        staff: StaffGate,
        desk: CaseDesk,
        colleagues: Colleagues | None = None,
        customer_organisations: frozenset[str] = frozenset(),
    ) -> None:
        self.sessions = sessions
        self._alone = alone(engine_of(sessions))
        self.conversations = conversations
        self.channels = channels
        self.style = style
        self.escalation = escalation
        self.metrics = metrics
        self.on_stored = on_stored
        self.staff = staff
        self.desk = desk
        self.colleagues = colleagues or Colleagues()
        self.customer_organisations = customer_organisations
        """CUSTOMER_ORGANISATIONS: besides our own, the organisations whose emails tools trust (every channel)."""

    async def accept(
        self,
        delivery: Delivery,
        message: Incoming,
        *,
        writers: Writers,
        ours: str | None,
        continues_only: bool = False,
    ) -> str:
        """Store what an edge made of one delivery, in one transaction; returns its disposition. Raises if the
        database cannot take it (or a staff writer's standing cannot be checked in time), so the edge answers with
        an error and the platform retries.

        `writers`: the channel's directory of who wrote a customer's message. `ours`: our organisation as the
        delivery names it (Slack's workspace, Teams' tenant), whose members may speak for us in a case thread.
        `continues_only`: store a customer's message only in a conversation that exists (a Teams reply that does not
        mention the bot, in a chain the bot was never asked into)."""
        author = standing = None
        if isinstance(message, CustomerMessage):
            # Who wrote it is stored with it (tools act for that person), looked up before a connection is taken.
            author, colleague = await self._identify(message, writers)
            if colleague:  # not a customer: takes over a conversation that exists, and starts none
                return await self._take(delivery, message, author=author, continues_only=True, colleague=True)
        elif isinstance(message, StaffReply):  # asked before the transaction: no connection waits for the platform
            async with asyncio.timeout(STAFF_CHECK_S):
                standing = await self.staff.standing(message.user, team=ours, user_team=message.user_team)
        return await self._take(delivery, message, author=author, standing=standing, continues_only=continues_only)

    async def act(self, action: CaseAction, *, ours: str | None, presser: Presser) -> None:
        """Claim, resolve or hand back a case for the colleague who pressed its button (`ours`: our organisation,
        as for `accept`). Usually the change is made before the platform's answer, which then shows the button as
        handled. It waits for a running turn of the conversation (its lease), which may take longer than the ack
        window: then the answer goes first, and the case message is updated through the outbox once it is made."""
        kind = CASE_ACTIONS.get(action.action_id)
        if kind is None:
            await presser.answer(held=False)
            return
        change = asyncio.create_task(self._change(action, kind, ours=ours))
        done, _ = await asyncio.wait({change}, timeout=ACK_WITHIN_S)
        await presser.answer(held=not done)
        try:
            result = await change
        except Exception:
            log.exception("case action failed")
            result = ActionResult(False, CHANGE_FAILED)
        if not result.ok:
            await presser.tell(result.message)

    async def _change(self, action: CaseAction, kind: Action, *, ours: str | None) -> ActionResult:
        try:
            standing = await self.staff.standing(action.user, team=ours, user_team=action.user_team)
        except Exception:
            log.warning("could not check whether %s is staff", action.user, exc_info=True)
            return ActionResult(False, NO_STANDING)
        if standing != Standing.STAFF:
            log.warning("case action %s by %s refused: %s", action.action_id, action.user, standing)
            return ActionResult(False, refusal(standing, doing=ACTION_REFUSED))
        return await self.desk.act(
            escalation_id=action.escalation_id, action=kind, user=action.user, channel=action.channel
        )

    async def _take(
        self,
        delivery: Delivery,
        message: Incoming,
        *,
        author: Author | None = None,
        standing: Standing | None = None,
        continues_only: bool = False,
        colleague: bool = False,
    ) -> str:
        """`author`: the customer as identified; `standing`: a colleague's, as checked. `colleague`: the customer
        message's writer is staff (`bot.staff.Colleagues`), whose message takes the conversation over."""
        if isinstance(message, CustomerMessage):
            # The hot path (every customer message): one statement, committed by itself: an ack is one round trip.
            async with self._alone() as conn:
                disposition = await self._store_customer(
                    conn,
                    delivery,
                    message,
                    author or message.author,
                    continues_only=continues_only,
                    colleague=colleague,
                )
        else:
            async with self.sessions() as s, s.begin():
                disposition = await self._store_other(s, delivery, message, standing or Standing.STAFF)
        self.metrics.events.labels(disposition.split(":")[0]).inc()
        if disposition == "stored":
            self.on_stored()
        return disposition

    async def _identify(self, message: CustomerMessage, writers: Writers) -> tuple[Author, bool]:
        """The writer as their platform's directory has them, and whether they are a colleague rather than a
        customer; a writer who cannot be looked up in time is a customer, known by what the delivery carried.

        Their email is kept only when the organisation the platform vouches holds the account is ours or a listed
        customer organisation: another organisation's admins write their people's profiles as they like."""
        try:
            async with asyncio.timeout(IDENTIFY_WITHIN_S):
                writer = await writers.writer(message)
        except Exception as exc:  # a slow or failing directory never costs a customer's message
            reason = f"not within {IDENTIFY_WITHIN_S:g} s" if isinstance(exc, TimeoutError) else repr(exc)
            log.warning("no profile for %s (%s): stored with what the delivery carried", message.user, reason)
            return message.author, False
        if writer is None:
            return message.author, False
        customers = self.customer_organisations
        author = vouched(writer.author, organisation=writer.organisation, ours=writer.ours, customers=customers)
        # A direct message is someone asking the bot, a colleague included: never a takeover.
        if message.is_dm or not self.colleagues.worth_asking(shared=message.shared):
            return author, False
        return author, self.colleagues.includes(author, writer.member, team=writer.ours, shared=message.shared)

    async def _store_customer(
        self,
        conn: Conn,
        delivery: Delivery,
        message: CustomerMessage,
        author: Author,
        *,
        continues_only: bool,
        colleague: bool,
    ) -> str:
        # The "being handled" signal, queued with the message: the working reaction on it where the channel has
        # reactions, else its typing indicator; a colleague's message is not the bot's to handle.
        can = self.channels.of(message.platform).capabilities
        reaction = None if colleague or not can.reactions else self.style.working_reaction or None
        signal = AddReaction.kind if reaction else Typing.kind if can.typing and not colleague else None
        kind: InboundKind = "colleague" if colleague else "customer"
        params = self.conversations.store_params(
            message.conversation_key, message.text, author, message.ts, message.ts, kind, files=message.files
        ) | {
            "event_id": delivery.event_id,
            "team_id": delivery.team_id,
            "event_type": delivery.event_type,
            "reaction": reaction,
            "working_kind": signal,
            "channel": message.channel,
            "ts": message.ts if reaction else None,
            "thread": message.address.thread if signal == Typing.kind else None,
            "continues_only": continues_only,
        }
        row = (await _STORE_CUSTOMER.run(conn, params)).one()
        if not row.fresh:
            return "duplicate"
        if row.inbound_id is None:
            # The same message again (an app_mention's twin message event, a redelivery under a new event_id), or
            # a reply in a conversation that does not exist. The label is written after the event's row (its own
            # commit): a crash between leaves the row saying "stored", which only an operator reads.
            disposition = "ignored: not a conversation" if continues_only else "duplicate"
            await _DISPOSITION.run(conn, {"event_id": delivery.event_id, "disposition": disposition})
            return disposition
        return "stored"

    async def _store_other(self, s: AsyncSession, delivery: Delivery, message: Incoming, standing: Standing) -> str:
        if not await _first(s, delivery):
            return "duplicate"
        disposition = await self._store(s, message, standing)
        await s.execute(
            update(m.Received).where(m.Received.event_id == delivery.event_id).values(disposition=disposition)
        )
        return disposition

    async def first_request(self, request: Delivery) -> bool:
        """Record a request acted on once (a slash command, a click, an admin message); False when it was seen
        before."""
        async with self.sessions() as s, s.begin():
            return await _first(s, request)

    async def prune(self, *, keep_hours: float = 72) -> int:
        """Forget delivery and request ids older than a platform ever retries (hours), so the table stays small."""
        async with self.sessions() as s, s.begin():
            result = await s.execute(
                delete(m.Received).where(m.Received.received_at < func.now() - timedelta(hours=keep_hours))
            )
        return int(getattr(result, "rowcount", 0) or 0)

    async def _store(self, s: AsyncSession, message: Incoming, standing: Standing) -> str:
        match message:
            case Ignored(reason=reason):
                return f"ignored: {reason}"
            case StaffReply() | StaffEdit() | StaffDelete():
                return await self._store_staff(s, message, standing)
            case CustomerMessage():
                raise AssertionError("customer messages are stored by _store_customer")

    async def _store_staff(
        self, s: AsyncSession, message: StaffReply | StaffEdit | StaffDelete, standing: Standing
    ) -> str:
        case = (
            await s.execute(
                select(m.Escalation.id, m.Escalation.status, m.Conversation.id, m.Conversation.key)
                .join(m.Conversation, m.Conversation.id == m.Escalation.conversation_id)
                .where(m.Escalation.case_channel == message.channel, m.Escalation.case_ts == message.case_ts)
            )
        ).first()
        if case is None:
            return "ignored: not a case thread"
        escalation_id, status, conversation_id, key = case
        match message:
            case StaffReply() if standing != Standing.STAFF:
                # Neither relayed nor a claim: only its author learns why. (Their edits and deletions need no check:
                # a message never relayed has no copy to change.)
                log.warning("%s wrote in case #%s's thread, not staff: %s", message.user, escalation_id, standing)
                notice = refusal(standing, doing=REPLY_REFUSED)
                await enqueue(s, [StaffNotice(conversation_id, escalation_id, message.user, notice)])
                return f"ignored: {standing}, not staff"
            case StaffReply() if self.escalation.is_note(message.text):
                if self.channels.of(message.platform).capabilities.reactions:
                    await enqueue(s, [AddReaction(conversation_id, message.channel, message.ts, "memo")])
                return "note"
            case StaffReply() if status in OPEN_CASE:
                submitted = await self.conversations.submit_in(
                    s,
                    key,
                    message.text,
                    author=message.author,
                    external_id=message.ts,
                    order_key=message.ts,
                    kind="staff",
                    files=message.files,
                )
                return "duplicate" if submitted.duplicate else "stored"
            case StaffReply():
                return f"ignored: case {status}"
            case StaffEdit() if not self.escalation.is_note(message.text):
                for statement in _EDIT_STAFF:
                    await s.execute(statement, {"c": conversation_id, "ts": message.ts, "text": message.text})
                await enqueue(s, [RelayEdit(conversation_id, escalation_id, message.ts, message.text)])
                return "stored"
            case StaffEdit() | StaffDelete():  # deleted, or made internal by editing it into a note
                for statement in _DELETE_STAFF:
                    await s.execute(statement, {"c": conversation_id, "ts": message.ts})
                await enqueue(s, [RelayDelete(conversation_id, escalation_id, message.ts)])
                return "stored"
        return "ignored"


# A colleague's message changes where it is kept (the stored message, then the transcript), whether or not it has
# been relayed yet: the relay reads it when it goes out, and a turn writing it to the transcript reads it again in
# its commit, so an edit or a deletion that overtakes either still wins. Two statements, so that the second sees
# a transcript line committed while the first ran.
_EDIT_STAFF = (
    text(
        "UPDATE inbound SET text = :text WHERE conversation_id = :c AND external_id = :ts AND kind = 'staff' "
        "AND deleted_at IS NULL"
    ),
    text(
        "UPDATE messages SET content = :text WHERE role = 'staff' AND inbound_id = ("
        "SELECT id FROM inbound WHERE conversation_id = :c AND external_id = :ts AND kind = 'staff' "
        "AND deleted_at IS NULL)"
    ),
)
_DELETE_STAFF = (
    text(
        "UPDATE inbound SET deleted_at = now() WHERE conversation_id = :c AND external_id = :ts AND kind = 'staff' "
        "AND deleted_at IS NULL"
    ),
    text(
        "DELETE FROM messages WHERE role = 'staff' AND inbound_id = ("
        "SELECT id FROM inbound WHERE conversation_id = :c AND external_id = :ts AND kind = 'staff')"
    ),
)

_CONTINUES = "EXISTS (SELECT FROM event) AND (NOT CAST(:continues_only AS boolean) OR EXISTS (SELECT FROM found))"
_STORE_CUSTOMER = Statement(
    f"""
WITH event AS (
    INSERT INTO received (event_id, team_id, event_type, disposition)
    VALUES (:event_id, :team_id, :event_type, 'stored')
    ON CONFLICT DO NOTHING
    RETURNING event_id
), {STORE_MESSAGE.format(guard=_CONTINUES)},
working AS (
    INSERT INTO outbox (conversation_id, kind, channel, thread_ts, target_ts, reaction)
    SELECT conversation_id, CAST(:working_kind AS text), CAST(:channel AS text), CAST(:thread AS text),
           CAST(:ts AS text), CAST(:reaction AS text)
    FROM stored WHERE CAST(:working_kind AS text) IS NOT NULL
)
SELECT EXISTS (SELECT FROM event) AS fresh, (SELECT id FROM stored) AS inbound_id
"""
)
_DISPOSITION = Statement("UPDATE received SET disposition = :disposition WHERE event_id = :event_id")


async def _first(s: AsyncSession, delivery: Delivery) -> bool:
    """Record a delivery's id in the caller's transaction; False when it is there already (a retry, a replay)."""
    fresh = await s.scalar(
        insert(m.Received)
        .values(
            event_id=delivery.event_id,
            team_id=delivery.team_id,
            event_type=delivery.event_type,
            disposition="received",
        )
        .on_conflict_do_nothing()
        .returning(m.Received.event_id)
    )
    return fresh is not None
