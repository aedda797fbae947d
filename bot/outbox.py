"""The outbox: Web API calls owed to Slack, written in the transaction that caused them, sent exactly once.

Per conversation, rows go out in id order under a send lease (`send_leases`: owner and expiry, claimed and
renewed in short statements), so several bot processes never send one conversation's rows concurrently, no
connection is held while Slack answers, and a crashed sender's lease runs out. Before a post, its attempt is
committed; a post whose attempt was recorded but never confirmed (the process died waiting for Slack's answer,
or stalled past its lease) is looked for in the thread by the outbox id carried in its message metadata, and
only posted if it is not there. What this cannot cover: a process frozen (SIGSTOP, a paused VM) between recording
its attempt and writing the request, for longer than its lease, whose request then goes out after another
sender has looked and posted; Slack offers no idempotency key to close that gap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from agents.address import Address
from agents.agent import Roster
from agents.conversations import TurnCommit
from agents.leases import keep_renewed, process_owner
from bot.mrkdwn import split_text, to_mrkdwn
from db import models as m
from escalation.delivery import KINDS as ESCALATION_KINDS
from escalation.delivery import POSTING_KINDS, THREADED_IN_CASE, CaseDelivery
from escalation.policy import EscalationPolicy

log = logging.getLogger(__name__)

METADATA_TYPE = "helpdesk_outbox"
_REACTION_OK = {"react_add": "already_reacted", "react_remove": "no_reaction"}


@dataclass(frozen=True)
class ReplyStyle:
    handoff_notice: str = "_Connecting you with {agent}…_"
    """Shown to the customer on each handoff; `{agent}` is the agent's title. Empty: no notice."""
    working_reaction: str = "eyes"
    done_reaction: str = "white_check_mark"


def post_row(*, conversation_id: int, channel: str, thread_ts: str | None, body: str) -> list[dict[str, Any]]:
    return [
        {"conversation_id": conversation_id, "kind": "post", "channel": channel, "thread_ts": thread_ts, "text": part}
        for part in split_text(to_mrkdwn(body))
    ]


def reaction_row(*, conversation_id: int, kind: str, channel: str, ts: str, name: str) -> dict[str, Any]:
    return {"conversation_id": conversation_id, "kind": kind, "channel": channel, "target_ts": ts, "reaction": name}


