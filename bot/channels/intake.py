"""The durable inbox: an Events API delivery is stored (or recognised as a duplicate) before Slack gets its
acknowledgement; the work happens afterwards in the workers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any, Protocol

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import Platform
from agents.conversation_sql import STORE_MESSAGE
from agents.conversations import Conversations, InboundKind
from agents.db import models as m
from agents.db.deliveries import AddReaction, RelayDelete, RelayEdit, StaffNotice, Typing, enqueue
from agents.identity import Author, vouched
from bot.channels.incoming import (
    CustomerMessage,
    Delivery,
    Ignored,
    Incoming,
    StaffDelete,
    StaffEdit,
    StaffReply,
    sanitised,
)
from bot.delivery.outbox import ReplyStyle
from bot.metrics import Metrics
from bot.slack.events import Policy, classify, delivery_of
from bot.staff import REPLY_REFUSED, Colleagues, Member, StaffGate, Standing, refusal
from escalation.machine import OPEN_CASE
from escalation.policy import EscalationPolicy

log = logging.getLogger(__name__)

IDENTIFY_WITHIN_S = 1.0
"""How long the acknowledgement may wait for a profile not cached yet (Slack allows 3 s). Past it the message is
stored with the signed ids alone: its tools find no orders for it, and the writer's next message tries again."""
STAFF_CHECK_S = 2.0
"""How long a staff reply's ack may wait for Slack to say who wrote it; longer, and Slack gets a 503 and retries."""


class People(Protocol):
    async def identify(self, author: Author) -> Author:
        """The author with the name and email the platform holds for them; as given when it cannot say."""
        ...

    async def member(self, user: str) -> Member | None:
        """Their guest and organisation flags (the same cached profile as `identify`'s)."""
        ...


