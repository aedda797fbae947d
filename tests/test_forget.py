"""Forgetting and exporting a person, over HTTP: a real conversation (a file, an escalation, relays both ways) seeded
through the Slack emulator and the fake model, then `/support forget`: the person's id and words are in no text or
JSON column of any table, and in no live post of the bot's; a turn in flight is fenced and the person is answered
afresh; an export holds their words and nobody else's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents import personal
from agents.conversation_sql import SUBMIT
from agents.model import ModelResponse, Usage
from agents.summary import Summaries, Summarising
from bot.admin.parse import Forget, UsageError, parse
from bot.admin.queries import AdminQueries
from bot.playground.slack_emulator import BOT_USER_ID, SlackEmulator
from fakes.openai_server import FakeOpenAI, reply, slow, tool_call, tools
from harness import documents
from harness.database import held, settle
from harness.scenarios import STAFF, SUPPORT, shown, support

Sessions = async_sessionmaker[AsyncSession]
CUSTOMER = "U_CUSTOMER"
THEIRS = ("burnt marmalade", "ZEBRA-4411", "Casey Customer", CUSTOMER)
"""Their id, their name, their words, and their file's text."""


def _live_posts_holding(emulator: SlackEmulator, needles: tuple[str, ...]) -> list[str]:
    posts = [p for channel in (SUPPORT, STAFF) for p in emulator.posts(channel)]
    shown_as = [json.dumps([p.text, p.blocks, p.files, p.username]) for p in posts]
    return [s for s in shown_as if any(n in s for n in needles)]


async def _seed(emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions) -> str:
    """The customer's file and words, the bot's answer, an escalation, and relays both ways; their thread's ts."""
    fake_llm.script(reply("Sorry about the burnt marmalade smell; I see invoice ZEBRA-4411."))
    invoice = emulator.add_file("invoice.pdf", "application/pdf", documents.pdf("Invoice ZEBRA-4411: Kestrel"))
    said = await emulator.user_says(SUPPORT, "my drone smells of burnt marmalade", files=[invoice])
    await emulator.wait_for(lambda: emulator.posts(SUPPORT, said.ts))
    fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "burnt marmalade smell: customer wants a person"})))
    await emulator.user_says(SUPPORT, "a person please, about the burnt marmalade", thread_ts=said.ts)
    [case] = await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts])
    await emulator.user_says(SUPPORT, "the burnt marmalade is worse", thread_ts=said.ts)
    await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF, case.ts) if "worse" in p.text])
    # A file relayed to the staff thread: the bot uploads it again.
    photo = emulator.add_file("receipt.txt", "text/plain", b"Receipt ZEBRA-4411 for Casey Customer")
    await emulator.user_says(SUPPORT, "here is the receipt", thread_ts=said.ts, files=[photo])
    await emulator.wait_for(lambda: emulator.shared_files(STAFF, case.ts))
    staff_said = "Sorry about the burnt marmalade, Casey Customer"
    await emulator.user_says(STAFF, staff_said, user="U_STAFF", thread_ts=case.ts)
    await emulator.wait_for(lambda: [p for p in emulator.posts(SUPPORT, said.ts) if p.username])
    await settle(sessions)
    return said.ts


def test_forget_takes_a_mention() -> None:
    assert parse("forget <@U123ABC|casey>") == Forget("U123ABC") == parse("forget <@U123ABC>")
    assert isinstance(parse("forget casey"), UsageError)


