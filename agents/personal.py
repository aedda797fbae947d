"""One person's data: where it lives in every table, and the two things an operator owes them, `export` (what is held
about them, as JSON) and `forget` (erase or anonymise all of it). This module is the inventory: a table that holds
anything of a person is handled here or it is not handled.

A person is a platform and that platform's user id. Their conversations are those in which they wrote as the
customer (or were the customer of a case or a survey); everything of those goes, whoever wrote it there (staff
replies, the agents' answers, tool arguments and results, the transcript's copies of their files' text). Elsewhere
their id is replaced by an anonymous token, the same for every row of one forget, so that rows kept for the
operator's numbers (a case's times, a rating, a conversation's tokens and costs) keep them without saying whose:

conversations  theirs: the key becomes `<platform>:forgotten:<token>:<id>` (the next message in that thread starts a
               fresh conversation), closed, context and summary cleared, the lease fenced (a turn in flight commits
               nothing)
messages       theirs deleted (the transcript, files' extracted text included); elsewhere their id anonymised
inbound        theirs blanked and kept, like retention's (`/support stats` counts them): text, files, identity and the
               outcome's words cleared, author anonymised, one not yet answered marked processed (nobody answers it);
               elsewhere their id anonymised
tool_runs      theirs: arguments and output emptied (tool, ok, duration kept)
llm_calls      theirs: error text cleared (model, tokens, latency kept)
handoffs       theirs: reason cleared
escalations    theirs: reason emptied, customer anonymised, an open case ended (handed_back); times kept
csat           theirs: comment cleared, customer anonymised, the rating kept
answer_feedback  their clicks anonymised, the ratings kept
outbox         theirs: text, author and errors cleared, what was still owed skipped, and every post that went out
               taken down by an `erase` row (`agents.db.deliveries.Erase`): the case and relays in the staff channel,
               the answers in their thread, the files a relay uploaded again, exactly once like any delivery
previews       theirs deleted; a streamed message no post replaced is taken down too
rate_counters  their counter deleted
refunds        kept: the idempotency record of an order (one refund per order); it holds no id or text of theirs
received, send_leases, teams_service_urls, kb_*   hold nothing of a person (delivery ids, a chat's service URL, the
               knowledge base)
pauses, admin_actions    their id anonymised (as the admin who paused, or who ran a command)
forgotten      one row per forget: when, who asked, the counts; never whom

Last, in a second transaction (the conversations' locks are released by then), every text and JSON column of every
other table is swept for the id itself where it stands alone (a mention in someone else's conversation, a command's
arguments) and it is replaced by the token. A forget that failed between the two is completed by running it again.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import date
from typing import Any, get_args

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import Address
from agents.db import models as m
from agents.db.deliveries import KINDS, Erase, NewMessage, Outcome, enqueue

FORGOTTEN = "forgotten"
"""The workspace part of a forgotten conversation's key."""
MIN_ID = 4
"""Shorter ids are refused: the sweep replaces the id wherever it stands alone, and a short one does everywhere."""
_NOT_SWEPT = ("kb_collections", "kb_documents", "kb_chunks", "forgotten", "alembic_version")
_POST_KINDS = [kind for kind, cls in KINDS.items() if cls in get_args(NewMessage)]


@dataclass(frozen=True)
class Person:
    platform: str
    """A `Platform` value: the platform whose id `user` is."""
    user: str
    """The platform's user id (Slack `U…`, Teams `29:…`): the one their messages are stored under. A Teams
    admin's commands and pauses are recorded under their AAD object id instead, which a second forget names."""


def is_forgotten(key: str) -> bool:
    """The key of a conversation whose person was forgotten."""
    address = Address.parse(key)
    return address is not None and address.workspace == FORGOTTEN


class PersonError(ValueError):
    """The selector cannot name one person safely (an id too short to sweep for)."""


# Each branch by an index on the person's column (migration 0031), not a walk of every conversation.
_THEIR_CONVERSATIONS = """
    SELECT c.id FROM conversations c
    WHERE c.key LIKE :like AND c.id IN (
        SELECT conversation_id FROM inbound WHERE author = :user AND kind = 'customer'
        UNION SELECT conversation_id FROM inbound WHERE identity->>'user' = :user AND kind = 'customer'
        UNION SELECT conversation_id FROM escalations WHERE customer = :user
        UNION SELECT conversation_id FROM csat WHERE customer = :user)
    ORDER BY c.id
"""


