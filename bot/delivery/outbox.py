"""The outbox: what the chat platforms are owed (typed deliveries, `agents.db.deliveries`), written in the transaction
that
caused it, and the one sender that sends it. This is the only code that posts, edits, deletes or reacts, in Slack or
in Teams, for the bot's conversations and cases; escalation renders what its messages show and posts nothing itself.
The platforms' calls are a `bot.channels.messenger.Messenger` each: a customer's rows go to the conversation's
platform, a
case's rows to the staff channel's, so one conversation can be answered in Slack and handled by staff in Teams.

Per conversation, rows go out in id order under a send lease (`send_leases`: owner and expiry, claimed and
renewed in short statements), so several bot processes never send one conversation's rows concurrently, no
connection is held while Slack answers, and a crashed sender's lease runs out. The client retries nothing by
itself. Every post (reply, case, relay, reminder) carries its outbox id in its message metadata, and its attempt
is committed before it is sent; a post whose attempt was recorded but never confirmed (the process died waiting for
Slack's answer, the answer was lost, or the sender stalled past its lease) is looked for where it would be by that
id, and only posted if it is not there. Slack offers no idempotency key, so one gap stays: a process frozen
(SIGSTOP, a paused VM) between recording its attempt and writing the request, for longer than its lease, whose
request goes out after another sender has looked and posted. It is narrowed (a post whose attempt took more than
half a lease to record is not sent, and stays in doubt) and mended (a sender that finds its row recorded as posted
under another id deletes its own post); `python -m bench.fault_processes` freezes processes mid-send.

Teams cannot be looked in (the Bot Connector API reads no messages back), so there a post whose outcome is unknown
is never posted again: it is given up, counted and shown to the admins (at most once). A post Teams refused
(429, or 503 with Retry-After) was not made, and is tried again after the wait (exactly once).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, assert_never

from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import func, select, text, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from agents.address import Address, Platform
from agents.agent import Roster
from agents.attachments import FileRef
from agents.conversations import ResultKind, TurnCommit
from agents.db import models as m
from agents.db.deliveries import (
    AddReaction,
    Answer,
    CasePost,
    CaseUpdate,
    Change,
    CsatAsk,
    Delivery,
    FileRelay,
    FilesToCustomer,
    FilesToStaff,
    NewMessage,
    Outcome,
    Post,
    RelayDelete,
    RelayEdit,
    RelayToCustomer,
    RelayToStaff,
    Reminder,
    RemoveReaction,
    StaffNotice,
    Typing,
    delivery_of,
    enqueue,
)
from agents.leases import keep_renewed, process_owner
from agents.markup.limits import MESSAGE_TEXT, clip, split_text
from agents.markup.text import escape, from_markdown
from bot.answers import answer_message
from bot.channels.messenger import FileSharing, Messenger, Refused, Where
from bot.csat import csat_question
from bot.slack.files import SlackFiles, Unreadable
from bot.slack.messenger import SlackMessenger
from bot.teams.limits import split_text as teams_split
from bot.teams.text import from_markdown as teams_markdown
from escalation.policy import EscalationPolicy
from escalation.render import CaseRenderer
from escalation.views import Message, case_given_up, case_problem, files_not_shared, relay_text

log = logging.getLogger(__name__)

FETCH_AHEAD = 20
"""Rows of one conversation read at once (in order; only this sender, holding the lease, sends them)."""
HOLDING_SEND_LEASE = "EXISTS (SELECT FROM send_leases WHERE conversation_id = :k AND owner = :o AND until > now())"
"""A write by a sender (`:o`) that is valid only while it holds the conversation's (`:k`) send lease."""
_CLAIM = text(
    "UPDATE outbox SET result_ts = :ts WHERE id = :id AND (result_ts IS NULL OR result_ts = :ts) RETURNING id"
)
_CLAIM_AND_DONE = text(
    "UPDATE outbox SET result_ts = :ts, done_at = coalesce(done_at, now()), "
    f"outcome = coalesce(outcome, '{Outcome.SENT}') "
    "WHERE id = :id AND (result_ts IS NULL OR result_ts = :ts) RETURNING id"
)
"""A post's id claimed for its row (`_claim_post`); the second also marks the row sent, unless it already ended."""
_DUE_CONVERSATIONS = text(
    """
    SELECT head.conversation_id, conversations.key FROM (
        SELECT DISTINCT ON (conversation_id) conversation_id, id, next_attempt_at
        FROM outbox WHERE done_at IS NULL ORDER BY conversation_id, id
    ) head LEFT JOIN conversations ON conversations.id = head.conversation_id
    WHERE head.next_attempt_at IS NULL OR head.next_attempt_at <= now()
    ORDER BY head.id LIMIT 200
    """
)
"""Conversations whose next row is due, oldest first, with their keys (which name the customer's platform): ones
waiting out a backoff (their later rows wait behind it, in order) take no place in the batch, so a pile of them
never starves a healthy conversation."""
_SKIP_PAIRS = text(
    f"""
    UPDATE outbox SET done_at = now(), outcome = 'skipped', last_error = 'removed before it was added'
    WHERE id = ANY(:ids) AND done_at IS NULL
      AND (SELECT count(*) FROM outbox WHERE id = ANY(:ids) AND done_at IS NULL AND attempts = 0) = :n
      AND {HOLDING_SEND_LEASE}
    RETURNING id
    """
)