def turn_outbox(
    roster: Roster,
    style: ReplyStyle,
    policy: EscalationPolicy,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Callable[[AsyncSession, TurnCommit], Awaitable[None]]:
    """The engine's after_turn hook: what Slack should see of a turn (the customer's replies, the case for
    staff, relays both ways), queued in the turn's own transaction."""

    async def enqueue(s: AsyncSession, commit: TurnCommit) -> None:
        address = Address.parse(commit.key)
        if address is None:
            return
        channel, thread_ts = address.channel, address.thread
        cid, result = commit.conversation_id, commit.result
        rows: list[dict[str, Any]] = []
        if style.handoff_notice:
            for handoff in result.handoffs:
                notice = style.handoff_notice.format(agent=roster.get(handoff.to_agent).title)
                rows += post_row(conversation_id=cid, channel=channel, thread_ts=thread_ts, body=notice)
        escalation = {"conversation_id": cid, "escalation_id": result.escalation_id, "author": commit.author}
        staff_channel = policy.staff_channel or ""
        if result.kind == "staff":
            rows.append(
                escalation
                | {
                    "kind": "relay_to_customer",
                    "channel": channel,
                    "thread_ts": thread_ts,
                    "text": to_mrkdwn(commit.text),
                    "source_ts": commit.external_id,
                }
            )
            rows.append(escalation | {"kind": "update_case", "channel": staff_channel})
        elif result.reply:
            rows += post_row(conversation_id=cid, channel=channel, thread_ts=thread_ts, body=result.reply)
        if result.kind == "escalated" and policy.staff_channel:
            if policy.hours is not None and not policy.hours.is_open(clock()):
                notice = policy.off_hours_message.format(hours=policy.hours.label)
                rows += post_row(conversation_id=cid, channel=channel, thread_ts=thread_ts, body=notice)
            rows.append(escalation | {"kind": "case", "channel": staff_channel})
        if result.kind == "human" and result.escalation_id and policy.staff_channel:
            rows.append(escalation | {"kind": "relay_to_staff", "channel": staff_channel, "text": commit.text})
        if commit.external_id and result.kind != "staff":
            ts = commit.external_id
            done = (style.working_reaction, "react_remove"), (style.done_reaction, "react_add")
            rows += [
                reaction_row(conversation_id=cid, kind=kind, channel=channel, ts=ts, name=name)
                for name, kind in done
                if name and (kind == "react_remove" or result.kind != "human")
            ]
        if rows:
            # render_nulls: rows of different kinds set different columns; still one INSERT.
            await s.execute(insert(m.Outbox).execution_options(render_nulls=True), [_full(r) for r in rows])

    return enqueue


_COLUMNS = (
    "conversation_id",
    "kind",
    "channel",
    "thread_ts",
    "target_ts",
    "text",
    "reaction",
    "escalation_id",
    "author",
    "source_ts",
)


def _full(row: dict[str, Any]) -> dict[str, Any]:
    return {column: row.get(column) for column in _COLUMNS}


# Errors that no retry will mend: the row is given up at once (logged), so it never blocks its conversation.
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


class OutboxSender:
    def __init__(
        self,
        *,
        engine: AsyncEngine,
        client: AsyncWebClient,
        cases: CaseDelivery | None = None,
        give_up_after: timedelta = timedelta(hours=24),
        owner: str = "",
        lease_s: float = 30.0,
    ) -> None:
        self.engine = engine
        self.owner = owner or process_owner()
        self.lease_s = lease_s
        """How long a send lease lasts unrenewed: a crashed sender's conversations wait this long."""
        self.cases = cases
        self.client = client
        """Should retry only 429s by itself: a post retried after a connection error inside the SDK could land
        twice, while one retried here is first looked for in the thread."""
        self.give_up_after = give_up_after

    async def send_pending(self, *, concurrency: int = 8) -> int:
        """Send every due row of every conversation not being sent by someone else; returns rows sent."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(m.Outbox.conversation_id)
                .where(m.Outbox.sent_at.is_(None))
                .group_by(m.Outbox.conversation_id)
                .order_by(func.min(m.Outbox.id))
                .limit(200)
            )
            conversations = [r[0] for r in rows]
        limit = asyncio.Semaphore(concurrency)

        async def one(cid: int | None) -> int:
            async with limit:
                return await self._send_conversation(cid)

        results = await asyncio.gather(*(one(cid) for cid in conversations), return_exceptions=True)
        for failure in (r for r in results if isinstance(r, BaseException)):
            log.error("outbox: sending a conversation failed", exc_info=failure)
        return sum(r for r in results if isinstance(r, int))

    async def _send_conversation(self, conversation_id: int | None) -> int:
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
                    row = (
                        await conn.execute(
                            select(m.Outbox)
                            .where(m.Outbox.conversation_id.is_not_distinct_from(conversation_id))
                            .where(m.Outbox.sent_at.is_(None))
                            .order_by(m.Outbox.id)
                            .limit(1)
                        )
                    ).first()
                if row is None or (row.next_attempt_at and row.next_attempt_at > datetime.now(UTC)):
                    break  # nothing left, or the head waits out its backoff and the rest wait behind it
                if not await self._deliver(row, key):
                    break
                sent += 1
        finally:
            keeper.cancel()
            async with self.engine.begin() as conn:
                await conn.execute(
                    text("DELETE FROM send_leases WHERE conversation_id = :k AND owner = :o"),
                    {"k": key, "o": self.owner},
                )
        return sent

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

    async def _deliver(self, row: Row[Any], key: int) -> bool:
        """Send one row; False when it must wait (a transient failure), so later rows keep their order."""
        try:
            if row.kind in THREADED_IN_CASE and row.thread_ts is None:
                row = await self._into_case_thread(row)
            posting = row.kind == "post" or row.kind in POSTING_KINDS
            found_ts = await self._already_posted(row) if posting and row.attempts > 0 else None
            if found_ts is not None:
                await self._sent(row, found_ts)
                return True
            if posting and not await self._attempt(row, key):
                return False  # the lease went to another sender, who goes on from this row
            result_ts = await self._call(row)
        except SlackApiError as exc:
            error = str(exc.response.get("error") or exc)
            if error == "ratelimited":  # waited out here, not in the client: no call outlives its lease unseen
                retry_after = float(exc.response.headers.get("Retry-After", 1) or 1)
                await self._backoff(row, error, delay=timedelta(seconds=retry_after))
                return False
            if error == _REACTION_OK.get(row.kind):
                result_ts = None
            elif error in PERMANENT_ERRORS or datetime.now(UTC) - row.created_at > self.give_up_after:
                log.error("outbox row %s given up: %s", row.id, error)
                await self._mark(row.id, sent_at=func.now(), last_error=f"gave up: {error}")
                return True
            else:
                await self._backoff(row, error)
                return False
        except Exception as exc:  # connection failures and timeouts: tried again after a backoff
            await self._backoff(row, repr(exc))
            return False
        await self._sent(row, result_ts)
        return True

    async def _sent(self, row: Row[Any], ts: str | None) -> None:
        if self.cases is not None and ts is not None:
            await self.cases.posted(row, ts)
        posting = row.kind == "post" or row.kind in POSTING_KINDS
        counted = {} if posting else {"attempts": m.Outbox.attempts + 1}
        await self._mark(row.id, sent_at=func.now(), result_ts=ts, **counted)

    async def _into_case_thread(self, row: Row[Any]) -> Row[Any]:
        """Relays and reminders go to the case's thread, known only once the case message is out; it always is
        by now, since it was queued earlier in the same conversation."""
        where = None if self.cases is None else await self.cases.case_thread(row.escalation_id)
        if where is None:
            raise SlackApiError("no case thread", {"ok": False, "error": "thread_not_found"})  # type: ignore[no-untyped-call]
        await self._mark(row.id, channel=where[0], thread_ts=where[1])
        async with self.engine.connect() as conn:
            refreshed = (await conn.execute(select(m.Outbox).where(m.Outbox.id == row.id))).first()
        assert refreshed is not None
        return refreshed

    async def _attempt(self, row: Row[Any], key: int) -> bool:
        """Record the attempt before a post, only while this sender still holds the lease and nobody else has
        tried the row meanwhile: if the process dies waiting for Slack's answer, the next sender looks for the
        post first. Reactions are idempotent and need no such record (one commit fewer each)."""
        async with self.engine.begin() as conn:
            done = await conn.execute(
                text(
                    "UPDATE outbox SET attempts = attempts + 1, attempted_at = now() "
                    "WHERE id = :id AND sent_at IS NULL AND attempts = :seen AND EXISTS ("
                    "SELECT 1 FROM send_leases WHERE conversation_id = :k AND owner = :o AND until > now()) "
                    "RETURNING id"
                ),
                {"id": row.id, "seen": row.attempts, "k": key, "o": self.owner},
            )
            return done.first() is not None

    async def _backoff(self, row: Row[Any], error: str, *, delay: timedelta | None = None) -> None:
        delay = delay or timedelta(seconds=min(2 ** (row.attempts + 1), 300))
        log.warning("outbox row %s failed (%s); next try in %s", row.id, error, delay)
        counted = {} if row.kind == "post" or row.kind in POSTING_KINDS else {"attempts": m.Outbox.attempts + 1}
        await self._mark(row.id, last_error=error, next_attempt_at=func.now() + delay, **counted)

    async def _call(self, row: Row[Any]) -> str | None:
        match row.kind:
            case "post":
                response = await self.client.chat_postMessage(
                    channel=row.channel,
                    thread_ts=row.thread_ts,
                    text=row.text,
                    metadata={"event_type": METADATA_TYPE, "event_payload": {"outbox_id": row.id}},
                )
                return str(response["ts"])
            case "react_add":
                await self.client.reactions_add(channel=row.channel, timestamp=row.target_ts, name=row.reaction)
            case "react_remove":
                await self.client.reactions_remove(channel=row.channel, timestamp=row.target_ts, name=row.reaction)
            case kind if self.cases is not None and kind in ESCALATION_KINDS:
                return await self.cases.send(row)
            case _:
                raise ValueError(f"unknown outbox kind {row.kind}")
        return None

    async def _already_posted(self, row: Row[Any]) -> str | None:
        """The ts of this row's post if Slack has it: searched from a minute before the row was written, so
        long threads are not read from their start."""
        oldest = f"{row.created_at.timestamp() - 60:.6f}"
        if row.thread_ts:
            response = await self.client.conversations_replies(
                channel=row.channel, ts=row.thread_ts, oldest=oldest, include_all_metadata=True, limit=200
            )
        else:
            response = await self.client.conversations_history(
                channel=row.channel, oldest=oldest, include_all_metadata=True, limit=200
            )
        for message in response.get("messages") or []:
            metadata = message.get("metadata") or {}
            payload = metadata.get("event_payload") or {}
            if metadata.get("event_type") == METADATA_TYPE and payload.get("outbox_id") == row.id:
                return str(message["ts"])
        return None

    async def _mark(self, row_id: int, **values: Any) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                update(m.Outbox).where(m.Outbox.id == row_id, m.Outbox.sent_at.is_(None)).values(**values)
            )