async def their_conversations(s: AsyncSession, person: Person, *, lock: bool = False) -> list[int]:
    sql = _THEIR_CONVERSATIONS + (" FOR UPDATE" if lock else "")
    params = {"like": Address.like(person.platform), "user": person.user}
    return list((await s.scalars(text(sql), params)).all())


def _check(person: Person) -> None:
    if len(person.user.strip()) < MIN_ID:
        raise PersonError(f"{person.user!r} is too short to be a user id")


async def forget(sessions: async_sessionmaker[AsyncSession], person: Person, *, requested_by: str) -> dict[str, int]:
    """Erase or anonymise everything held about `person`; the rows changed per table. Their conversations and
    every row naming them go in one transaction, the sweep of the other tables' text in a second one. The posts the
    bot made in their conversations are taken down by the outbox afterwards."""
    _check(person)
    token = f"{FORGOTTEN}-{uuid.uuid4().hex[:12]}"
    counts: Counter[str] = Counter()
    async with sessions() as s, s.begin():
        # Locked first: a turn committing now finishes before this; one committing later is fenced out.
        ids = await their_conversations(s, person, lock=True)
        counts["conversations"] += len(ids)
        if ids:
            await _erase_conversations(s, ids, person, token, counts)
        await _anonymise(s, person.user, token, counts)
    async with sessions() as s, s.begin():
        await _sweep(s, person.user, token, counts)
        await s.execute(
            text("INSERT INTO forgotten (requested_by, counts) VALUES (:by, CAST(:counts AS jsonb))"),
            {"by": requested_by, "counts": json.dumps(dict(counts))},
        )
    return {table: n for table, n in sorted(counts.items()) if n}


async def _erase_conversations(
    s: AsyncSession, ids: list[int], person: Person, token: str, counts: Counter[str]
) -> None:
    c = {"ids": ids}
    # The posts to take down: out already, or in doubt (a sender may be posting it now; the erase goes after it),
    # and any files uploaded for one (shared or not).
    posted = (
        await s.execute(
            text(
                "SELECT id, conversation_id FROM outbox WHERE conversation_id = ANY(:ids) AND kind = ANY(:kinds) "
                "AND (result_ts IS NOT NULL OR (done_at IS NULL AND attempted_at IS NOT NULL) "
                "OR uploaded IS NOT NULL) ORDER BY id"
            ),
            c | {"kinds": _POST_KINDS},
        )
    ).all()
    streamed = (
        await s.execute(
            text(
                "SELECT conversation_id, channel, thread, stream_id FROM previews "
                "WHERE conversation_id = ANY(:ids) AND state <> 'finished' AND stream_id IS NOT NULL"
            ),
            c,
        )
    ).all()
    counts["outbox"] += _n(
        await s.execute(
            text(
                f"UPDATE outbox SET done_at = now(), outcome = '{Outcome.SKIPPED}' "
                "WHERE conversation_id = ANY(:ids) AND done_at IS NULL AND attempted_at IS NULL"
            ),
            c,
        )
    )
    await s.execute(
        text("UPDATE outbox SET text = NULL, author = NULL, last_error = NULL WHERE conversation_id = ANY(:ids)"), c
    )
    await enqueue(
        s,
        [Erase(row.conversation_id, row.id) for row in posted]
        + [Erase(p.conversation_id, None, p.channel, p.thread, p.stream_id) for p in streamed],
    )
    counts["outbox (posts taken down)"] += len(posted) + len(streamed)
    for table, sql in (
        ("previews", "DELETE FROM previews WHERE conversation_id = ANY(:ids)"),
        ("messages", "DELETE FROM messages WHERE conversation_id = ANY(:ids)"),
        # Kept as numbers, as retention keeps them (`bot.retention`): `/support stats` counts them. The outcome's
        # keys stay (`MessageResult.from_json` reads them back), their words go.
        (
            "inbound",
            "UPDATE inbound SET text = '', author = :token, identity = NULL, files = NULL, "
            "processed_at = coalesce(processed_at, now()), outcome = outcome || jsonb_build_object("
            "'reply', NULL, 'escalation_reason', NULL, 'handoffs', '[]'::jsonb) WHERE conversation_id = ANY(:ids)",
        ),
        ("tool_runs", "UPDATE tool_runs SET arguments = '', output = '' WHERE conversation_id = ANY(:ids)"),
        ("llm_calls", "UPDATE llm_calls SET error = NULL WHERE conversation_id = ANY(:ids)"),
        ("handoffs", "UPDATE handoffs SET reason = NULL WHERE conversation_id = ANY(:ids)"),
        (
            "escalations",
            "UPDATE escalations SET reason = '', customer = :token, "
            "status = CASE WHEN status IN ('open', 'claimed') THEN 'handed_back' ELSE status END, "
            "closed_at = coalesce(closed_at, now()) WHERE conversation_id = ANY(:ids)",
        ),
        ("csat", "UPDATE csat SET comment = NULL, customer = :token WHERE conversation_id = ANY(:ids)"),
    ):
        counts[table] += _n(await s.execute(text(sql), c | {"token": token}))
    for cid in ids:
        key = Address(person.platform, FORGOTTEN, token, str(cid)).key
        # history_from 0, not NULL: a reset no turn ever writes, so a summary read before this and written after it
        # no longer matches and is dropped (`agents.summary`'s write).
        await s.execute(
            text(
                "UPDATE conversations SET key = :key, mode = 'closed', context = '{}', summary = NULL, "
                "summary_through = NULL, history_from = 0, updated_at = now(), "
                "lease_owner = NULL, lease_until = NULL, lease_token = lease_token + 1 WHERE id = :id"
            ),
            {"key": key, "id": cid},
        )