async def test_forget_leaves_nothing_of_the_person_in_any_table_or_live_post(
    shipped_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    await _seed(emulator, fake_llm, sessions)
    assert await held(sessions, THEIRS) and _live_posts_holding(emulator, THEIRS)  # the seed holds them
    assert _bots_files(emulator)
    usage = await AdminQueries(sessions=sessions).usage(30)

    body = await support(emulator, f"forget <@{CUSTOMER}>")
    assert "Forgotten" in shown(body) and "messages" in shown(body)
    # The outbox takes the case, the relays and the answers down.
    await emulator.wait_for(lambda: not _live_posts_holding(emulator, THEIRS), timeout=15)
    await settle(sessions)
    assert await held(sessions, THEIRS) == []
    async with sessions() as s:
        record = (await s.execute(text("SELECT requested_by, counts FROM forgotten"))).one()
        erased = await s.scalar(text("SELECT count(*) FROM outbox WHERE kind = 'erase' AND outcome = 'sent'"))
        owed = await s.scalar(text("SELECT count(*) FROM outbox WHERE done_at IS NULL"))
    assert record.requested_by == "U_ADMIN" and record.counts["inbound"] >= 3
    assert erased and owed == 0
    # Taken down once each: nothing the bot posted in their thread or the case's is left, nor a file it uploaded.
    assert [p for p in emulator.posts(STAFF) if p.thread_ts or "Case" in p.text] == []
    assert _bots_files(emulator) == []
    # The messages they sent are still counted (blanked, not deleted).
    after = await AdminQueries(sessions=sessions).usage(30)
    counted = ("conversations", "customer_messages", "staff_messages", "rate_limited")
    assert [getattr(after, f) for f in counted] == [getattr(usage, f) for f in counted]


def _bots_files(emulator: SlackEmulator) -> list[str]:
    """The files the bot uploaded (a file relay's), shared or not."""
    return [*(f for f, (obj, _) in emulator.files.items() if obj["user"] == BOT_USER_ID), *emulator.uploads]


async def test_forget_during_a_turn_fences_it_and_the_person_is_answered_afresh(
    shipped_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(slow(3, reply("An answer about burnt marmalade that must never be posted.")))
    said = await emulator.user_says(SUPPORT, "does burnt marmalade void my warranty?")
    await emulator.wait_for(lambda: fake_llm.calls >= 1)
    counts = await personal.forget(sessions, personal.Person("slack", CUSTOMER), requested_by="test")
    assert counts["conversations"] == 1 and counts["inbound"] == 1

    fake_llm.script(reply("Hello again! How can I help?"))
    await emulator.user_says(SUPPORT, "hello, it's me again", thread_ts=said.ts)
    answers = await emulator.wait_for(
        lambda: [p.text for p in emulator.posts(SUPPORT, said.ts) if p.text.startswith("Hello again")], timeout=15
    )
    assert answers == ["Hello again! How can I help?"]
    await settle(sessions)
    assert not _live_posts_holding(emulator, ("must never be posted",))
    async with sessions() as s:
        keys = (await s.scalars(text("SELECT key FROM conversations ORDER BY id"))).all()
        fresh = await s.scalar(
            text("SELECT count(*) FROM messages m JOIN conversations c ON c.id = m.conversation_id WHERE c.key = :k"),
            {"k": keys[-1]},
        )
    assert keys[0].startswith("slack:forgotten:") and keys[-1].endswith(said.ts) and fresh == 2


async def test_export_holds_their_messages_and_nobody_elses(
    shipped_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    emulator.add_user("U_OTHER", "olga", "Olga Other")
    fake_llm.script(reply("Here is how to pair the remote."), reply("Propellers ship in 3 days."))
    mine = await emulator.user_says(SUPPORT, "how do I pair the remote with my osprey?")
    await emulator.wait_for(lambda: emulator.posts(SUPPORT, mine.ts))
    theirs = await emulator.user_says(SUPPORT, "where are my spare propellers, order PX-9?", user="U_OTHER")
    await emulator.wait_for(lambda: emulator.posts(SUPPORT, theirs.ts))
    await settle(sessions)

    exported = await personal.export(sessions, personal.Person("slack", CUSTOMER))
    written = json.dumps(exported)
    assert "how do I pair the remote with my osprey?" in written and "Here is how to pair the remote." in written
    assert "propellers" not in written and "U_OTHER" not in written and "Olga" not in written
    assert len(exported["conversations"]) == 1


class _ForgetsWhileSummarising:
    """A summary model that is slow enough for a forget to commit while it writes (`agents.summary` reads, calls the
    model with no transaction open, then writes)."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions

    async def complete(self, **_: Any) -> ModelResponse:
        await personal.forget(self.sessions, personal.Person("slack", CUSTOMER), requested_by="test")
        return ModelResponse("Casey Customer smelled burnt marmalade", (), Usage(), 1.0)


async def test_a_summary_being_written_when_the_person_is_forgotten_is_not_stored(sessions: Sessions) -> None:
    padding = " The burnt marmalade smell gets worse every flight." * 20
    async with sessions() as s, s.begin():
        cid = await s.scalar(
            text("INSERT INTO conversations (key, active_agent) VALUES ('slack:T1:C1:1.0', 'triage') RETURNING id")
        )
        await s.execute(
            text(
                "INSERT INTO inbound (conversation_id, text, author, kind, processed_at) "
                "VALUES (:c, 'burnt marmalade', :u, 'customer', now())"
            ),
            {"c": cid, "u": CUSTOMER},
        )
        for i in range(8):
            await s.execute(
                text(
                    "INSERT INTO messages (conversation_id, role, agent, author, content) VALUES "
                    "(:c, 'user', NULL, :u, :said), (:c, 'assistant', 'triage', NULL, :answer)"
                ),
                {"c": cid, "u": CUSTOMER, "said": f"Question {i}:{padding}", "answer": f"Answer {i}:{padding}"},
            )
    summaries = Summaries(
        sessions=sessions, model=_ForgetsWhileSummarising(sessions), config=Summarising(model="m", high_water=600)
    )
    assert not await summaries.summarise(cid, None)
    assert await held(sessions, THEIRS) == []


async def _seed_conversation(sessions: Sessions, key: str = "slack:T1:C1:1.0") -> int:
    async with sessions() as s, s.begin():
        cid = await s.scalar(
            text("INSERT INTO conversations (key, active_agent) VALUES (:k, 'triage') RETURNING id"), {"k": key}
        )
        await s.execute(
            text(
                "INSERT INTO inbound (conversation_id, text, author, kind, external_id, processed_at) "
                "VALUES (:c, 'burnt marmalade', :u, 'customer', '1.0', now())"
            ),
            {"c": cid, "u": CUSTOMER},
        )
    assert isinstance(cid, int)
    return cid


async def _waiting_on_locks(sessions: Sessions, n: int) -> None:
    for _ in range(200):
        async with sessions() as s:
            waiting = await s.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            )
        if waiting >= n:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{n} sessions never waited on a lock")


async def test_a_message_stored_while_a_forget_commits_starts_a_fresh_conversation(sessions: Sessions) -> None:
    old = await _seed_conversation(sessions)
    async with sessions() as s, s.begin():
        await s.execute(
            text("INSERT INTO admin_actions (user_id, command, allowed) VALUES (:u, 'stats', true)"), {"u": CUSTOMER}
        )
    async with sessions() as blocker:
        await blocker.begin()
        # The forget waits on this row after renaming their conversation, its transaction open.
        await blocker.execute(text("SELECT id FROM admin_actions WHERE user_id = :u FOR UPDATE"), {"u": CUSTOMER})
        forgetting = asyncio.create_task(
            personal.forget(sessions, personal.Person("slack", CUSTOMER), requested_by="t")
        )
        await _waiting_on_locks(sessions, 1)

        async def store() -> Any:
            async with sessions() as s, s.begin():
                return (
                    await SUBMIT.run(
                        await s.connection(),
                        {
                            "key": "slack:T1:C1:1.0",
                            "entry": "triage",
                            "text": "hello, it's me again",
                            "author": CUSTOMER,
                            "identity": None,
                            "external_id": "2.0",
                            "order_key": None,
                            "kind": "customer",
                            "files": None,
                        },
                    )
                ).one()

        storing = asyncio.create_task(store())
        await _waiting_on_locks(sessions, 2)
        await blocker.rollback()
    await forgetting
    stored = await storing
    assert stored.conversation_id != old
    async with sessions() as s:
        key = await s.scalar(text("SELECT key FROM conversations WHERE id = :c"), {"c": stored.conversation_id})
        said = await s.scalar(text("SELECT text FROM inbound WHERE id = :i"), {"i": stored.inbound_id})
    assert key == "slack:T1:C1:1.0" and said == "hello, it's me again"


async def test_the_sweep_leaves_a_longer_id_whole_and_updates_a_row_once(sessions: Sessions) -> None:
    """Slack ids are 9 or 11 characters: another person's may begin with theirs."""
    await _seed_conversation(sessions)
    other = f"{CUSTOMER}42"
    async with sessions() as s, s.begin():
        await s.execute(
            text(
                "INSERT INTO admin_actions (user_id, command, arguments, allowed, result) "
                "VALUES ('U_ADMIN', 'forget', :args, true, :result)"
            ),
            {"args": f"<@{CUSTOMER}> not <@{other}>", "result": f"{CUSTOMER}, {other}"},
        )
    counts = await personal.forget(sessions, personal.Person("slack", CUSTOMER), requested_by="t")
    async with sessions() as s:
        arguments, result = (await s.execute(text("SELECT arguments, result FROM admin_actions"))).one()
        indexed = set(await s.scalars(text("SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema()")))
    assert f"<@{other}>" in arguments and f"<@{CUSTOMER}>" not in arguments
    assert result.endswith(f", {other}") and not result.startswith(CUSTOMER)
    assert counts["admin_actions"] == 1  # one statement per table: its two columns are one row changed
    # What finds a person is indexed.
    for table, column in (
        ("messages", "author"),
        ("outbox", "author"),
        ("escalations", "customer"),
        ("escalations", "claimed_by"),
        ("escalations", "closed_by"),
        ("csat", "resolved_by"),
        ("answer_feedback", "user_id"),
        ("admin_actions", "user_id"),
        ("inbound", "(identity ->> 'user'::text)"),
    ):
        assert any(f"ON public.{table} " in d and f"({column})" in d for d in indexed), (table, column)


async def test_a_post_in_doubt_when_its_person_was_forgotten_is_skipped(
    shipped_bot: Any, emulator: SlackEmulator, sessions: Sessions
) -> None:
    """Its send was under way when the forget ran (its text is gone) and it did not go out: nothing is sent."""
    async with sessions() as s, s.begin():
        cid = await s.scalar(
            text("INSERT INTO conversations (key, active_agent) VALUES ('slack:forgotten:t:1', 'triage') RETURNING id")
        )
        row = await s.scalar(
            text(
                "INSERT INTO outbox (conversation_id, kind, channel, text, attempted_at, attempts) "
                "VALUES (:c, 'post', :ch, NULL, now() - interval '1 minute', 1) RETURNING id"
            ),
            {"c": cid, "ch": SUPPORT},
        )
    await settle(sessions)
    async with sessions() as s:
        outcome = await s.scalar(text("SELECT outcome FROM outbox WHERE id = :r"), {"r": row})
    assert outcome == "skipped" and emulator.posts(SUPPORT) == []
