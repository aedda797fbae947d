"""The one sender: the only code that posts, edits, deletes or reacts, in any channel, for the bot's conversations and
cases; escalation renders what its messages show and posts nothing itself. The platforms' calls are a
`bot.channels.messenger.Messenger` each: a customer's rows go to the conversation's platform, a case's rows to the
staff channel's, so one conversation can be answered in Slack and handled by staff in Teams.

Per conversation, rows go out in id order under a send lease (`ledger`), so several bot processes never send one
conversation's rows concurrently, no connection is held while a platform answers, and a crashed sender's lease runs
out. The clients retry nothing by themselves. Every post (reply, case, relay, reminder) carries its outbox id, and
its attempt is committed before it is sent; a post whose attempt was recorded but never confirmed (the process died
waiting for the answer, the answer was lost, or the sender stalled past its lease) is looked for where it would be
by that id, and only posted if it is not there. Slack offers no idempotency key, so one gap stays: a process frozen
(SIGSTOP, a paused VM) between recording its attempt and writing the request, for longer than its lease, whose
request goes out after another sender has looked and posted. It is narrowed (a post whose attempt took more than
half a lease to record is not sent, and stays in doubt) and mended (a sender that finds its row recorded as posted
under another id deletes its own post); `python -m bench.fault_processes` freezes processes mid-send.

A channel that cannot find its posts (`Capabilities.finds_posts`: Teams' Bot Connector API reads no messages back)
never gets a post whose outcome is unknown again: it is given up, counted and shown to the admins (at most once). A
post the platform refused (429, or 503 with Retry-After) was not made, and is tried again after the wait (exactly
once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial

from sqlalchemy.ext.asyncio import AsyncEngine

from agents import personal
from agents.address import Address, Platform
from agents.db.deliveries import (
    AddReaction,
    Answer,
    CasePost,
    CaseUpdate,
    Delivery,
    Erase,
    FileRelay,
    FilesToStaff,
    NewMessage,
    Outcome,
    Post,
    RelayToStaff,
    Reminder,
    RemoveReaction,
    StaffNotice,
    Typing,
    delivery_of,
)
from agents.db.statements import Row
from agents.language import Language
from agents.leases import process_owner, renewing
from agents.markup.limits import MESSAGE_TEXT, clip
from agents.markup.text import escape
from agents.texts import Text, Texts
from bot.channels.capabilities import Channels
from bot.channels.messenger import FileFetcher, FileSharing, Messenger, Previewing, PreviewRef, Refused, Where
from bot.delivery.alerts import AdminAlerts, maybe_missing, posted_twice
from bot.delivery.ledger import FETCH_AHEAD, Ledger
from bot.delivery.messages import Messages, Undeliverable
from bot.delivery.owed import posts
from bot.delivery.pacing import Pacing
from bot.delivery.shares import Shares
from escalation.render import CaseRenderer
from escalation.views import Message, case_given_up, case_problem

log = logging.getLogger(__name__)

# Errors that no retry will mend: the row is given up at once (logged), so it never blocks its conversation.
TRANSIENT_ERRORS = frozenset({"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"})
"""Errors that say nothing about the call itself: tried again until `give_up_after`. Any other error answers the
call the same way every time, so it is given up after DETERMINISTIC_TRIES."""
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
"""The platform refused a message's layout, not the message: the words alone are posted instead."""
FIXABLE_BY_ADMINS = frozenset({"not_in_channel", "channel_not_found", "is_archived", "restricted_action"})
"""A case post refused for these waits (retried, the admins told) for `case_patience`: someone may invite the bot
or correct STAFF_CHANNEL_ID meanwhile."""
STAFF_SIDE = (CasePost, CaseUpdate, RelayToStaff, FilesToStaff, Reminder, StaffNotice)
"""Deliveries that go to the staff channel's platform, whatever the customer's."""