_ANONYMISE = (
    (
        "inbound",
        "UPDATE inbound SET author = :token, identity = NULL WHERE author = :user OR identity->>'user' = :user",
    ),
    ("messages", "UPDATE messages SET author = :token, author_name = NULL WHERE author = :user"),
    ("outbox", "UPDATE outbox SET author = :token WHERE author = :user"),
    ("escalations", "UPDATE escalations SET customer = :token WHERE customer = :user"),
    ("escalations", "UPDATE escalations SET claimed_by = :token WHERE claimed_by = :user"),
    ("escalations", "UPDATE escalations SET closed_by = :token WHERE closed_by = :user"),
    ("csat", "UPDATE csat SET customer = :token, comment = NULL WHERE customer = :user"),
    ("csat", "UPDATE csat SET resolved_by = :token WHERE resolved_by = :user"),
    ("answer_feedback", "UPDATE answer_feedback SET user_id = :token WHERE user_id = :user"),
    ("rate_counters", "DELETE FROM rate_counters WHERE scope = 'user' AND name = :user"),
    ("pauses", "UPDATE pauses SET paused_by = :token WHERE paused_by = :user"),
    ("admin_actions", "UPDATE admin_actions SET user_id = :token WHERE user_id = :user"),
)
"""Their id where it stands in another person's conversation (a colleague's relays, their clicks, their commands)."""


async def _anonymise(s: AsyncSession, user: str, token: str, counts: Counter[str]) -> None:
    for table, sql in _ANONYMISE:
        counts[table] += _n(await s.execute(text(sql), {"user": user, "token": token}))


_COLUMNS = text(
    """
    SELECT c.table_name, c.column_name, c.data_type FROM information_schema.columns c
    JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name
    WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE' AND c.is_generated = 'NEVER'
      AND c.data_type IN ('text', 'character varying', 'json', 'jsonb') AND NOT (c.table_name = ANY(:skip))
    ORDER BY c.table_name, c.ordinal_position
    """
)


async def _sweep(s: AsyncSession, user: str, token: str, counts: Counter[str]) -> None:
    """The id wherever it is still written (a mention in a colleague's message, a command's arguments): replaced
    where it stands alone, so that a longer id it begins (Slack's ids are 9 or 11 characters) is left whole. One
    statement a table."""
    columns: dict[str, list[tuple[str, str]]] = {}
    for table, column, kind in (await s.execute(_COLUMNS, {"skip": list(_NOT_SWEPT)})).all():
        columns.setdefault(table, []).append((column, kind))
    params = {"pattern": alone(user), "token": token}
    for table, cols in columns.items():
        sets, tests = [], []
        for column, kind in cols:
            col = f'"{column}"'
            value = f"{col}::text" if kind in ("json", "jsonb") else col
            replaced = f"regexp_replace({value}, :pattern, :token, 'g')"
            sets.append(f"{col} = CAST({replaced} AS {kind})" if kind in ("json", "jsonb") else f"{col} = {replaced}")
            tests.append(f"{value} ~ :pattern")
        done = await s.execute(text(f'UPDATE "{table}" SET {", ".join(sets)} WHERE {" OR ".join(tests)}'), params)
        counts[table] += _n(done)