class Inbox:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        conversations: Conversations,
        policy: Policy,
        style: ReplyStyle,
        escalation: EscalationPolicy,
        metrics: Metrics,
        on_stored: Callable[[], None],
        people: People,
        staff: StaffGate,
        colleagues: Colleagues | None = None,
        customer_organisations: frozenset[str] = frozenset(),
    ) -> None:
        self.sessions = sessions
        self.people = people
        self.conversations = conversations
        self.policy = policy
        self.style = style
        self.escalation = escalation
        self.metrics = metrics
        self.on_stored = on_stored
        self.staff = staff
        self.colleagues = colleagues or Colleagues()
        self.customer_organisations = customer_organisations
        """CUSTOMER_ORGANISATIONS: besides our own, the organisations whose emails tools trust (both platforms)."""

    async def accept(self, envelope: Mapping[str, Any], *, bot_user_id: str | None) -> str:
        """Store one event_callback in a single transaction; returns its disposition. Raises if the database
        cannot take it, so the caller answers with an error and Slack retries."""
        envelope = sanitised(envelope)
        delivery = delivery_of(envelope)
        policy = self.policy if bot_user_id is None else replace(self.policy, bot_user_id=bot_user_id)
        message = classify(envelope, policy)
        author = standing = None
        if isinstance(message, CustomerMessage):
            # Who wrote it is stored with it (tools act for that person), looked up before a connection is taken.
            author, colleague = await self._identify(message)
            if colleague:  # not a customer: takes over a conversation that exists, and starts none
                return await self.take(delivery, message, author=author, continues_only=True, colleague=True)
        elif isinstance(message, StaffReply):  # asked before the transaction: no connection waits for Slack
            async with asyncio.timeout(STAFF_CHECK_S):
                standing = await self.staff.standing(message.user, team=delivery.team_id, user_team=message.user_team)
        return await self.take(delivery, message, author=author, standing=standing)

    async def take(
        self,
        delivery: Delivery,
        message: Incoming,
        *,
        author: Author | None = None,
        standing: Standing | None = None,
        continues_only: bool = False,
        colleague: bool = False,
    ) -> str:
        """Store what an edge made of one delivery (Slack's event, Teams' activity), in one transaction: `author`
        is the customer as the edge identified them, `standing` a colleague's as the edge checked it.
        `continues_only`: store a customer's message only in a conversation that exists (a Teams reply that does
        not mention the bot, in a chain the bot was never asked into). `colleague`: the customer message's writer is
        staff (`bot.staff.Colleagues`), whose message takes the conversation over."""
        if isinstance(message, CustomerMessage):
            async with self.sessions() as s, s.begin():
                # The hot path (every customer message): one statement, so an ack costs one round trip.
                disposition = await self._store_customer(
                    s, delivery, message, author or message.author, continues_only=continues_only, colleague=colleague
                )
        else:
            async with self.sessions() as s, s.begin():
                disposition = await self._store_other(s, delivery, message, standing or Standing.STAFF)
        self.metrics.events.labels(disposition.split(":")[0]).inc()
        if disposition == "stored":
            self.on_stored()
        return disposition

    async def _identify(self, message: CustomerMessage) -> tuple[Author, bool]:
        """The writer's profile, and whether they are a colleague rather than a customer. Both come from the one
        users.info answer (cached), so a customer's message costs no Slack call beyond the profile's; a writer
        who cannot be looked up in time is a customer, as before.

        The profile's email is kept only when Slack confirmed it (`is_email_confirmed`, which the writer's own
        workspace sets) and that workspace is ours or a listed customer organisation: a Slack Connect user's
        profile is their organisation's to write."""
        try:
            async with asyncio.timeout(IDENTIFY_WITHIN_S):
                author = await self.people.identify(message.author)
                member = await self.people.member(author.user)
        except Exception as exc:  # a slow or failing Web API never costs a customer's message
            reason = f"not within {IDENTIFY_WITHIN_S:g} s" if isinstance(exc, TimeoutError) else repr(exc)
            log.warning("no profile for %s (%s): stored without name and email", message.user, reason)
            return message.author, False
        # Whose member they are, as staff detection decides it: our workspace's unless Slack shows them as external.
        organisation = None if member is None else member.team
        if member is not None and member.outsider(message.team) != Standing.EXTERNAL:
            organisation = message.team
        author = vouched(author, organisation=organisation, ours=message.team, customers=self.customer_organisations)
        # A direct message is someone asking the bot, a colleague included: never a takeover.
        if message.is_dm or not self.colleagues.worth_asking(shared=message.shared):
            return author, False
        return author, self.colleagues.includes(author, member, team=message.team, shared=message.shared)

    async def _store_customer(
        self,
        s: AsyncSession,
        delivery: Delivery,
        message: CustomerMessage,
        author: Author,
        *,
        continues_only: bool,
        colleague: bool,
    ) -> str:
        # The "being handled" signal, queued with the message: Slack's working reaction on it, Teams' typing; a
        # colleague's message is not the bot's to handle.
        teams = message.platform == Platform.TEAMS
        working = None if teams or colleague else self.style.working_reaction or None
        kind: InboundKind = "colleague" if colleague else "customer"
        params = self.conversations.store_params(
            message.conversation_key, message.text, author, message.ts, message.ts, kind, files=message.files
        ) | {
            "event_id": delivery.event_id,
            "team_id": delivery.team_id,
            "event_type": delivery.event_type,
            "reaction": working,
            "working_kind": None if colleague else Typing.kind if teams else AddReaction.kind if working else None,
            "channel": message.channel,
            "ts": None if teams else message.ts,
            "thread": message.address.thread if teams else None,
            "continues_only": continues_only,
        }
        row = (await s.execute(_STORE_CUSTOMER, params)).one()
        if not row.fresh:
            return "duplicate"
        if row.inbound_id is None:
            # The same message again (an app_mention's twin message event, a redelivery under a new event_id), or
            # a reply in a conversation that does not exist.
            disposition = "ignored: not a conversation" if continues_only else "duplicate"
            await s.execute(
                update(m.SlackEvent).where(m.SlackEvent.event_id == delivery.event_id).values(disposition=disposition)
            )
            return disposition
        return "stored"

    async def _store_other(self, s: AsyncSession, delivery: Delivery, message: Incoming, standing: Standing) -> str:
        if not await _first(s, delivery):
            return "duplicate"
        disposition = await self._store(s, message, standing)
        await s.execute(
            update(m.SlackEvent).where(m.SlackEvent.event_id == delivery.event_id).values(disposition=disposition)
        )
        return disposition

    async def first_request(self, request: Delivery) -> bool:
        """Record a slash command or interaction (`slack_events.trigger_of`); False when it was seen before."""
        async with self.sessions() as s, s.begin():
            return await _first(s, request)

    async def prune(self, *, keep_hours: float = 72) -> int:
        """Forget event ids (and trigger ids) older than Slack ever retries (hours), so the table stays small."""
        async with self.sessions() as s, s.begin():
            result = await s.execute(
                delete(m.SlackEvent).where(m.SlackEvent.received_at < func.now() - timedelta(hours=keep_hours))
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
                if message.platform == Platform.SLACK:  # a bot cannot react in Teams
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
_STORE_CUSTOMER = text(
    f"""
WITH event AS (
    INSERT INTO slack_events (event_id, team_id, event_type, disposition)
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


async def _first(s: AsyncSession, delivery: Delivery) -> bool:
    """Record a delivery's id in the caller's transaction; False when it is there already (a retry, a replay)."""
    fresh = await s.scalar(
        insert(m.SlackEvent)
        .values(
            event_id=delivery.event_id,
            team_id=delivery.team_id,
            event_type=delivery.event_type,
            disposition="received",
        )
        .on_conflict_do_nothing()
        .returning(m.SlackEvent.event_id)
    )
    return fresh is not None