@dataclass(frozen=True)
class ReplyStyle:
    handoff_notice: str = "_Connecting you with {agent}…_"
    """Shown to the customer on each handoff; `{agent}` is the agent's title. Empty: no notice."""
    working_reaction: str = "eyes"
    done_reaction: str = "white_check_mark"


def posts(*, conversation_id: int, address: Address, body: str) -> list[Post]:
    """An answer as the conversation's platform shows it (Slack mrkdwn or Teams markdown, nothing in it a mention
    or a disguised link), in as many posts as its length needs."""
    teams = address.platform == Platform.TEAMS
    parts = teams_split(teams_markdown(body)) if teams else split_text(from_markdown(body))
    return [Post(conversation_id, address.channel, address.thread, part) for part in parts]


def answers(*, conversation_id: int, address: Address, body: str) -> list[Post] | list[Answer]:
    """An agent's answer: in Slack `Answer`s, kept as the model's Markdown and rendered when sent (markdown block,
    feedback buttons); in Teams `posts`."""
    if address.platform == Platform.TEAMS:
        return posts(conversation_id=conversation_id, address=address, body=body)
    return [Answer(conversation_id, address.channel, address.thread, part) for part in split_text(body)]


def turn_outbox(
    roster: Roster,
    style: ReplyStyle,
    policy: EscalationPolicy,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Callable[[AsyncSession, TurnCommit], Awaitable[None]]:
    """The engine's after_turn hook: what Slack should see of a turn (the customer's replies, the case for
    staff, relays both ways), queued in the turn's own transaction."""

    async def after_turn(s: AsyncSession, commit: TurnCommit) -> None:
        address = Address.parse(commit.key)
        if address is None:
            return
        channel, thread = address.channel, address.thread
        cid, result, escalation_id = commit.conversation_id, commit.result, commit.result.escalation_id
        owed: list[Delivery] = []
        if style.handoff_notice:
            for handoff in result.handoffs:
                notice = style.handoff_notice.format(agent=roster.get(handoff.to_agent).title)
                owed += posts(conversation_id=cid, address=address, body=notice)
        if result.kind == ResultKind.STAFF:
            if escalation_id is not None:
                source = commit.external_id
                if commit.text.strip() or not commit.files:
                    owed.append(
                        RelayToCustomer(cid, escalation_id, channel, thread, commit.author, commit.text, source)
                    )
                if commit.files and source:
                    owed.append(FilesToCustomer(cid, escalation_id, channel, thread, commit.author, source))
                owed.append(CaseUpdate(cid, escalation_id))
        elif result.reply and result.kind == ResultKind.REPLY:
            owed += answers(conversation_id=cid, address=address, body=result.reply)
        elif result.reply:  # a notice: escalated, over a limit
            owed += posts(conversation_id=cid, address=address, body=result.reply)
        if result.kind == ResultKind.ESCALATED and escalation_id is not None and policy.staff_channel:
            if policy.hours is not None and not policy.hours.is_open(clock()):
                notice = policy.off_hours_message.format(hours=policy.hours.label)
                owed += posts(conversation_id=cid, address=address, body=notice)
            owed.append(CasePost(cid, escalation_id, policy.staff_channel))
        if result.kind == ResultKind.HUMAN and escalation_id is not None and policy.staff_channel:
            if commit.files and commit.external_id:  # the files, shared with the words
                owed.append(FilesToStaff(cid, escalation_id, commit.author, commit.text, commit.external_id))
            else:
                owed.append(RelayToStaff(cid, escalation_id, commit.author, commit.text))
        if result.kind == ResultKind.TAKEN_OVER and escalation_id is not None and policy.staff_channel:
            # Staff learn of it from the case alone (posted, or showing its new owner); the words stay in the thread.
            if result.escalation_reason is not None:  # opened for them
                owed.append(CasePost(cid, escalation_id, policy.staff_channel))
            else:
                owed.append(CaseUpdate(cid, escalation_id))
        # Teams has no reactions a bot can add: its "being handled" signal is the typing indicator, sent when the
        # message is stored, and the reply itself ends it.
        from_customer = result.kind not in (ResultKind.STAFF, ResultKind.TAKEN_OVER)
        if commit.external_id and from_customer and address.platform != Platform.TEAMS:
            message = commit.external_id
            if style.working_reaction:
                owed.append(RemoveReaction(cid, channel, message, style.working_reaction))
            if style.done_reaction and result.kind not in (ResultKind.HUMAN, ResultKind.LIMITED):  # not answered (yet)
                owed.append(AddReaction(cid, channel, message, style.done_reaction))
        await enqueue(s, owed)

    return after_turn


# Errors that no retry will mend: the row is given up at once (logged), so it never blocks its conversation.
TRANSIENT_ERRORS = frozenset({"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"})
"""Slack's errors that say nothing about the call itself: tried again until `give_up_after`. Any other error
answers the call the same way every time, so it is given up after DETERMINISTIC_TRIES."""
DETERMINISTIC_TRIES = 3
PERMANENT_ERRORS = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "msg_too_long",
        "no_text",
        "invalid_blocks",
        "message_not_found",
        "cant_update_message",
        "cant_delete_message",
        "thread_not_found",
    }
)