class OutboxSender:
    def __init__(
        self,
        *,
        engine: AsyncEngine,
        channels: Channels,
        messengers: Sequence[Messenger] = (),
        staff_platform: Platform | None = None,
        cases: CaseRenderer | None = None,
        give_up_after: timedelta = timedelta(hours=24),
        case_patience: timedelta = timedelta(minutes=10),
        admins: Mapping[Platform, frozenset[str]] | None = None,
        staff_channel: str | None = None,
        texts: Texts | None = None,
        hand_back: Callable[[int], Awaitable[object]] | None = None,
        owner: str = "",
        lease_s: float = 30.0,
        feedback_buttons: bool = True,
        files: FileFetcher | None = None,
    ) -> None:
        self.channels = channels
        self.ledger = Ledger(engine=engine, owner=owner or process_owner(), lease_s=lease_s)
        self.messengers: dict[str, Messenger] = {one.platform: one for one in messengers}
        """Each configured platform's calls, made by clients that retry nothing by themselves."""
        self.staff_platform = staff_platform or channels.default.platform
        """Where the staff channel is: cases, their updates, relays to staff, reminders and notices go there."""
        self.messages = Messages(
            ledger=self.ledger, cases=cases, files=files, feedback_buttons=feedback_buttons, texts=texts or Texts()
        )
        self.shares = None if files is None else Shares(ledger=self.ledger, messages=self.messages, files=files)
        """File relays where the channel shares files; None: only the files' names go."""
        self.give_up_after = give_up_after
        self.case_patience = case_patience
        """How long a case the staff channel refuses is tried again before the customer is told."""
        self.alerts = AdminAlerts(messengers=self.messengers, admins=admins or {})
        """Told by direct message when a case cannot be posted or a post may be missing."""
        self.staff_channel = staff_channel
        """Reactions there (a colleague's note marked 📝) go to the staff platform."""
        self.texts = texts
        """Its case-unreachable message is posted to the customer when their case could not be posted at all; None:
        nothing is."""
        self.hand_back = hand_back
        """Hands the conversation of a case that could not be posted back to the bot (the desk's transition)."""
        self.pacing = Pacing()

    async def send_pending(self, *, concurrency: int = 8, pace: Callable[[], Awaitable[None]] | None = None) -> int:
        """Send every due row of every conversation not being sent by someone else; returns rows sent. `pace`
        is awaited before each row (the workers hold sends back while the process is saturated)."""
        conversations = await self.ledger.due()
        if not conversations:
            return 0
        # The pass's conversations leased, and their rows read, in a statement each (not two per conversation).
        leased = await self.ledger.lease_each([cid or 0 for cid, _ in conversations])
        leased_at = time.monotonic()
        started: set[int] = set()
        limit = asyncio.Semaphore(concurrency)
        try:
            ahead = await self.ledger.unsent_of_each([cid for cid, _ in conversations if cid in leased])

            async def one(cid: int | None, key: str | None) -> int:
                async with limit:
                    started.add(cid or 0)
                    rows = ahead.get(cid, []) if cid is not None else None
                    return await self._send_leased(cid, self.channels.platform_of_key(key), rows, leased_at, pace)

            due = [(cid, key) for cid, key in conversations if (cid or 0) in leased]
            results = await asyncio.gather(*(one(*each) for each in due), return_exceptions=True)
        finally:
            # The rows could not be read, or the pass was cancelled: given back together (`Ledger.release`).
            unstarted = [self.ledger.release(key) for key in leased - started]
            await asyncio.gather(*unstarted, return_exceptions=True)
        for failure in (r for r in results if isinstance(r, BaseException)):
            log.error("outbox: sending a conversation failed", exc_info=failure)
        return sum(r for r in results if isinstance(r, int))

    async def _send_leased(
        self,
        conversation_id: int | None,
        platform: str,
        rows: Sequence[Row] | None,
        leased_at: float,
        pace: Callable[[], Awaitable[None]] | None = None,
    ) -> int:
        """Send the conversation's rows under the lease taken for it at `leased_at`; `rows`, its rows read then
        (None: read them now). `platform`: the customer's, where the conversation's own rows go."""
        key = conversation_id or 0
        sent = 0
        # Renewed in the background while rows go out, however long one takes (a case summary, a slow platform):
        # only a sender that is dead or frozen loses the lease.
        lost = asyncio.Event()
        try:
            if time.monotonic() - leased_at > self.ledger.lease_s / 3:
                # It waited its turn in the pass long enough for the lease to have lapsed, and another sender to
                # have sent its rows meanwhile: renewed (or taken again), and its rows read again under it.
                if not await self.ledger.lease(key):
                    return 0
                rows = None
            with renewing(lambda: self.ledger.lease(key), every_s=self.ledger.lease_s / 3, lost=lost):
                if rows is None:
                    rows = await self.ledger.unsent(conversation_id)
                while rows and not lost.is_set():
                    more = len(rows) == FETCH_AHEAD
                    rows = await self.ledger.without_pointless(rows, key)
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
                    if not progressed or not more:
                        # No read for rows queued meanwhile: each rings the sender (NOTIFY, the doorbell), whose next
                        # pass finds them, and a pass that sent anything is followed by another at once anyway.
                        break
                    rows = await self.ledger.unsent(conversation_id)
        finally:
            await self.ledger.release(key)
        return sent

    def _messenger(self, delivery: Delivery, customer_platform: str) -> Messenger:
        """The customer's platform for what the customer sees, the staff channel's for the case's side."""
        staff_side = isinstance(delivery, STAFF_SIDE) or (
            isinstance(delivery, AddReaction | RemoveReaction) and delivery.channel == self.staff_channel
        )
        platform = self.staff_platform if staff_side else customer_platform
        messenger = self.messengers.get(platform)
        if messenger is None:
            raise Undeliverable(f"{platform} is not configured")
        return messenger

    def _finds_posts(self, messenger: Messenger) -> bool:
        return self.channels.of(messenger.platform).capabilities.finds_posts

    async def _deliver(self, row: Row, key: int, platform: str) -> Outcome | None:
        """Send one row; None when it must wait (a transient failure, a lost lease), so later rows keep their
        order."""
        try:
            delivery = delivery_of(row._mapping)
        except ValueError as exc:
            return await self.ledger.give_up(row, str(exc))
        try:
            messenger = self._messenger(await self.messages.target(delivery), platform)
            if (
                isinstance(delivery, FileRelay)
                and self.channels.of(messenger.platform).capabilities.file_shares
                and isinstance(messenger, FileSharing)
                and self.shares is not None
            ):
                words_alone = partial(self._post_once, row, key, delivery, messenger)
                return await self.shares.share(row, key, delivery, messenger, words_alone=words_alone)
            if isinstance(delivery, NewMessage):
                return await self._post_once(row, key, delivery, messenger)
            await self.messages.change(delivery, messenger)
            return self.ledger.changed(row)
        except Undeliverable as exc:
            return await self.ledger.give_up(row, str(exc))
        except Refused as exc:
            error = exc.error
            if error == "ratelimited":  # waited out here, not in the client: no call outlives its lease unseen
                await self.ledger.backoff(row, error, delay=timedelta(seconds=exc.retry_after or 1))
                return None
            if (error, type(delivery)) in (
                ("already_reacted", AddReaction),
                ("no_reaction", RemoveReaction),
                ("message_not_found", Erase),  # gone already (a colleague deleted it, an earlier try did)
            ):
                return self.ledger.changed(row)
            if isinstance(delivery, AddReaction | RemoveReaction | StaffNotice | Typing):
                # A reaction or a notice is a courtesy (a deleted custom emoji, a restricted channel, a person who
                # left): it never holds the replies behind it.
                return await self.ledger.give_up(row, error)
            if isinstance(delivery, CasePost):
                return await self._case_failed(row, delivery, error, transient=error in TRANSIENT_ERRORS)
            tries = row.attempts + 1  # `row` was read before this try (a post's is counted in the table already)
            if (
                error in PERMANENT_ERRORS
                or (error not in TRANSIENT_ERRORS and tries >= DETERMINISTIC_TRIES)
                or datetime.now(UTC) - row.created_at > self.give_up_after
            ):
                return await self.ledger.give_up(row, error)
            await self.ledger.backoff(row, error)
            return None
        except Exception as exc:  # connection failures, lost answers and timeouts: tried again after a backoff
            if isinstance(delivery, Typing):  # stale within seconds: it never holds the reply behind it
                return await self.ledger.give_up(row, repr(exc))
            if isinstance(delivery, CasePost):
                return await self._case_failed(row, delivery, repr(exc), transient=True)
            if datetime.now(UTC) - row.created_at > self.give_up_after:  # nothing holds a conversation for good
                return await self.ledger.give_up(row, repr(exc))
            await self.ledger.backoff(row, repr(exc))
            return None

    async def _post_once(self, row: Row, key: int, delivery: NewMessage, messenger: Messenger) -> Outcome | None:
        """Post a new message, unless an earlier attempt at this row is found where it would be; None when the
        attempt could not be recorded (the lease went to another sender, who goes on from this row)."""
        where = await self.messages.where(delivery)
        in_doubt = row.attempted_at is not None  # an attempt whose answer never came
        if in_doubt and not self._finds_posts(messenger):
            if isinstance(delivery, CasePost):
                # As a case nobody could post: the customer is told and answered by the bot again (a card that
                # did reach the channel shows a case already handed back).
                return await self._case_given_up(row, delivery, f"outcome unknown ({row.last_error or 'no answer'})")
            return await self._unknowable(row, delivery)
        # A post in doubt is looked for first, and may be the preview's finish; any other reads the open preview
        # with its attempt (one round trip fewer).
        preview = await self._preview_for(row, delivery, messenger, where) if in_doubt else None
        ts = await messenger.find(where, outbox_id=row.id, since=row.created_at) if in_doubt else None
        finished = preview is not None and ts is not None and ts == preview.stream_id
        if ts is None:
            if in_doubt and await self._forgotten(row):
                # Its words were erased while it was being sent, and it did not go out: nothing is left to send.
                return await self.ledger.done(row, Outcome.SKIPPED, last_error="its person was forgotten")
            message = await self.messages.render(delivery, Language.parse(row.spoken_language))
            if message is None:
                return await self.ledger.done(row, Outcome.SKIPPED, last_error="deleted before it was relayed")
            if (wait_s := self.pacing.turn_in(messenger.platform, where.channel, row.id)) > 0:
                # Waiting for its turn is not a try: neither counted nor an error.
                await self.ledger.wait(row, timedelta(seconds=wait_s))
                return None
            recording = time.monotonic()
            asks = not in_doubt and self._may_finish_preview(delivery, messenger)
            attempt = await self.ledger.attempt(row, key, preview=asks)
            if attempt is None:
                return None
            if asks:
                preview = self._finishes(delivery, messenger, where, attempt.preview, attempt.answer_follows)
            if time.monotonic() - recording > self.ledger.lease_s / 2 and not await self.ledger.still_ours(row, key):
                # Frozen (SIGSTOP, a paused VM) or starved since the attempt was recorded, and the lease or the row
                # has moved on: another sender may have looked, found nothing and posted. Not sending narrows the
                # gap the module's docstring admits; the row stays in doubt, so the next try looks first.
                late_s = time.monotonic() - recording
                log.warning("outbox row %s: %.1f s passed recording its attempt; not sent", row.id, late_s)
                return None
            try:
                try:
                    if preview is not None and isinstance(messenger, Previewing):
                        ts = await messenger.finish_preview(preview, where, message, outbox_id=row.id)
                        finished = True
                    else:
                        ts = await messenger.post(where, message, outbox_id=row.id)
                except Refused as exc:
                    if not (message.blocks and exc.error in LAYOUT_ERRORS):
                        raise
                    # The platform refused the layout, so nothing was posted: the same attempt posts the words alone.
                    log.warning("outbox row %s: its layout was refused (%s); posting it as text", row.id, exc)
                    ts = await messenger.post(where, Message(clip(message.text, MESSAGE_TEXT)), outbox_id=row.id)
            except Refused as exc:
                if exc.error == "ratelimited":
                    self.pacing.refused(messenger.platform, where.channel, exc.retry_after or 1.0)
                if exc.certain:  # the platform said it posted nothing: no post is in doubt, the next try need not look
                    await self.ledger.settled(row, key)
                raise
        if not isinstance(delivery, CasePost):
            # Claimed and done in one statement (and the preview it finished closed with it).
            closes = preview.id if preview is not None and finished else None
            await self._claim_post(row, where, ts, messenger, done=True, preview=closes)
            return Outcome.SENT
        # A case's card is claimed first and the row done once the case knows where it is (a crash in between
        # finds the claimed card where it would look).
        if await self._claim_post(row, where, ts, messenger, done=False):
            await self.messages.renderer().case_posted(delivery.escalation_id, channel=where.channel, ts=ts)
            await self.ledger.done(row, Outcome.SENT, result_ts=ts)
        return Outcome.SENT

    async def _forgotten(self, row: Row) -> bool:
        found = await self.ledger.conversation_key(row.conversation_id) if row.conversation_id is not None else None
        return found is not None and personal.is_forgotten(found[0])

    async def _preview_for(
        self, row: Row, delivery: NewMessage, messenger: Messenger, where: Where
    ) -> PreviewRef | None:
        """The open preview this message finishes in place: the conversation's, in the customer's thread, where the
        channel streams. The turn's answer finishes it; a notice only when no answer follows it (an escalation's,
        whose words stand where the model had begun to write)."""
        if not self._may_finish_preview(delivery, messenger):
            return None
        preview = await self.ledger.open_preview(row)
        follows = preview is not None and not _is_answer(delivery) and await self.ledger.answer_follows(row)
        return self._finishes(delivery, messenger, where, preview, follows)

    def _may_finish_preview(self, delivery: NewMessage, messenger: Messenger) -> bool:
        return (
            isinstance(delivery, Answer | Post)
            and isinstance(messenger, Previewing)
            and self.channels.of(messenger.platform).capabilities.streaming
        )

    @staticmethod
    def _finishes(
        delivery: NewMessage, messenger: Messenger, where: Where, preview: PreviewRef | None, answer_follows: bool
    ) -> PreviewRef | None:
        """`preview` (the conversation's open one) if this message finishes it: it is where the message goes (the
        customer's thread), and the message is the answer, or a notice no answer follows."""
        if preview is None or (preview.platform, preview.channel, preview.thread) != (
            messenger.platform,
            where.channel,
            where.thread,
        ):
            return None
        if not _is_answer(delivery) and answer_follows:
            return None  # a handoff's notice: the answer after it takes the place the customer watched
        return preview

    async def _claim_post(
        self, row: Row, where: Where, ts: str, messenger: Messenger, *, done: bool, preview: int | None = None
    ) -> bool:
        """Record `ts` as this row's post (`Ledger.claim`); False when another post is recorded for it already: this
        one is a second (the gap the module's docstring admits: this sender was frozen past its lease after
        recording its attempt, and the next one looked, found nothing and posted), and is deleted."""
        first = await self.ledger.claim(row, ts, done=done, preview=preview)
        if first is None:
            return True
        log.warning("outbox row %s posted twice (%s, %s): deleting the second", row.id, first, ts)
        try:
            await messenger.delete(where, ts)
        except Exception as exc:  # the second post stands: shown to the admins, not only logged
            log.error("outbox row %s: its second post %s could not be deleted: %r", row.id, ts, exc)
            await self.alerts.tell(posted_twice(conversation_id=row.conversation_id, row_id=row.id, ts=ts, error=exc))
        return False

    async def _unknowable(self, row: Row, delivery: NewMessage) -> Outcome:
        """A post whose outcome is unknown on a channel that cannot find its posts: posting it again could show it
        twice, so it is given up, counted, and the admins are told what may be missing."""
        error = f"outcome unknown ({row.last_error or 'no answer'}); not posted again"
        staff_side = isinstance(delivery, CasePost | RelayToStaff | FilesToStaff | Reminder)
        reader = "the staff channel" if staff_side else "the customer"
        await self.alerts.tell(
            maybe_missing(
                conversation_id=row.conversation_id, kind=delivery.kind, row_id=row.id, reader=reader, error=error
            )
        )
        return await self.ledger.give_up(row, error)

    async def _case_failed(self, row: Row, case: CasePost, error: str, *, transient: bool) -> Outcome | None:
        """A case the staff channel would not take. The admins hear at once (most such failures are theirs to
        fix: invite the bot, correct STAFF_CHANNEL_ID); it is tried again while that can help (at least
        DETERMINISTIC_TRIES times, and for `case_patience`); given up, the admins get the case itself, the customer
        is told that nobody could be reached yet, and the conversation goes back to the bot."""
        tries = row.attempts + 1
        patient = datetime.now(UTC) - row.created_at <= self.case_patience
        hopeless = not transient and error not in FIXABLE_BY_ADMINS
        if tries < DETERMINISTIC_TRIES or (patient and not hopeless):
            await self.ledger.backoff(row, error)
            if row.last_error is None:  # its first failure
                await self.alerts.tell(case_problem(case.escalation_id, case.channel, escape(error)))
            return None
        messenger = self.messengers.get(self.staff_platform)
        if (transient or row.attempted_at is not None) and messenger is not None and self._finds_posts(messenger):
            # The last answer may have been lost: the case may be there after all.
            with contextlib.suppress(Exception):
                where = Where(case.channel, None)
                if (ts := await messenger.find(where, outbox_id=row.id, since=row.created_at)) is not None:
                    await self.messages.renderer().case_posted(case.escalation_id, channel=case.channel, ts=ts)
                    return await self.ledger.done(row, Outcome.SENT, result_ts=ts)
        return await self._case_given_up(row, case, error)

    async def _case_given_up(self, row: Row, case: CasePost, error: str) -> Outcome:
        try:
            text = (await self.messages.renderer().case(case.escalation_id)).text
        except Exception:  # what failed may be the rendering itself
            text = f"Case #{case.escalation_id}"
        await self.alerts.tell(case_given_up(case.escalation_id, escape(error), text))
        notice: list[Delivery] = []
        found = await self.ledger.conversation_key(case.conversation_id) if self.texts is not None else None
        if self.texts is not None and found is not None and (address := Address.parse(found[0])) is not None:
            customer = self.channels.of(address.platform)
            if said := self.texts.get(Text.CASE_UNREACHABLE_MESSAGE, found[1]):
                notice = [*posts(customer, conversation_id=case.conversation_id, address=address, body=said)]
        outcome = await self.ledger.give_up(row, error, then=notice)
        if self.hand_back is not None:
            # Still with "a person", the customer's next messages would be relayed to a case thread that does
            # not exist: the bot answers them instead.
            await self.hand_back(case.escalation_id)
        return outcome


def _is_answer(delivery: NewMessage) -> bool:
    return isinstance(delivery, Answer) or (isinstance(delivery, Post) and delivery.answer)
