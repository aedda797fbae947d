"""What the sender records of the outbox's rows, each write in a short statement of its own: a conversation's send
lease, a post's attempt before it is sent, the post's id claimed for its row, the row's outcome. Writes that are
valid only while this sender holds the conversation's lease say so in their SQL (`HOLDING_SEND_LEASE`), so that a
sender that lost it (crashed, frozen, starved) changes nothing another one has gone on with.

The sender runs several statements per customer message: each is built once (`agents.db.statements`), and one that
is a transaction by itself runs alone (autocommit: one round trip, not BEGIN, it, COMMIT)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from agents.db import models as m
from agents.db.deliveries import (
    AddReaction,
    Delivery,
    NewMessage,
    Outcome,
    RelayToCustomer,
    RemoveReaction,
    delivery_of,
    enqueue,
)
from agents.db.statements import Row, Statement, alone
from agents.language import Language
from bot.channels.messenger import PreviewRef, Where

log = logging.getLogger(__name__)

FETCH_AHEAD = 20
"""Rows of one conversation read at once (in order; only this sender, holding the lease, sends them)."""
HOLDING_SEND_LEASE = "EXISTS (SELECT FROM send_leases WHERE conversation_id = :k AND owner = :o AND until > now())"
"""A write by a sender (`:o`) that is valid only while it holds the conversation's (`:k`) send lease."""
_CLAIM = Statement(
    "UPDATE outbox SET result_ts = :ts WHERE id = :id AND (result_ts IS NULL OR result_ts = :ts) RETURNING id"
)
_CLAIM_AND_DONE = Statement(
    "UPDATE outbox SET result_ts = :ts, done_at = coalesce(done_at, now()), "
    f"outcome = coalesce(outcome, '{Outcome.SENT}') "
    "WHERE id = :id AND (result_ts IS NULL OR result_ts = :ts) RETURNING id"
)
"""A post's id claimed for its row (`Ledger.claim`); the second also marks the row sent, unless it already ended."""
_OPEN_PREVIEW = Statement(
    "SELECT id, platform, channel, thread, stream_id, shown, started_at, shown_at FROM previews "
    "WHERE conversation_id = :c AND state = 'open' AND started_at <= :before"
)
"""The conversation's open preview, if a run began it before the row was written (a later run's preview is its
own answer's to finish)."""
_CLOSE_PREVIEW = Statement("UPDATE previews SET state = 'finished' WHERE id = :id")
GROUNDED = "jsonb_typeof({o}.sources) = 'array'"
"""An answer's row (`agents.db.deliveries.row_of`: its sources, if only an empty list); `sources` is NULL for any
other, or JSON's null where an older version wrote it through SQLAlchemy."""
_ANSWER_FOLLOWS = Statement(
    "SELECT EXISTS (SELECT FROM outbox WHERE conversation_id = :c AND id > :id AND created_at = :t"
    f" AND kind IN ('answer', 'post') AND {GROUNDED.format(o='outbox')})"
)
"""An agent's answer queued after this row in the same transaction (the same turn): a notice before it (a handoff's
"Connecting you with...") leaves the preview to the answer."""
DUE_BATCH = 200
"""Conversations taken in one pass."""
_DUE_CONVERSATIONS = Statement(
    """
    WITH RECURSIVE heads AS (
        (SELECT conversation_id, id, next_attempt_at FROM outbox
         WHERE done_at IS NULL AND conversation_id > :after ORDER BY conversation_id, id LIMIT 1)
        UNION ALL
        SELECT later.* FROM heads CROSS JOIN LATERAL (
            SELECT conversation_id, id, next_attempt_at FROM outbox
            WHERE done_at IS NULL AND conversation_id > heads.conversation_id ORDER BY conversation_id, id LIMIT 1
        ) later
    ), due AS (
        (SELECT * FROM heads WHERE next_attempt_at IS NULL OR next_attempt_at <= now() LIMIT :n)
        UNION ALL
        (SELECT conversation_id, id, next_attempt_at FROM outbox
         WHERE done_at IS NULL AND conversation_id IS NULL ORDER BY id LIMIT 1)
    )
    SELECT due.conversation_id, conversations.key FROM due
    LEFT JOIN conversations ON conversations.id = due.conversation_id
    WHERE due.next_attempt_at IS NULL OR due.next_attempt_at <= now()
    ORDER BY due.id
    """
)
"""Conversations whose next row is due, oldest first, with their keys (which name the customer's platform), and the
rows of no conversation's if their first is due. Each conversation's head is one probe of
`ix_outbox_unsent_by_conversation` (a loose index scan: the recursion goes from one conversation to the next, and
stops once `:n` are due), so a pass reads what it returns, however long the conversations' queues. Ones waiting
out a backoff (their later rows wait behind it, in order) take no place in the batch, so a pile of them never
starves a healthy conversation; a full batch's pass is followed by one beginning after its last conversation
(`:after`), so the conversations past it are not starved either."""
_COLUMNS = ", ".join(f"outbox.{column.name}" for column in m.Outbox.__table__.columns)
"""Every column of `outbox`, as `delivery_of` reads a row."""
_UNSENT_SQL = (
    f"SELECT {_COLUMNS}, conversations.language AS spoken_language FROM outbox "
    "LEFT OUTER JOIN conversations ON conversations.id = outbox.conversation_id "
    "WHERE outbox.conversation_id {match} AND outbox.done_at IS NULL ORDER BY outbox.id "
    f"LIMIT {FETCH_AHEAD}"
)
# The rows of no conversation in a statement of their own (`IS NOT DISTINCT FROM` would serve no index): a
# conversation's rows are an index range (`ix_outbox_unsent_by_conversation`), the few of none another.
_UNSENT_ORPHANS = Statement(_UNSENT_SQL.replace("{match}", "IS NULL"))
_UNSENT_OF_EACH = Statement(
    f"""
    SELECT {_COLUMNS.replace("outbox.", "o.")}, conversations.language AS spoken_language
    FROM unnest(CAST(:ids AS bigint[])) AS due(id)
    CROSS JOIN LATERAL (
        SELECT * FROM outbox WHERE outbox.conversation_id = due.id AND outbox.done_at IS NULL
        ORDER BY outbox.id LIMIT {FETCH_AHEAD}
    ) o
    LEFT OUTER JOIN conversations ON conversations.id = o.conversation_id
    ORDER BY o.id
    """
)
"""The next rows (at most FETCH_AHEAD) of each conversation, in one statement: each one's range of the index."""
_LEASE_EACH = Statement(
    "INSERT INTO send_leases (conversation_id, owner, until) "
    "SELECT k, :o, now() + make_interval(secs => :ttl) FROM unnest(CAST(:keys AS bigint[])) AS k ORDER BY k "
    "ON CONFLICT (conversation_id) DO UPDATE SET owner = :o, until = EXCLUDED.until "
    "WHERE send_leases.owner = :o OR send_leases.until < now() RETURNING conversation_id"
)
"""The send leases of conversations claimed or renewed, in one statement, in key order: two senders leasing
overlapping sets wait for each other's rows in the same order, and never deadlock."""
_MARK_CHANGED = (
    f"UPDATE outbox SET done_at = now(), outcome = '{Outcome.SENT}', attempts = attempts + 1 "
    "WHERE id = ANY(CAST(:changed AS bigint[])) AND done_at IS NULL"
)
"""Changes (a reaction, an edit, a deletion) made, or found made already: the rows sent, their one try counted. A
statement of its own (`_CHANGED`), or a part of the one that releases the lease or records a post's attempt."""
_RELEASE = Statement(
    f"""
    WITH changed AS ({_MARK_CHANGED})
    , mine AS (
        SELECT conversation_id FROM send_leases WHERE conversation_id = ANY(CAST(:keys AS bigint[])) AND owner = :o
        ORDER BY conversation_id FOR UPDATE
    )
    DELETE FROM send_leases USING mine WHERE send_leases.conversation_id = mine.conversation_id
    """,
    returns_rows=False,
)
"""The leases given back, locked in key order first as `_LEASE_EACH` takes them (a DELETE locks in the order it
finds rows, and two senders locking in different orders deadlock), and the changes made under them marked done."""
_ATTEMPT = Statement(
    f"""
    WITH changed AS ({_MARK_CHANGED}), attempted AS (
        UPDATE outbox SET attempts = attempts + 1, attempted_at = now(),
            uploaded = coalesce(CAST(:uploaded AS jsonb), uploaded)
        WHERE id = :id AND done_at IS NULL AND attempts = :seen AND {HOLDING_SEND_LEASE}
        RETURNING id, conversation_id, created_at
    )
    SELECT attempted.id, p.id AS preview_id, p.platform, p.channel, p.thread, p.stream_id, p.shown, p.started_at,
        p.shown_at,
        p.id IS NOT NULL AND EXISTS (
            SELECT FROM outbox o WHERE o.conversation_id = attempted.conversation_id AND o.id > attempted.id
            AND o.created_at = attempted.created_at AND o.kind IN ('answer', 'post') AND {GROUNDED.format(o="o")}
        ) AS answer_follows
    FROM attempted LEFT JOIN previews p ON CAST(:preview AS boolean) AND p.conversation_id = attempted.conversation_id
        AND p.state = 'open' AND p.started_at <= attempted.created_at
    """
)
"""A post's attempt, recorded before it is made; the changes made before it in the pass marked done, so that none
waits for the lease's release across a slow post; and, if asked, the open preview the post may finish (as
`_OPEN_PREVIEW` reads it) and whether an answer follows the post (`_ANSWER_FOLLOWS`), in the same round trip:
nothing is read between the attempt and the post, whose failure would leave a post in doubt that was never made."""
_SETTLED = Statement(
    f"UPDATE outbox SET attempted_at = NULL WHERE id = :id AND done_at IS NULL AND {HOLDING_SEND_LEASE}"
)
_STILL_OURS = Statement(
    f"SELECT id FROM outbox WHERE id = :id AND done_at IS NULL AND attempts = :n AND {HOLDING_SEND_LEASE}"
)
_CLAIMED = Statement("SELECT result_ts FROM outbox WHERE id = :id")
_CHANGED = Statement(_MARK_CHANGED)
_DONE = Statement(
    "UPDATE outbox SET done_at = now(), outcome = :outcome, result_ts = coalesce(:result_ts, result_ts), "
    "last_error = coalesce(:last_error, last_error) WHERE id = :id AND done_at IS NULL"
)
_WAIT = Statement(
    "UPDATE outbox SET next_attempt_at = now() + CAST(:delay AS interval) WHERE id = :id AND done_at IS NULL"
)
_BACKOFF = Statement(
    "UPDATE outbox SET last_error = :error, next_attempt_at = now() + CAST(:delay AS interval), "
    "attempts = greatest(attempts, :tried) WHERE id = :id AND done_at IS NULL"
)
"""Tried again after `:delay`, this try counted once (`Ledger.backoff`)."""
_SKIP_PAIRS = Statement(
    f"""
    UPDATE outbox SET done_at = now(), outcome = 'skipped', last_error = 'removed before it was added'
    WHERE id = ANY(:ids) AND done_at IS NULL
      AND (SELECT count(*) FROM outbox WHERE id = ANY(:ids) AND done_at IS NULL AND attempts = 0) = :n
      AND {HOLDING_SEND_LEASE}
    RETURNING id
    """
)
_RELAYED_COPY = Statement(
    f"SELECT channel, thread_ts, result_ts, author FROM outbox WHERE kind = '{RelayToCustomer.kind}' "
    "AND source_ts = :source AND result_ts IS NOT NULL"
)
_POST = Statement(f"SELECT {_COLUMNS} FROM outbox WHERE id = :id")
_CONVERSATION_KEY = Statement("SELECT key, language FROM conversations WHERE id = :id")