LAYOUT_ERRORS = frozenset({"invalid_blocks", "invalid_blocks_format", "msg_too_long", "invalid_attachments"})
"""Slack refused a message's layout, not the message: the words alone are posted instead."""
FILES_NOT_SHARED = "files are relayed only between Slack threads"
"""Why a file relay to or from Teams carries the files' names only."""
FIXABLE_BY_ADMINS = frozenset({"not_in_channel", "channel_not_found", "is_archived", "restricted_action"})
"""A case post refused for these waits (retried, the admins told) for `case_patience`: someone may invite the bot
or correct STAFF_CHANNEL_ID meanwhile."""


def _platform(key: str | None) -> str:
    """The platform of a conversation's key (Slack for keys that are no platform's, such as tests')."""
    address = Address.parse(key) if key else None
    return address.platform if address is not None else Platform.SLACK


class Undeliverable(Exception):
    """A row that cannot be sent however often it is tried (an unknown kind, a case thread that was never posted)."""


PACE_S = 1.0
"""Posts to a channel that answered a 429 go this far apart: Slack's "one message a second per channel" (Teams
allows more a conversation, and is paced only once it has said 429 too)."""
QUIET_AFTER_S = 30.0
"""A channel paced this long ago, or a turn given out this long ago, is forgotten."""
TURN_SLACK_S = 0.05
"""A paced row that comes back this close to its turn takes it."""


@dataclass
class _Pace:
    next_s: float
    """time.monotonic() of the channel's next free turn."""
    turns: dict[int, float] = field(default_factory=dict)
    """Turns given out and not yet taken: row id -> time.monotonic()."""


