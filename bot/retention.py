"""Retention periods: each kind of data the bot keeps about conversations is erased a number of days after the
conversation's last activity (`Kind`, `Periods`), by a housekeeping job (`Retention.run`), in bounded batches.

"Old" is the conversation's age, not the row's: a conversation someone wrote in last week keeps its first message
of two years ago, so that the agents and the staff still see the whole of it. A conversation is idle since a cutoff
when its last turn, its last message received, and its cases' last changes are all older, no message of it waits,
no outbox row of it is owed, no process holds its lease, and no case of it is open. Only idle conversations are
touched; the row lock each batch takes on what it erases keeps a turn from starting meanwhile.

What the operator reports on stays as numbers: the rows counted by `/support stats` and `/support tools`
(messages received, handoffs, cases and their times, CSAT ratings, tool calls, LLM calls and their tokens) are
kept with their text blanked, so every report gives the same totals after a run as before it. Rows no report reads
(the transcript's messages, finished previews, finished outbox rows) are deleted, but a post's address, which
forgetting its person takes the post down by. A rolled-up table was the other way; it would have made every report
read two sources whose day boundaries do not meet a rolling window.

`retention_log` records how many rows of each kind each run erased, never which: `/support status` shows the last
day's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.attachments import without_file_text
from bot.settings import Settings
from escalation.machine import OPEN_CASE

log = logging.getLogger(__name__)

BATCH = 500
"""Rows (conversations, for transcripts) one transaction erases."""
ROUNDS = 4
"""Batches of one kind per run at most: a backlog (periods just set) is worked off over several runs."""
LOG_DAYS = 30
"""How long `retention_log` keeps its counts."""
_LOCK = 2_029_032
"""The advisory lock one process holds while it erases: two processes never erase the same rows twice."""


class Kind(StrEnum):
    """The kinds of data a period is set for: what each erases is `Retention`'s method of that name."""

    TRANSCRIPTS = "transcripts"
    FILES = "files"
    TOOL_RESULTS = "tool_results"
    LLM_CALLS = "llm_calls"
    OUTBOX = "outbox"

    @property
    def label(self) -> str:
        return {
            Kind.TRANSCRIPTS: "Transcripts",
            Kind.FILES: "Files' text",
            Kind.TOOL_RESULTS: "Tool results",
            Kind.LLM_CALLS: "LLM call records",
            Kind.OUTBOX: "Outbox rows",
        }[self]

    @property
    def unit(self) -> str:
        """What `held` and `erased` count."""
        return {Kind.TRANSCRIPTS: "conversation", Kind.FILES: "message"}.get(self, "row")


@dataclass(frozen=True)
class Periods:
    days: Mapping[Kind, int]
    """Days after the conversation's last activity; 0 (or absent): kept for ever."""

    @classmethod
    def of(cls, settings: Settings) -> Periods:
        return cls(
            {
                Kind.TRANSCRIPTS: settings.retention_transcripts_days,
                Kind.FILES: settings.retention_files_days,
                Kind.TOOL_RESULTS: settings.retention_tool_results_days,
                Kind.LLM_CALLS: settings.retention_llm_calls_days,
                Kind.OUTBOX: settings.retention_outbox_days,
            }
        )

    def cutoff(self, kind: Kind, now: datetime) -> datetime | None:
        days = self.days.get(kind, 0)
        return now - timedelta(days=days) if days > 0 else None


@dataclass(frozen=True)
class KindStatus:
    kind: Kind
    days: int
    held: int
    """Rows (conversations, messages) holding what this kind erases, now."""
    erased_last_day: int


_OPEN = ", ".join(f"'{status}'" for status in OPEN_CASE)
_IDLE = f"""
    c.updated_at < :cutoff
    AND (c.lease_until IS NULL OR c.lease_until < :now)
    AND NOT EXISTS (SELECT 1 FROM inbound waiting WHERE waiting.conversation_id = c.id
                    AND (waiting.processed_at IS NULL OR waiting.received_at >= :cutoff))
    AND NOT EXISTS (SELECT 1 FROM escalations cases WHERE cases.conversation_id = c.id
                    AND (cases.status IN ({_OPEN}) OR cases.created_at >= :cutoff OR cases.closed_at >= :cutoff))
    AND NOT EXISTS (SELECT 1 FROM outbox owed WHERE owed.conversation_id = c.id AND owed.done_at IS NULL)
"""
"""The conversation `c` has had no activity since :cutoff and nothing of it is under way at :now."""

_UNERASED = "(c.erased_at IS NULL OR c.erased_at < c.updated_at)"
_OUTBOX_HELD = "o.done_at IS NOT NULL AND (o.result_ts IS NULL OR o.text IS NOT NULL)"