_PREVIEW_FIELDS = ("platform", "channel", "thread", "stream_id", "shown", "started_at", "shown_at")


@dataclass(frozen=True)
class Attempt:
    """A post's attempt, recorded."""

    preview: PreviewRef | None
    """The conversation's open preview when it was asked for, and there is one."""
    answer_follows: bool = False
    """With a preview: an answer was queued after the post, in the same transaction."""


@dataclass
class _Releases:
    """Leases given back in one statement: each one's key and the changes made under it; whether it ran, and why it
    failed."""

    changed: dict[int, list[int]] = field(default_factory=dict)
    ran: bool = False
    failure: Exception | None = None


class Ledger:
    def __init__(self, *, engine: AsyncEngine, owner: str, lease_s: float) -> None:
        self.engine = engine
        self._alone = alone(engine)
        """Where a statement that is a transaction by itself runs."""
        self.owner = owner
        self.lease_s = lease_s
        """How long a send lease lasts unrenewed: a crashed sender's conversations wait this long."""
        self._after = 0
        """Where the next pass's search for due conversations begins: after the last conversation of a full batch
        (ids are positive), else from the first."""
        self._changed: dict[int, list[int]] = {}
        """Rows changed under each send lease this sender holds, by its key, not marked done yet."""
        self._gathering = _Releases()
        """Leases to give back, gathered while a release is in flight (`release`)."""
        self._release_one_at_a_time = asyncio.Lock()

    async def due(self) -> list[tuple[int | None, str | None]]:
        """(conversation id, key) of each conversation whose next row is due."""
        async with self._alone() as conn:
            found = (await _DUE_CONVERSATIONS.run(conn, {"after": self._after, "n": DUE_BATCH})).all()
        ids = [row.conversation_id for row in found if row.conversation_id is not None]
        self._after = max(ids) if len(ids) >= DUE_BATCH else 0
        return [(row.conversation_id, row.key) for row in found]

    async def unsent(self, conversation_id: int | None) -> Sequence[Row]:
        """The conversation's next rows not done (at most FETCH_AHEAD), in order, each with its conversation's
        language (`spoken_language`: what an answer's own words are rendered in when it is sent)."""
        async with self._alone() as conn:
            if changed := self._changed.pop(conversation_id or 0, None):  # or they would be read as unsent
                await _CHANGED.run(conn, {"changed": changed})
            if conversation_id is None:
                return (await _UNSENT_ORPHANS.run(conn, {})).all()
        return (await self.unsent_of_each([conversation_id])).get(conversation_id, [])

    async def unsent_of_each(self, conversation_ids: Sequence[int]) -> dict[int, list[Row]]:
        """`unsent` of each conversation, in one statement (under load a pass has many conversations due); a
        conversation with none has no entry."""
        found: dict[int, list[Row]] = {}
        async with self._alone() as conn:
            changed = [row for cid in conversation_ids for row in self._changed.pop(cid, ())]
            if changed:
                await _CHANGED.run(conn, {"changed": changed})
            for row in await _UNSENT_OF_EACH.run(conn, {"ids": list(conversation_ids)}):
                found.setdefault(row.conversation_id, []).append(row)
        return found

    async def lease_each(self, keys: Sequence[int]) -> set[int]:
        """`lease` of several conversations' rows, in one statement; the keys this sender now holds. Its own
        statement, before the rows are read, as `lease`."""
        values = {"keys": sorted(set(keys)), "o": self.owner, "ttl": self.lease_s}
        async with self._alone() as conn:
            return {row.conversation_id for row in await _LEASE_EACH.run(conn, values)}

    async def lease(self, key: int) -> bool:
        """Claim (or renew) the send lease of one conversation's rows; False while another sender holds it. Its own
        statement, before the rows are read: a statement reads as of its start, so rows read in the statement that
        takes the lease could predate what the lease's last holder sent and marked done meanwhile."""
        return key in await self.lease_each([key])

    async def release(self, key: int) -> None:
        """The send lease given up, and the changes made under it marked done (`changed`). Releases asked for while
        one is in flight go together in the next statement (a group commit: under load a pass's conversations end
        close together, and none waits longer than one statement for it)."""
        batch = self._gathering
        batch.changed.setdefault(key, []).extend(self._changed.pop(key, ()))
        try:
            async with self._release_one_at_a_time:
                if batch.ran:  # given up with others', by the statement another caller ran
                    if batch.failure is not None:
                        raise batch.failure
                    return
                self._gathering = _Releases()
                changed = [i for ids in batch.changed.values() for i in ids]
                try:
                    async with self._alone() as conn:
                        await _RELEASE.run(conn, {"keys": list(batch.changed), "o": self.owner, "changed": changed})
                except BaseException as exc:
                    batch.failure = RuntimeError(f"the release it went with failed: {exc!r}")
                    for other, ids in batch.changed.items():
                        self._changed.setdefault(other, []).extend(ids)  # marked by a later statement, or redone
                    raise
                finally:
                    batch.ran = True
        except asyncio.CancelledError:
            if batch is self._gathering and key in batch.changed:
                # Not given back: its lease runs out (a later batch must not delete it: this sender may lease the
                # conversation again meanwhile), and its changes are marked by a later statement.
                self._changed.setdefault(key, []).extend(batch.changed.pop(key))
            raise

    async def without_pointless(self, rows: Sequence[Row], key: int) -> list[Row]:
        """A working reaction not tried yet whose removal is already queued (the reply was faster than the
        sender, as under load) is neither added nor removed: two calls nobody would see. Both rows are skipped
        together or not at all, and only while this sender holds the conversation's send lease. What this gives
        up: a sender killed between adding the reaction and recording it leaves that 👀 beside the ✅ (a
        reaction's attempt is not recorded first, to keep it one statement)."""
        pending_adds: dict[tuple[str, str | None, str | None], Row] = {}
        pairs: list[int] = []
        for row in rows:
            place = (row.channel, row.target_ts, row.reaction)
            if row.kind == AddReaction.kind and row.attempts == 0:
                pending_adds[place] = row
            elif row.kind == RemoveReaction.kind and (added := pending_adds.pop(place, None)) is not None:
                pairs += [added.id, row.id]
        if not pairs:
            return list(rows)
        async with self._alone() as conn:
            skipped = await _SKIP_PAIRS.run(conn, {"ids": pairs, "n": len(pairs), "k": key, "o": self.owner})
            if len(skipped.all()) != len(pairs):
                return list(rows)
        return [row for row in rows if row.id not in pairs]

    async def attempt(
        self, row: Row, key: int, *, uploaded: list[str] | None = None, preview: bool = False
    ) -> Attempt | None:
        """Record the attempt before a post, only while this sender still holds the lease and nobody else has
        tried the row meanwhile: if the process dies waiting for the platform's answer, the next sender looks for
        the post first; None when it could not be recorded. Changes are safe to repeat and need no such record (one
        commit fewer each). With `preview`, the conversation's open preview comes with it (`open_preview`)."""
        changed = self._changed.pop(key, [])
        values = {
            "id": row.id,
            "seen": row.attempts,
            "k": key,
            "o": self.owner,
            "uploaded": None if uploaded is None else json.dumps(uploaded),
            "changed": changed,
            "preview": preview,
        }
        try:
            async with self._alone() as conn:
                found = (await _ATTEMPT.run(conn, values)).first()
        except BaseException:
            self._changed.setdefault(key, []).extend(changed)  # still to be marked
            raise
        if found is None:
            return None
        if found.preview_id is None:
            return Attempt(None)
        preview_of = {name: found._mapping[name] for name in _PREVIEW_FIELDS}
        return Attempt(PreviewRef(id=found.preview_id, **preview_of), answer_follows=bool(found.answer_follows))

    async def settled(self, row: Row, key: int) -> None:
        """This sender's attempt at a post was answered "not posted": the row is no longer in doubt (only while
        this sender still holds the lease, so that no other sender's fresh attempt is forgotten)."""
        async with self._alone() as conn:
            await _SETTLED.run(conn, {"id": row.id, "k": key, "o": self.owner})

    async def still_ours(self, row: Row, key: int) -> bool:
        """Whether this sender still holds the lease and nobody has tried the row since its own attempt: then no
        other sender can have posted it."""
        values = {"id": row.id, "n": row.attempts + 1, "k": key, "o": self.owner}
        async with self._alone() as conn:
            mine = (await _STILL_OURS.run(conn, values)).first()
        return mine is not None

    async def claim(self, row: Row, ts: str, *, done: bool, preview: int | None = None) -> str | None:
        """Record `ts` as this row's post (and, with `done`, the row as sent) unless another post is recorded for it
        already: None when `ts` is the row's post now, else the post recorded first. One conditional statement, so
        that two senders never both go on. `preview`: the preview `ts` finished, closed in the same transaction, so
        that no later message ever finishes it again."""
        # Closing the preview must commit with the claim; without one, the claim is a statement by itself (a post
        # once recorded for a row is never replaced, so reading it afterwards needs no transaction).
        opened = self.engine.begin() if preview is not None else self._alone()
        async with opened as conn:
            claimed = (await (_CLAIM_AND_DONE if done else _CLAIM).run(conn, {"id": row.id, "ts": ts})).first()
            if claimed is not None:
                if preview is not None:
                    await _CLOSE_PREVIEW.run(conn, {"id": preview})
                return None
            first = (await _CLAIMED.run(conn, {"id": row.id})).scalar()
            assert first is not None, "a claim lost to no post"
            return str(first)

    async def open_preview(self, row: Row) -> PreviewRef | None:
        async with self._alone() as conn:
            found = (await _OPEN_PREVIEW.run(conn, {"c": row.conversation_id, "before": row.created_at})).first()
        return None if found is None else PreviewRef(**found._mapping)

    async def answer_follows(self, row: Row) -> bool:
        values = {"c": row.conversation_id, "id": row.id, "t": row.created_at}
        async with self._alone() as conn:
            return bool((await _ANSWER_FOLLOWS.run(conn, values)).scalar())

    async def done(
        self,
        row: Row,
        outcome: Outcome,
        *,
        result_ts: str | None = None,
        last_error: str | None = None,
        then: Sequence[Delivery] = (),
    ) -> Outcome:
        """The row's outcome (with the post's id, or why), with `then` queued in the same transaction."""
        values = {"id": row.id, "outcome": str(outcome), "result_ts": result_ts, "last_error": last_error}
        async with self._alone() if not then else self.engine.begin() as conn:
            await _DONE.run(conn, values)
            await enqueue(conn, then)
        return outcome

    def changed(self, row: Row) -> Outcome:
        """A change made, or found made already. Marked done when the lease is released, in the same statement, or
        before the conversation's rows are read again: one commit per pass, not one per reaction. A change is safe
        to make twice (a reaction there already, a message deleted already), so a sender that dies before leaves it
        to the next one, who finds it made."""
        self._changed.setdefault(row.conversation_id or 0, []).append(row.id)
        return Outcome.SENT

    async def backoff(self, row: Row, error: str, *, delay: timedelta | None = None) -> None:
        """Try again later, this try counted once: a post's attempt is recorded before it is sent, anything else
        (a change, or a post that failed before its attempt, such as rendering it) is counted here."""
        delay = delay or timedelta(seconds=min(2 ** (row.attempts + 1), 300))
        log.warning("outbox row %s failed (%s); next try in %s", row.id, error, delay)
        values = {"id": row.id, "error": error, "delay": delay, "tried": row.attempts + 1}
        async with self._alone() as conn:
            await _BACKOFF.run(conn, values)

    async def wait(self, row: Row, delay: timedelta) -> None:
        """Not tried before `delay` has passed, nor counted as a try."""
        async with self._alone() as conn:
            await _WAIT.run(conn, {"id": row.id, "delay": delay})

    async def give_up(self, row: Row, error: str, *, then: Sequence[Delivery] = ()) -> Outcome:
        """The row failed for good: its own state (never counted as sent), with `then` queued in the same
        transaction (what a person must hear instead)."""
        log.error("outbox row %s (%s) given up: %s", row.id, row.kind, error)
        return await self.done(row, Outcome.GIVEN_UP, last_error=error, then=then)

    async def relayed_copy(self, source: str) -> tuple[Where, str, str | None] | None:
        """Where the copy of a colleague's message is and its id, once it was posted, and the colleague."""
        async with self._alone() as conn:
            copy = (await _RELAYED_COPY.run(conn, {"source": source})).first()
        return None if copy is None else (Where(copy.channel, copy.thread_ts), copy.result_ts, copy.author)

    async def post_of(self, row_id: int) -> tuple[NewMessage, str | None, list[str]] | None:
        """A row's post, its id once it went out (None while it has not), and the files uploaded for it (a file
        relay's): what an `Erase` takes down."""
        async with self._alone() as conn:
            row = (await _POST.run(conn, {"id": row_id})).first()
        if row is None:
            return None
        delivery = delivery_of(row._mapping)
        if not isinstance(delivery, NewMessage):
            return None
        return delivery, row.result_ts, list(row.uploaded or ())

    async def conversation_key(self, conversation_id: int) -> tuple[str, Language | None] | None:
        """The conversation's key, and its language for what is said to its customer."""
        async with self._alone() as conn:
            found = (await _CONVERSATION_KEY.run(conn, {"id": conversation_id})).first()
        return None if found is None else (found.key, Language.parse(found.language))