class OutboxSender:
    def __init__(
        self,
        *,
        engine: AsyncEngine,
        client: AsyncWebClient | None = None,
        messengers: Sequence[Messenger] = (),
        staff_platform: Platform = Platform.SLACK,
        cases: CaseRenderer | None = None,
        give_up_after: timedelta = timedelta(hours=24),
        case_patience: timedelta = timedelta(minutes=10),
        admins: frozenset[str] = frozenset(),
        teams_admins: frozenset[str] = frozenset(),
        staff_channel: str | None = None,
        unreachable_notice: str = "",
        hand_back: Callable[[int], Awaitable[object]] | None = None,
        owner: str = "",
        lease_s: float = 30.0,
        feedback_buttons: bool = True,
        files: SlackFiles | None = None,
    ) -> None:
        self.engine = engine
        self.files = files
        """Downloads the files that file relays share again (within MAX_FILE_BYTES); None: only their names go."""
        self.owner = owner or process_owner()
        self.lease_s = lease_s
        """How long a send lease lasts unrenewed: a crashed sender's conversations wait this long."""
        self.cases = cases
        """Renders the staff side's messages; None where no escalation deliveries are sent (they are given up)."""
        self.messengers: dict[str, Messenger] = {one.platform: one for one in messengers}
        """Each platform's calls; `client` (Slack's, which retries nothing by itself) is the Slack one."""
        if client is not None:
            self.messengers[Platform.SLACK] = SlackMessenger(client)
        self.staff_platform = staff_platform
        """Where the staff channel is: cases, their updates, relays to staff, reminders and notices go there."""
        self.give_up_after = give_up_after
        self.case_patience = case_patience
        """How long a case the staff channel refuses is tried again before the customer is told."""
        self.admins = admins
        """Told by direct message (in Slack) when a case cannot be posted or a post may be missing."""
        self.teams_admins = teams_admins
        """The same, in Teams (user ids a chat can be opened with: `8:orgid:<Entra object id>`)."""
        self.staff_channel = staff_channel
        """Reactions there (a colleague's note marked 📝) go to the staff platform."""
        self.unreachable_notice = unreachable_notice
        """Posted to the customer when their case could not be posted at all."""
        self.feedback_buttons = feedback_buttons
        """👍/👎 under each AI answer (FEEDBACK_BUTTONS)."""
        self.hand_back = hand_back
        """Hands the conversation of a case that could not be posted back to the bot (the desk's transition)."""
        self._paced: dict[tuple[str, str], _Pace] = {}
        """Channels that answered a post with a 429 lately, by (platform, channel): their posts go one per
        Retry-After until the channel is quiet again, instead of every waiting conversation trying at once."""

    async def send_pending(self, *, concurrency: int = 8, pace: Callable[[], Awaitable[None]] | None = None) -> int:
        """Send every due row of every conversation not being sent by someone else; returns rows sent. `pace`
        is awaited before each row (the workers hold sends back while the process is saturated)."""
        async with self.engine.connect() as conn:
            conversations = (await conn.execute(_DUE_CONVERSATIONS)).all()
        limit = asyncio.Semaphore(concurrency)

        async def one(cid: int | None, key: str | None) -> int:
            async with limit:
                return await self._send_conversation(cid, _platform(key), pace)

        results = await asyncio.gather(*(one(*due) for due in conversations), return_exceptions=True)
        for failure in (r for r in results if isinstance(r, BaseException)):
            log.error("outbox: sending a conversation failed", exc_info=failure)
        return sum(r for r in results if isinstance(r, int))

    async def _send_conversation(
        self, conversation_id: int | None, platform: str, pace: Callable[[], Awaitable[None]] | None = None
    ) -> int:
        """`platform`: the customer's, where the conversation's own rows go."""
        key = conversation_id or 0
        if not await self._lease(key):
            return 0
        sent = 0
        # Renewed in the background while rows go out, however long one takes (a case summary, a slow Slack):
        # only a sender that is dead or frozen loses the lease.
        lost = asyncio.Event()
        keeper = asyncio.create_task(
            keep_renewed(lambda: self._lease(key), every_s=self.lease_s / 3, lost=lost), name=f"send-lease-{key}"
        )
        try:
            while not lost.is_set():
                async with self.engine.connect() as conn:
                    rows = (
                        await conn.execute(
                            select(m.Outbox)
                            .where(m.Outbox.conversation_id.is_not_distinct_from(conversation_id))
                            .where(m.Outbox.done_at.is_(None))
                            .order_by(m.Outbox.id)
                            .limit(FETCH_AHEAD)
                        )
                    ).all()
                if not rows:
                    break
                rows = await self._without_pointless(rows, key)
                progressed = True
                for row in rows:
                    if lost.is_set():
                        break
                    if row.next_attempt_at and row.next_attempt_at > datetime.now(UTC):
                        progressed = False  # the head waits out its backoff and the rest wait behind it
                        break
                    if pace is not None:
                        await pace()
                    outcome = await self._deliver(row, key, platform)
                    if outcome is None:
                        progressed = False
                        break
                    sent += outcome == Outcome.SENT
                if not progressed:
                    break
        finally:
            keeper.cancel()
            async with self.engine.begin() as conn:
                await conn.execute(
                    text("DELETE FROM send_leases WHERE conversation_id = :k AND owner = :o"),
                    {"k": key, "o": self.owner},
                )
        return sent

    async def _without_pointless(self, rows: Sequence[Row[Any]], key: int) -> list[Row[Any]]:
        """A working reaction not tried yet whose removal is already queued (the reply was faster than the
        sender, as under load) is neither added nor removed: two Slack calls nobody would see. Both rows are
        skipped together or not at all, and only while this sender holds the conversation's send lease. What
        this gives up: a sender killed between adding the reaction and recording it leaves that 👀 beside the
        ✅ (a reaction's attempt is not recorded first, to keep it one statement)."""
        pending_adds: dict[tuple[str, str | None, str | None], Row[Any]] = {}
        pairs: list[int] = []
        for row in rows:
            place = (row.channel, row.target_ts, row.reaction)
            if row.kind == AddReaction.kind and row.attempts == 0:
                pending_adds[place] = row
            elif row.kind == RemoveReaction.kind and (added := pending_adds.pop(place, None)) is not None:
                pairs += [added.id, row.id]
        if not pairs:
            return list(rows)
        async with self.engine.begin() as conn:
            skipped = await conn.execute(_SKIP_PAIRS, {"ids": pairs, "n": len(pairs), "k": key, "o": self.owner})
            if len(skipped.all()) != len(pairs):
                return list(rows)
        return [row for row in rows if row.id not in pairs]

    async def _lease(self, key: int) -> bool:
        """Claim (or renew) the send lease of one conversation's rows; False while another sender holds it."""
        async with self.engine.begin() as conn:
            got = await conn.scalar(
                text(
                    "INSERT INTO send_leases (conversation_id, owner, until) "
                    "VALUES (:k, :o, now() + make_interval(secs => :ttl)) "
                    "ON CONFLICT (conversation_id) DO UPDATE SET owner = :o, until = EXCLUDED.until "
                    "WHERE send_leases.owner = :o OR send_leases.until < now() RETURNING conversation_id"
                ),
                {"k": key, "o": self.owner, "ttl": self.lease_s},
            )
        return got is not None

    def _messenger(self, delivery: Delivery, customer_platform: str) -> Messenger:
        """The customer's platform for what the customer sees, the staff channel's for the case's side."""
        staff_side = isinstance(
            delivery, CasePost | CaseUpdate | RelayToStaff | FilesToStaff | Reminder | StaffNotice
        ) or (isinstance(delivery, AddReaction | RemoveReaction) and delivery.channel == self.staff_channel)
        platform = self.staff_platform if staff_side else customer_platform
        messenger = self.messengers.get(platform)
        if messenger is None:
            raise Undeliverable(f"{platform} is not configured")
        return messenger

    async def _deliver(self, row: Row[Any], key: int, platform: str = Platform.SLACK) -> Outcome | None:
        """Send one row; None when it must wait (a transient failure, a lost lease), so later rows keep their
        order."""
        try:
            delivery = delivery_of(row._mapping)
        except ValueError as exc:
            return await self._give_up(row, str(exc))
        try:
            messenger = self._messenger(delivery, platform)
            if isinstance(delivery, FileRelay) and isinstance(messenger, FileSharing) and self.files is not None:
                return await self._share_once(row, key, delivery, messenger)
            if isinstance(delivery, NewMessage):
                return await self._post_once(row, key, delivery, messenger)
            await self._change(delivery, messenger)
            return await self._done(row, Outcome.SENT, attempts=m.Outbox.attempts + 1)
        except Undeliverable as exc:
            return await self._give_up(row, str(exc))
        except Refused as exc:
            error = exc.error
            if error == "ratelimited":  # waited out here, not in the client: no call outlives its lease unseen
                await self._backoff(row, error, delay=timedelta(seconds=exc.retry_after or 1))
                return None
            if (error, type(delivery)) in (("already_reacted", AddReaction), ("no_reaction", RemoveReaction)):
                return await self._done(row, Outcome.SENT, attempts=m.Outbox.attempts + 1)
            if isinstance(delivery, AddReaction | RemoveReaction | StaffNotice | Typing):
                # A reaction or a notice is a courtesy (a deleted custom emoji, a restricted channel, a person who
                # left): it never holds the replies behind it.
                return await self._give_up(row, error)
            if isinstance(delivery, CasePost):
                return await self._case_failed(row, delivery, error, transient=error in TRANSIENT_ERRORS)
            tries = row.attempts + 1  # `row` was read before this try (a post's is counted in the table already)
            if (
                error in PERMANENT_ERRORS
                or (error not in TRANSIENT_ERRORS and tries >= DETERMINISTIC_TRIES)
                or datetime.now(UTC) - row.created_at > self.give_up_after
            ):
                return await self._give_up(row, error)
            await self._backoff(row, error)
            return None
        except Exception as exc:  # connection failures, lost answers and timeouts: tried again after a backoff
            if isinstance(delivery, Typing):  # stale within seconds: it never holds the reply behind it
                return await self._give_up(row, repr(exc))
            if isinstance(delivery, CasePost):
                return await self._case_failed(row, delivery, repr(exc), transient=True)
            if datetime.now(UTC) - row.created_at > self.give_up_after:  # nothing holds a conversation for good
                return await self._give_up(row, repr(exc))
            await self._backoff(row, repr(exc))
            return None

    async def _post_once(self, row: Row[Any], key: int, delivery: NewMessage, messenger: Messenger) -> Outcome | None:
        """Post a new message, unless an earlier attempt at this row is found where it would be; None when the
        attempt could not be recorded (the lease went to another sender, who goes on from this row)."""
        where = await self._where(delivery)
        in_doubt = row.attempted_at is not None  # an attempt whose answer never came
        if in_doubt and not messenger.can_look:
            if isinstance(delivery, CasePost):
                # As a case nobody could post: the customer is told and answered by the bot again (a card that
                # did reach the channel shows a case already handed back).
                return await self._case_given_up(row, delivery, f"outcome unknown ({row.last_error or 'no answer'})")
            return await self._unknowable(row, delivery)
        ts = await self._already_posted(row, where, messenger) if in_doubt else None
        if ts is None:
            message = await self._render(delivery)
            if message is None:
                return await self._done(row, Outcome.SKIPPED, last_error="deleted before it was relayed")
            if (wait_s := self._turn_in(messenger.platform, where.channel, row.id)) > 0:
                # Waiting for its turn is not a try: neither counted nor an error.
                await self._mark(row.id, next_attempt_at=func.now() + timedelta(seconds=wait_s))
                return None
            recording = time.monotonic()
            if not await self._attempt(row, key):
                return None
            if time.monotonic() - recording > self.lease_s / 2 and not await self._still_ours(row, key):
                # Frozen (SIGSTOP, a paused VM) or starved since the attempt was recorded, and the lease or the row
                # has moved on: another sender may have looked, found nothing and posted. Not sending narrows the
                # gap the module's docstring admits; the row stays in doubt, so the next try looks first.
                late_s = time.monotonic() - recording
                log.warning("outbox row %s: %.1f s passed recording its attempt; not sent", row.id, late_s)
                return None
            try:
                try:
                    ts = await messenger.post(where, message, outbox_id=row.id)
                except Refused as exc:
                    if not (message.blocks and exc.error in LAYOUT_ERRORS):
                        raise
                    # The platform refused the layout, so nothing was posted: the same attempt posts the words alone.
                    log.warning("outbox row %s: its layout was refused (%s); posting it as text", row.id, exc)
                    ts = await messenger.post(where, Message(clip(message.text, MESSAGE_TEXT)), outbox_id=row.id)
            except Refused as exc:
                if exc.error == "ratelimited":
                    self._pace(messenger.platform, where.channel, exc.retry_after or 1.0)
                if exc.certain:  # the platform said it posted nothing: no post is in doubt, the next try need not look
                    await self._settled(row, key)
                raise
        if not isinstance(delivery, CasePost):
            await self._claim_post(row, where, ts, messenger, done=True)  # claimed and done in one statement
            return Outcome.SENT
        # A case's card is claimed first and the row done once the case knows where it is (a crash in between
        # finds the claimed card where it would look).
        if await self._claim_post(row, where, ts, messenger, done=False):
            await self._renderer().case_posted(delivery.escalation_id, channel=where.channel, ts=ts)
            await self._done(row, Outcome.SENT, result_ts=ts)
        return Outcome.SENT

    async def _claim_post(self, row: Row[Any], where: Where, ts: str, messenger: Messenger, *, done: bool) -> bool:
        """Record `ts` as this row's post (and, with `done`, the row as sent) unless another post is recorded for it
        already; False then: this one is a second (the gap the module's docstring admits: this sender was frozen
        past its lease after recording its attempt, and the next one looked, found nothing and posted), and is
        deleted. One conditional statement, so that two senders never both go on."""
        async with self.engine.begin() as conn:
            claimed = await conn.scalar(_CLAIM_AND_DONE if done else _CLAIM, {"id": row.id, "ts": ts})
            if claimed is not None:
                return True
            first = await conn.scalar(select(m.Outbox.result_ts).where(m.Outbox.id == row.id))
        log.warning("outbox row %s posted twice (%s, %s): deleting the second", row.id, first, ts)
        try:
            await messenger.delete(where, ts)
        except Exception as exc:  # the second post stands: shown to the admins, not only logged
            log.error("outbox row %s: its second post %s could not be deleted: %r", row.id, ts, exc)
            await self._alert_admins(
                f":warning: A message of conversation {row.conversation_id} (outbox row {row.id}) was posted twice "
                f"and the second ({escape(ts)}) could not be deleted: {escape(repr(exc))}. Delete it by hand."
            )
        return False

    async def _still_ours(self, row: Row[Any], key: int) -> bool:
        """Whether this sender still holds the lease and nobody has tried the row since its own attempt: then no
        other sender can have posted it."""
        async with self.engine.connect() as conn:
            mine = await conn.scalar(
                text(
                    "SELECT id FROM outbox WHERE id = :id AND done_at IS NULL AND attempts = :n "
                    f"AND {HOLDING_SEND_LEASE}"
                ),
                {"id": row.id, "n": row.attempts + 1, "k": key, "o": self.owner},
            )
        return mine is not None

    def _pace(self, platform: str, channel: str, retry_after_s: float) -> None:
        """After a 429 on a post to `channel`: the next post in Retry-After, then one every PACE_S; turns given out
        before it are void (their rows take new ones, in the order they come back)."""
        now = time.monotonic()
        for other, pace in list(self._paced.items()):  # channels quiet for a while: forgotten
            if pace.next_s + QUIET_AFTER_S < now:
                del self._paced[other]
        pace = self._paced.setdefault((platform, channel), _Pace(next_s=now))
        pace.next_s = max(pace.next_s, now + retry_after_s)
        pace.turns.clear()

    def _turn_in(self, platform: str, channel: str, row_id: int) -> float:
        """Seconds until row `row_id` may post to `channel` (0: now). A row given a turn keeps it when it comes
        back for it; a channel with no post for PACE_S and no turn given out is no longer paced."""
        pace = self._paced.get((platform, channel))
        if pace is None:
            return 0.0
        now = time.monotonic()
        if (turn := pace.turns.pop(row_id, None)) is not None:
            if turn - now > TURN_SLACK_S:  # back early (woken for another reason): the same turn stands
                pace.turns[row_id] = turn
                return turn - now
            return 0.0
        # Turns long past were never taken (another process sent the row, or it was given up): forgotten.
        pace.turns = {row: at for row, at in pace.turns.items() if at > now - QUIET_AFTER_S}
        if pace.next_s + PACE_S < now and not pace.turns:
            del self._paced[(platform, channel)]
            return 0.0
        turn = max(pace.next_s, now)
        pace.next_s = turn + PACE_S
        if turn - now <= TURN_SLACK_S:
            return 0.0
        pace.turns[row_id] = turn
        return turn - now

    async def _share_once(self, row: Row[Any], key: int, relay: FileRelay, messenger: Messenger) -> Outcome | None:
        """Relay a message's files: download each, upload it again, record the uploaded ids on the row, then share
        them in one message with the relayed words. After an unknown outcome the files' shares are looked at
        (files.info) before sharing again. A row in doubt without uploads tried the words alone (`_post_once`)."""
        assert isinstance(messenger, FileSharing) and self.files is not None
        uploaded: list[str] = list(row.uploaded or ())
        in_doubt = row.attempted_at is not None
        if in_doubt and not uploaded:
            return await self._post_once(row, key, relay, messenger)
        where = await self._where(relay)
        if in_doubt and (ts := await messenger.find_share(where, uploaded)) is not None:
            return await self._done(row, Outcome.SENT, result_ts=ts)
        shared = await self._renderer().shared_files(relay)
        if shared is None:
            return await self._done(row, Outcome.SKIPPED, last_error="deleted before it was relayed")
        left_out = [ref for ref in shared.files if self.files.too_big(ref)]
        if not uploaded:
            for ref in shared.files:
                try:
                    data = None if ref in left_out else await self.files.fetch(ref)
                except Unreadable as exc:  # deleted since, or refused: its name goes instead, nothing waits on it
                    log.warning("file %s not relayed: %s", ref.name, exc)
                    data = None
                if data is None:  # larger than the limit, as Slack declared it or as it turned out
                    left_out += [] if ref in left_out else [ref]
                    continue
                uploaded.append(await messenger.upload(ref.name, data))
            if not uploaded:  # nothing to share: the words go alone, with the files' names
                return await self._post_once(row, key, relay, messenger)
        comment = shared.comment.text
        if left_out:
            comment = files_not_shared(comment, [(ref.name, self._not_shared(ref)) for ref in left_out])
        if not await self._attempt(row, key, uploaded=uploaded):
            return None
        try:
            ts = await messenger.share(where, uploaded, comment)
        except Refused as exc:
            if exc.certain:  # not shared: the next try shares the same uploads again, without looking
                await self._settled(row, key)
            raise
        return await self._done(row, Outcome.SENT, result_ts=ts)

    def _not_shared(self, ref: FileRef) -> str:
        """Why a file of a file relay goes as its name only."""
        if self.files is not None and self.files.too_big(ref):
            return f"larger than {self.files.limits.max_bytes / 1_000_000:g} MB"
        return FILES_NOT_SHARED

    async def _unknowable(self, row: Row[Any], delivery: NewMessage) -> Outcome:
        """A post whose outcome is unknown on a platform that cannot be looked in: posting it again could show it
        twice, so it is given up, counted, and the admins are told what may be missing."""
        error = f"outcome unknown ({row.last_error or 'no answer'}); not posted again"
        await self._alert_admins(
            f":warning: A message of conversation {row.conversation_id} ({delivery.kind}, outbox row {row.id}) may "
            f"not have reached {self._platform_name(delivery)}: {escape(error)}. Look there and repeat it if missing."
        )
        return await self._give_up(row, error)

    def _platform_name(self, delivery: NewMessage) -> str:
        staff_side = isinstance(delivery, CasePost | RelayToStaff | FilesToStaff | Reminder)
        return "the staff channel" if staff_side else "the customer"

    async def _case_failed(self, row: Row[Any], case: CasePost, error: str, *, transient: bool) -> Outcome | None:
        """A case the staff channel would not take. The admins hear at once (most such failures are theirs to
        fix: invite the bot, correct STAFF_CHANNEL_ID); it is tried again while that can help (at least
        DETERMINISTIC_TRIES times, and for `case_patience`); given up, the admins get the case itself, the customer
        is told that nobody could be reached yet, and the conversation goes back to the bot."""
        tries = row.attempts + 1
        patient = datetime.now(UTC) - row.created_at <= self.case_patience
        hopeless = not transient and error not in FIXABLE_BY_ADMINS
        if tries < DETERMINISTIC_TRIES or (patient and not hopeless):
            await self._backoff(row, error)
            if row.last_error is None:  # its first failure
                await self._alert_admins(case_problem(case.escalation_id, case.channel, escape(error)))
            return None
        messenger = self.messengers.get(self.staff_platform)
        if (transient or row.attempted_at is not None) and messenger is not None and messenger.can_look:
            # The last answer may have been lost: the case may be there after all.
            with contextlib.suppress(Exception):
                where = Where(case.channel, None)
                if (ts := await self._already_posted(row, where, messenger)) is not None:
                    await self._renderer().case_posted(case.escalation_id, channel=case.channel, ts=ts)
                    return await self._done(row, Outcome.SENT, result_ts=ts)
        return await self._case_given_up(row, case, error)

    async def _case_given_up(self, row: Row[Any], case: CasePost, error: str) -> Outcome:
        try:
            text = (await self._renderer().case(case.escalation_id)).text
        except Exception:  # what failed may be the rendering itself
            text = f"Case #{case.escalation_id}"
        await self._alert_admins(case_given_up(case.escalation_id, escape(error), text))
        notice: list[Delivery] = []
        if self.unreachable_notice and (address := await self._customer_address(case.conversation_id)) is not None:
            notice = [*posts(conversation_id=case.conversation_id, address=address, body=self.unreachable_notice)]
        outcome = await self._give_up(row, error, then=notice)
        if self.hand_back is not None:
            # Still with "a person", the customer's next messages would be relayed to a case thread that does
            # not exist: the bot answers them instead.
            await self.hand_back(case.escalation_id)
        return outcome

    async def _customer_address(self, conversation_id: int) -> Address | None:
        async with self.engine.connect() as conn:
            key = await conn.scalar(select(m.Conversation.key).where(m.Conversation.id == conversation_id))
        return Address.parse(key) if key else None

    async def _alert_admins(self, text: str) -> None:
        """A direct message to each admin (in Slack: ADMIN_USER_IDS); best effort (each failure is logged), as it
        reports a failure."""
        for platform, admins in ((Platform.SLACK, self.admins), (Platform.TEAMS, self.teams_admins)):
            messenger = self.messengers.get(platform)
            for admin in sorted(admins):
                try:
                    if messenger is None:
                        raise Undeliverable(f"{platform} is not configured")
                    await messenger.direct(admin, text)
                except Exception as exc:
                    log.error("could not tell admin %s about a failed delivery: %r", admin, exc)

    async def _where(self, delivery: NewMessage) -> Where:
        match delivery:
            case (
                Post(channel=channel, thread=thread)
                | Answer(channel=channel, thread=thread)
                | RelayToCustomer(channel=channel, thread=thread)
                | CsatAsk(channel=channel, thread=thread)
                | FilesToCustomer(channel=channel, thread=thread)
            ):
                return Where(channel, thread)
            case CasePost(channel=channel):
                return Where(channel, None)
            case (
                RelayToStaff(escalation_id=escalation_id)
                | FilesToStaff(escalation_id=escalation_id)
                | Reminder(escalation_id=escalation_id)
            ):
                # The case's thread: known once the case message is out, which it always is by now (it was queued
                # earlier in the same conversation).
                where = await self._renderer().case_thread(escalation_id)
                if where is None:
                    raise Undeliverable(f"case {escalation_id} has no thread")
                return Where(*where)

    async def _render(self, delivery: NewMessage) -> Message | None:
        match delivery:
            case Post(text=text):
                return Message(text, native=True)
            case Answer(text=markdown):
                return answer_message(markdown, feedback=self.feedback_buttons)
            case CasePost(escalation_id=escalation_id):
                return await self._renderer().case(escalation_id)
            case RelayToStaff():
                return await self._renderer().relay_to_staff(delivery)
            case RelayToCustomer():
                return await self._renderer().relay_to_customer(delivery)
            case Reminder():
                return self._renderer().reminder(delivery)
            case CsatAsk(escalation_id=escalation_id, text=question):
                return csat_question(escalation_id, question)
            case FilesToStaff() | FilesToCustomer():
                return await self._renderer().files_as_text(delivery, why=self._not_shared)

    def _renderer(self) -> CaseRenderer:
        if self.cases is None:
            raise Undeliverable("no case renderer configured")
        return self.cases

    async def _change(self, delivery: Change, messenger: Messenger) -> None:
        """Act on a message that exists; safe to repeat, so no attempt is recorded first."""
        match delivery:
            case AddReaction(channel=channel, message=ts, name=name):
                await messenger.react(channel, ts, name, add=True)
            case RemoveReaction(channel=channel, message=ts, name=name):
                await messenger.react(channel, ts, name, add=False)
            case Typing(channel=channel, thread=thread):
                await messenger.typing(Where(channel, thread))
            case CaseUpdate(escalation_id=escalation_id):
                where = await self._renderer().case_thread(escalation_id)
                if where is not None:
                    await messenger.update(Where(where[0], None), where[1], await self._renderer().case(escalation_id))
            case RelayEdit(conversation_id=conversation_id, escalation_id=escalation_id, source=source):
                # No copy yet: the relay is still to go out, and it reads the words as they are now.
                copy = await self._relayed_copy(source)
                words = await self._renderer().staff_words(conversation_id, source)
                if copy is not None and words is not None:
                    place, ts, author = copy
                    relay = RelayToCustomer(conversation_id, escalation_id, place.channel, None, author, words, None)
                    shown = await self._renderer().relay_to_customer(relay)
                    await messenger.update(place, ts, shown or Message(relay_text(words)))
            case RelayDelete(source=source):
                copy = await self._relayed_copy(source)
                if copy is not None:
                    await messenger.delete(copy[0], copy[1])
            case StaffNotice(escalation_id=escalation_id, author=user, text=notice):
                where = await self._renderer().case_thread(escalation_id)
                if where is not None:
                    await messenger.notice(Where(*where), user, notice)
            case _:
                assert_never(delivery)

    async def _relayed_copy(self, source: str) -> tuple[Where, str, str | None] | None:
        """Where the copy of a colleague's message is and its id, once it was posted, and the colleague."""
        async with self.engine.connect() as conn:
            copy = (
                await conn.execute(
                    select(m.Outbox.channel, m.Outbox.thread_ts, m.Outbox.result_ts, m.Outbox.author).where(
                        m.Outbox.kind == RelayToCustomer.kind,
                        m.Outbox.source_ts == source,
                        m.Outbox.result_ts.is_not(None),
                    )
                )
            ).first()
        return None if copy is None else (Where(copy.channel, copy.thread_ts), copy.result_ts, copy.author)

    async def _attempt(self, row: Row[Any], key: int, *, uploaded: list[str] | None = None) -> bool:
        """Record the attempt before a post, only while this sender still holds the lease and nobody else has
        tried the row meanwhile: if the process dies waiting for Slack's answer, the next sender looks for the
        post first. Changes are safe to repeat and need no such record (one commit fewer each)."""
        async with self.engine.begin() as conn:
            done = await conn.execute(
                text(
                    "UPDATE outbox SET attempts = attempts + 1, attempted_at = now(), "
                    "uploaded = coalesce(CAST(:uploaded AS jsonb), uploaded) "
                    f"WHERE id = :id AND done_at IS NULL AND attempts = :seen AND {HOLDING_SEND_LEASE} "
                    "RETURNING id"
                ),
                {
                    "id": row.id,
                    "seen": row.attempts,
                    "k": key,
                    "o": self.owner,
                    "uploaded": None if uploaded is None else json.dumps(uploaded),
                },
            )
            return done.first() is not None

    async def _settled(self, row: Row[Any], key: int) -> None:
        """This sender's attempt at a post was answered "not posted": the row is no longer in doubt (only while
        this sender still holds the lease, so that no other sender's fresh attempt is forgotten)."""
        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    f"UPDATE outbox SET attempted_at = NULL WHERE id = :id AND done_at IS NULL AND {HOLDING_SEND_LEASE}"
                ),
                {"id": row.id, "k": key, "o": self.owner},
            )

    async def _backoff(self, row: Row[Any], error: str, *, delay: timedelta | None = None) -> None:
        """Try again later, this try counted once: a post's attempt is recorded before it is sent, anything else
        (a change, or a post that failed before its attempt, such as rendering it) is counted here."""
        delay = delay or timedelta(seconds=min(2 ** (row.attempts + 1), 300))
        log.warning("outbox row %s failed (%s); next try in %s", row.id, error, delay)
        tried = func.greatest(m.Outbox.attempts, row.attempts + 1)
        await self._mark(row.id, last_error=error, next_attempt_at=func.now() + delay, attempts=tried)

    async def _give_up(self, row: Row[Any], error: str, *, then: Sequence[Delivery] = ()) -> Outcome:
        """The row failed for good: its own state (never counted as sent), with `then` queued in the same
        transaction (what a person must hear instead)."""
        log.error("outbox row %s (%s) given up: %s", row.id, row.kind, error)
        await self._done(row, Outcome.GIVEN_UP, last_error=error, then=then)
        return Outcome.GIVEN_UP

    async def _done(self, row: Row[Any], outcome: Outcome, *, then: Sequence[Delivery] = (), **values: Any) -> Outcome:
        async with AsyncSession(self.engine) as s, s.begin():
            await s.execute(
                update(m.Outbox)
                .where(m.Outbox.id == row.id, m.Outbox.done_at.is_(None))
                .values(done_at=func.now(), outcome=str(outcome), **values)
            )
            await enqueue(s, then)
        return outcome

    async def _already_posted(self, row: Row[Any], where: Where, messenger: Messenger) -> str | None:
        """The id of this row's post if the platform has it."""
        return await messenger.find(where, outbox_id=row.id, since=row.created_at)

    async def _mark(self, row_id: int, **values: Any) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                update(m.Outbox).where(m.Outbox.id == row_id, m.Outbox.done_at.is_(None)).values(**values)
            )