_HELD = {
    Kind.TRANSCRIPTS: f"SELECT count(*) FROM conversations c WHERE {_UNERASED}",
    Kind.FILES: "SELECT count(*) FROM inbound WHERE files IS NOT NULL",
    Kind.TOOL_RESULTS: "SELECT count(*) FROM tool_runs WHERE arguments <> '' OR output <> ''",
    Kind.LLM_CALLS: "SELECT count(*) FROM llm_calls WHERE error IS NOT NULL",
    Kind.OUTBOX: f"SELECT count(*) FROM outbox o WHERE {_OUTBOX_HELD}",
}


class Retention:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], periods: Periods, *, batch: int = BATCH) -> None:
        self.sessions = sessions
        self.periods = periods
        self.batch = batch

    async def run(self, *, now: datetime) -> dict[Kind, int]:
        """Erase what is past its period, at most `ROUNDS` batches of each kind; how many of each were erased."""
        erased: dict[Kind, int] = {}
        for kind in Kind:
            cutoff = self.periods.cutoff(kind, now)
            if cutoff is None:
                continue
            total = 0
            for _ in range(ROUNDS):
                done = await self._batch(kind, cutoff=cutoff, now=now)
                total += max(done, 0)
                if done < self.batch:
                    break
            if total:
                erased[kind] = total
        async with self.sessions() as s, s.begin():
            for kind, n in erased.items():
                await s.execute(
                    text("INSERT INTO retention_log (kind, erased, ran_at) VALUES (:k, :n, :at)"),
                    {"k": kind.value, "n": n, "at": now},
                )
            await s.execute(
                text("DELETE FROM retention_log WHERE ran_at < :at"), {"at": now - timedelta(days=LOG_DAYS)}
            )
        if erased:
            log.info("retention erased %s", ", ".join(f"{n} {kind}" for kind, n in erased.items()))
        return erased

    async def status(self) -> tuple[KindStatus, ...]:
        """Each kind's period, what is held of it now, and what the runs of the last day erased."""
        async with self.sessions() as s:
            held = (await s.execute(text("SELECT " + ", ".join(f"({q})" for q in _HELD.values())))).one()
            recent: dict[str, int] = dict(
                (
                    await s.execute(
                        text(
                            "SELECT kind, sum(erased) FROM retention_log WHERE ran_at > now() - interval '1 day'"
                            " GROUP BY kind"
                        )
                    )
                ).all()
            )
        return tuple(
            KindStatus(kind, self.periods.days.get(kind, 0), int(n), int(recent.get(kind.value, 0)))
            for kind, n in zip(_HELD, held, strict=True)
        )

    async def _batch(self, kind: Kind, *, cutoff: datetime, now: datetime) -> int:
        """One transaction's worth of `kind`; -1 when another process is erasing (it will do this too)."""
        erase = {
            Kind.TRANSCRIPTS: self._transcripts,
            Kind.FILES: self._files,
            Kind.TOOL_RESULTS: self._tool_results,
            Kind.LLM_CALLS: self._llm_calls,
            Kind.OUTBOX: self._outbox,
        }[kind]
        async with self.sessions() as s, s.begin():
            if not await s.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _LOCK}):
                return -1
            return await erase(s, {"cutoff": cutoff, "now": now, "batch": self.batch})

    async def _transcripts(self, s: AsyncSession, at: dict[str, Any]) -> int:
        """Whole conversations: their messages and finished previews and outbox rows deleted; the text of what is
        counted (messages received, cases, handoffs, ratings) blanked, the rows kept."""
        ids = list(
            await s.scalars(
                text(
                    f"SELECT c.id FROM conversations c WHERE {_UNERASED} AND {_IDLE}"
                    " ORDER BY c.updated_at LIMIT :batch FOR UPDATE OF c SKIP LOCKED"
                ),
                at,
            )
        )
        if not ids:
            return 0
        them = {"ids": ids, "now": at["now"], "cutoff": at["cutoff"]}
        for statement in (
            "DELETE FROM messages WHERE conversation_id = ANY(:ids)",
            "DELETE FROM previews WHERE conversation_id = ANY(:ids) AND state <> 'open'",
            # A post's address stays, as `_outbox` keeps it: forgetting its person later still takes it down.
            "DELETE FROM outbox WHERE conversation_id = ANY(:ids) AND done_at IS NOT NULL AND result_ts IS NULL",
            "UPDATE outbox SET text = NULL, sources = NULL, last_error = NULL"
            " WHERE conversation_id = ANY(:ids) AND done_at IS NOT NULL AND result_ts IS NOT NULL",
            # The stored outcome is read back by `MessageResult.from_json`: its keys stay, their text goes. A message
            # committed since the conversation was found idle is not the past: it is left for its turn.
            "UPDATE inbound SET text = '', identity = NULL, files = NULL, outcome = outcome || jsonb_build_object("
            "'reply', NULL, 'escalation_reason', NULL, 'handoffs', '[]'::jsonb) WHERE conversation_id = ANY(:ids)"
            " AND processed_at IS NOT NULL AND received_at < :cutoff",
            "UPDATE escalations SET reason = '' WHERE conversation_id = ANY(:ids)",
            "UPDATE handoffs SET reason = NULL WHERE conversation_id = ANY(:ids)",
            "UPDATE csat SET comment = NULL WHERE conversation_id = ANY(:ids)",
            "UPDATE conversations SET context = '{}', summary = NULL, summary_through = NULL, history_from = NULL,"
            " erased_at = :now WHERE id = ANY(:ids)",
        ):
            await s.execute(text(statement), them)
        return len(ids)

    async def _files(self, s: AsyncSession, at: dict[str, Any]) -> int:
        """Messages with files: what the files said taken out of the transcript, and where they were forgotten."""
        ids = list(
            await s.scalars(
                text(
                    "SELECT i.id FROM inbound i JOIN conversations c ON c.id = i.conversation_id"
                    f" WHERE i.files IS NOT NULL AND i.received_at < :cutoff AND {_IDLE}"
                    " ORDER BY i.received_at LIMIT :batch FOR UPDATE OF i SKIP LOCKED"
                ),
                at,
            )
        )
        if not ids:
            return 0
        said = await s.execute(
            text("SELECT id, content FROM messages WHERE inbound_id = ANY(:ids) AND role = 'user' AND content <> ''"),
            {"ids": ids},
        )
        for message_id, content in said.all():
            if (kept := without_file_text(content)) != content:
                await s.execute(text("UPDATE messages SET content = :c WHERE id = :id"), {"c": kept, "id": message_id})
        await s.execute(text("UPDATE inbound SET files = NULL WHERE id = ANY(:ids)"), {"ids": ids})
        return len(ids)

    async def _tool_results(self, s: AsyncSession, at: dict[str, Any]) -> int:
        result = await s.execute(
            text(
                "UPDATE tool_runs SET arguments = '', output = '' WHERE id IN ("
                " SELECT t.id FROM tool_runs t JOIN conversations c ON c.id = t.conversation_id"
                f" WHERE (t.arguments <> '' OR t.output <> '') AND t.created_at < :cutoff AND {_IDLE}"
                " ORDER BY t.created_at LIMIT :batch FOR UPDATE OF t SKIP LOCKED)"
            ),
            at,
        )
        return _rows(result)

    async def _llm_calls(self, s: AsyncSession, at: dict[str, Any]) -> int:
        """An LLM call's record holds no prompt or answer: its error text is what may quote the customer."""
        result = await s.execute(
            text(
                "UPDATE llm_calls SET error = NULL WHERE id IN ("
                " SELECT l.id FROM llm_calls l LEFT JOIN conversations c ON c.id = l.conversation_id"
                f" WHERE l.error IS NOT NULL AND l.created_at < :cutoff AND (c.id IS NULL OR ({_IDLE}))"
                " ORDER BY l.created_at LIMIT :batch FOR UPDATE OF l SKIP LOCKED)"
            ),
            at,
        )
        return _rows(result)

    async def _outbox(self, s: AsyncSession, at: dict[str, Any]) -> int:
        """Finished rows deleted, but a post's: its address stays (without its text) as long as the transcript, so
        that a colleague's later edit or deletion, or forgetting its person, still reaches the post."""
        rows = (
            await s.execute(
                text(
                    "SELECT o.id, o.result_ts IS NULL FROM outbox o LEFT JOIN conversations c"
                    f" ON c.id = o.conversation_id WHERE {_OUTBOX_HELD} AND o.done_at < :cutoff"
                    f" AND (c.id IS NULL OR ({_IDLE}))"
                    " ORDER BY o.done_at LIMIT :batch FOR UPDATE OF o SKIP LOCKED"
                ),
                at,
            )
        ).all()
        unposted = [row_id for row_id, gone in rows if gone]
        posted = [row_id for row_id, gone in rows if not gone]
        if unposted:
            await s.execute(text("DELETE FROM outbox WHERE id = ANY(:ids)"), {"ids": unposted})
        if posted:
            await s.execute(
                text("UPDATE outbox SET text = NULL, sources = NULL, last_error = NULL WHERE id = ANY(:ids)"),
                {"ids": posted},
            )
        return len(rows)


def _rows(result: Any) -> int:
    return int(getattr(result, "rowcount", 0) or 0)