def alone(user: str) -> str:
    """A Postgres regular expression matching `user` where no letter or digit touches it."""
    escaped = "".join(c if c.isalnum() else "\\" + c for c in user)
    return f"(?<![[:alnum:]]){escaped}(?![[:alnum:]])"


async def export(sessions: async_sessionmaker[AsyncSession], person: Person) -> dict[str, Any]:
    """What is held about `person`, as JSON: their conversations (their messages and the replies to them, the tools
    run for them, their cases and ratings), and their clicks and commands elsewhere. Other customers' messages in a
    shared thread are left out."""
    _check(person)
    async with sessions() as s:
        ids = await their_conversations(s, person)
        conversations = [await _conversation(s, cid, person.user) for cid in ids]
        feedback = await _rows(
            s,
            "SELECT conversation_id, agent, rating, created_at, updated_at FROM answer_feedback "
            "WHERE user_id = :user ORDER BY id",
            user=person.user,
        )
        commands = await _rows(
            s,
            "SELECT command, arguments, allowed, ok, result, created_at FROM admin_actions "
            "WHERE user_id = :user ORDER BY id",
            user=person.user,
        )
        counters = await _rows(
            s,
            "SELECT minute, answered, day, tokens FROM rate_counters WHERE scope = 'user' AND name = :user",
            user=person.user,
        )
    return {
        "person": {"platform": person.platform, "user": person.user},
        "conversations": conversations,
        "answer_feedback": feedback,
        "admin_commands": commands,
        "rate_counters": counters,
    }


async def _conversation(s: AsyncSession, cid: int, user: str) -> dict[str, Any]:
    conversation = await s.get(m.Conversation, cid)
    assert conversation is not None
    p = {"c": cid, "user": user}
    return {
        "id": cid,
        "key": conversation.key,
        "mode": conversation.mode,
        "created_at": _iso(conversation.created_at),
        # The customer's own words and everything said to them; another customer's words in a shared thread are not
        # theirs to receive.
        "messages": await _rows(
            s,
            "SELECT id, role, agent, author, author_name, content, tool_calls, name, created_at FROM messages "
            "WHERE conversation_id = :c AND (role <> 'user' OR author IS NULL OR author = :user "
            "OR author NOT IN (SELECT author FROM inbound WHERE conversation_id = :c AND kind = 'customer' "
            "AND author IS NOT NULL)) ORDER BY id",
            **p,
        ),
        "files": await _rows(
            s,
            "SELECT files, received_at FROM inbound WHERE conversation_id = :c AND author = :user "
            "AND files IS NOT NULL ORDER BY id",
            **p,
        ),
        "tool_runs": await _rows(
            s,
            "SELECT agent, tool, arguments, ok, output, created_at FROM tool_runs WHERE conversation_id = :c AND "
            "(inbound_id IS NULL OR inbound_id IN (SELECT id FROM inbound WHERE author = :user OR kind <> 'customer')) "
            "ORDER BY id",
            **p,
        ),
        "cases": await _rows(
            s,
            "SELECT id, status, reason, trigger, created_at, claimed_at, closed_at FROM escalations "
            "WHERE conversation_id = :c ORDER BY id",
            **p,
        ),
        "ratings": await _rows(
            s,
            "SELECT escalation_id, rating, comment, asked_at, rated_at FROM csat WHERE conversation_id = :c "
            "AND customer = :user ORDER BY id",
            **p,
        ),
    }


async def _rows(s: AsyncSession, sql: str, **params: Any) -> list[dict[str, Any]]:
    result = await s.execute(text(sql), params)
    return [{k: _iso(v) for k, v in row._mapping.items()} for row in result]


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, date) else value


def _n(result: Any) -> int:
    return max(int(getattr(result, "rowcount", 0) or 0), 0)
