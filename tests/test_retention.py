"""Retention periods against the real Postgres: what is past its period loses its text (or goes), what is newer stays,
a conversation with recent activity or under way is not touched, and the reports' totals do not move. Times are set
by writing timestamps into rows; the job takes `now`."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.attachments import Attachment, FileRef, with_attachments, without_file_text
from agents.conversations import MessageResult, ResultKind
from agents.db import models as m
from agents.loop import HandoffRecord
from bot.admin.queries import AdminQueries
from bot.playground.slack_emulator import SlackEmulator
from bot.retention import Kind, Periods, Retention
from fakes.openai_server import FakeOpenAI
from harness.scenarios import serving_as_shipped, shown, support, until

Sessions = async_sessionmaker[AsyncSession]
NOW = datetime.now(UTC)
DEFAULTS = Periods({Kind.TRANSCRIPTS: 365, Kind.FILES: 90, Kind.TOOL_RESULTS: 90, Kind.LLM_CALLS: 30, Kind.OUTBOX: 30})
FILE_TEXT = "IBAN DE89 3704 0044 0532 0130 00, invoice of Erika Mustermann"
SAID = "my blender smokes, order 100234"


async def seed(
    sessions: Sessions,
    key: str,
    *,
    days_ago: float,
    active_days_ago: float | None = None,
    case: str = "resolved",
    leased: bool = False,
) -> int:
    """A conversation with everything retention knows: a customer message with a file, the transcript, a handoff, a
    tool run, a failed LLM call, a case (`case`) rated 4 with a comment, a post and a reaction. Every row written
    `days_ago`; the conversation last active `active_days_ago` (the same by default)."""
    then = NOW - timedelta(days=days_ago)
    active = NOW - timedelta(days=days_ago if active_days_ago is None else active_days_ago)
    async with sessions() as s, s.begin():
        c = m.Conversation(key=key, active_agent="triage", context={"order": "100234"}, summary="Erika's blender")
        s.add(c)
        await s.flush()
        i = m.Inbound(
            conversation_id=c.id,
            external_id=f"{key}-1",
            author="U_ERIKA",
            identity={"platform": "slack", "user": "U_ERIKA", "name": "Erika", "email": "erika@example.com"},
            text=SAID,
            files=[FileRef("F1", "invoice.txt", "text/plain", 60, "https://files/F1").to_json()],
            processed_at=then,
            received_at=then,
            outcome=MessageResult(
                0, 0, ResultKind.ESCALATED, "Sorry!", "triage", (HandoffRecord("triage", "billing", "for Erika"),)
            ).to_json(),
        )
        s.add(i)
        await s.flush()
        file = Attachment("invoice.txt", "text/plain", text=FILE_TEXT)
        s.add_all(
            [
                m.Message(conversation_id=c.id, inbound_id=i.id, role="user", content=with_attachments(SAID, [file])),
                m.Message(conversation_id=c.id, inbound_id=i.id, role="assistant", agent="triage", content="Sorry!"),
                m.Handoff(conversation_id=c.id, from_agent="triage", to_agent="billing", reason="refund for Erika"),
                m.ToolRun(
                    conversation_id=c.id,
                    agent="billing",
                    call_id="call-1",
                    tool="lookup_order",
                    arguments='{"order_id": "100234"}',
                    ok=True,
                    output="Erika Mustermann, Hauptstr. 1",
                    duration_ms=12.5,
                ),
                m.LLMCall(
                    conversation_id=c.id,
                    model="gpt-test",
                    ok=False,
                    error="rejected: Erika's IBAN",
                    prompt_tokens=1000,
                    completion_tokens=200,
                    cached_tokens=300,
                    latency_ms=800,
                ),
            ]
        )
        e = m.Escalation(
            conversation_id=c.id,
            status=case,
            reason="Erika wants a person",
            trigger="customer",
            agent="triage",
            customer="U_ERIKA",
            claimed_by="U_STAFF",
            claimed_at=then + timedelta(minutes=5),
            first_response_at=then + timedelta(minutes=7),
            closed_at=then + timedelta(minutes=30) if case == "resolved" else None,
            created_at=then,
        )
        s.add(e)
        await s.flush()
        s.add_all(
            [
                m.Csat(
                    escalation_id=e.id,
                    conversation_id=c.id,
                    customer="U_ERIKA",
                    agent="triage",
                    trigger="customer",
                    resolved_by="U_STAFF",
                    rating=4,
                    comment="Sam was kind to Erika",
                    asked_at=then,
                    rated_at=then,
                ),
                m.Outbox(
                    conversation_id=c.id,
                    kind="post",
                    channel="C_SUPPORT",
                    text="Sorry!",
                    done_at=then,
                    outcome="sent",
                    result_ts="1.000001",
                ),
                m.Outbox(conversation_id=c.id, kind="reaction", channel="C_SUPPORT", reaction="eyes", done_at=then),
            ]
        )
        for table in (m.Message, m.Handoff, m.ToolRun, m.LLMCall, m.Outbox):
            await s.execute(update(table).where(table.conversation_id == c.id).values(created_at=then))
        await s.execute(
            update(m.Conversation)
            .where(m.Conversation.id == c.id)
            .values(
                created_at=then,
                updated_at=active,
                lease_owner="worker-1" if leased else None,
                lease_until=NOW + timedelta(seconds=30) if leased else None,
            )
        )
        return c.id


async def held(sessions: Sessions, conversation: int) -> dict[str, Any]:
    """Everything of the conversation that holds text."""
    async with sessions() as s:
        c = await s.get(m.Conversation, conversation)
        assert c is not None
        where = {t: t.conversation_id == conversation for t in (m.Message, m.Inbound, m.ToolRun, m.LLMCall)}
        return {
            "context": c.context,
            "summary": c.summary,
            "messages": list(await s.scalars(select(m.Message.content).where(where[m.Message]).order_by(m.Message.id))),
            "inbound": (
                await s.execute(select(m.Inbound.text, m.Inbound.files, m.Inbound.identity).where(where[m.Inbound]))
            ).one(),
            "tool": (await s.execute(select(m.ToolRun.arguments, m.ToolRun.output).where(where[m.ToolRun]))).one(),
            "llm_error": await s.scalar(select(m.LLMCall.error).where(where[m.LLMCall])),
            "case_reason": await s.scalar(
                select(m.Escalation.reason).where(m.Escalation.conversation_id == conversation)
            ),
            "comment": await s.scalar(select(m.Csat.comment).where(m.Csat.conversation_id == conversation)),
            "outbox": list(
                (
                    await s.execute(
                        select(m.Outbox.kind, m.Outbox.text)
                        .where(m.Outbox.conversation_id == conversation)
                        .order_by(m.Outbox.id)
                    )
                ).all()
            ),
        }


async def totals(sessions: Sessions) -> tuple[Any, ...]:
    """What the operator reports on: /support stats (over ten years) without its latest comments, and the tool
    tallies."""
    queries = AdminQueries(sessions=sessions)
    usage = dataclasses.replace(await queries.usage(3650), csat_comments=())
    return usage, (await queries.tool_calls(3650)).tallies


async def test_an_idle_conversation_past_every_period_keeps_its_numbers_and_loses_its_text(sessions: Sessions) -> None:
    old = await seed(sessions, "slack:T:C:1", days_ago=400)
    fresh = await seed(sessions, "slack:T:C:2", days_ago=2)
    before, fresh_before = await totals(sessions), await held(sessions, fresh)

    erased = await Retention(sessions, DEFAULTS).run(now=NOW)

    assert erased == {Kind.TRANSCRIPTS: 1, Kind.TOOL_RESULTS: 1, Kind.LLM_CALLS: 1}  # the files went with the rest
    gone = await held(sessions, old)
    assert gone["context"] == {} and gone["summary"] is None and gone["messages"] == []
    assert gone["inbound"] == ("", None, None)
    assert gone["tool"] == ("", "") and gone["llm_error"] is None
    assert gone["case_reason"] == "" and gone["comment"] is None
    assert gone["outbox"] == [("post", None)]  # the post's address stays, for forgetting its person later
    async with sessions() as s:
        outcome = await s.scalar(select(m.Inbound.outcome).where(m.Inbound.conversation_id == old))
    assert outcome is not None
    kept = MessageResult.from_json(0, old, outcome)  # still what any process can read back, without the words
    assert (kept.kind, kept.reply, kept.handoffs, kept.escalation_reason) == (ResultKind.ESCALATED, None, (), None)
    assert await held(sessions, fresh) == fresh_before
    assert await totals(sessions) == before  # messages, cases and their times, ratings, tokens, tool calls


async def test_each_kind_has_its_own_period(sessions: Sessions) -> None:
    """Idle 100 days: past the files', tool results', LLM calls' and outbox's periods, not the transcripts'."""
    conversation = await seed(sessions, "slack:T:C:1", days_ago=100)
    before = await totals(sessions)

    erased = await Retention(sessions, DEFAULTS).run(now=NOW)

    assert erased == {Kind.FILES: 1, Kind.TOOL_RESULTS: 1, Kind.LLM_CALLS: 1, Kind.OUTBOX: 2}
    now = await held(sessions, conversation)
    assert now["messages"] == [
        f"{SAID}\n\n[Attached file invoice.txt: its text was erased after the retention period]",
        "Sorry!",
    ]
    assert now["inbound"][0] == SAID and now["inbound"][1] is None
    assert now["tool"] == ("", "") and now["llm_error"] is None
    assert now["outbox"] == [("post", None)]  # the post's address stays, for edits and forgetting; the reaction goes
    assert now["context"] == {"order": "100234"} and now["comment"] == "Sam was kind to Erika"
    assert await totals(sessions) == before
    assert await Retention(sessions, DEFAULTS).run(now=NOW) == {}  # nothing left to erase: the next run finds none


async def test_a_conversation_active_lately_keeps_its_old_messages(sessions: Sessions) -> None:
    conversation = await seed(sessions, "slack:T:C:1", days_ago=400, active_days_ago=3)
    before = await held(sessions, conversation)
    assert await Retention(sessions, DEFAULTS).run(now=NOW) == {}
    assert await held(sessions, conversation) == before


async def test_a_conversation_under_way_is_not_touched(sessions: Sessions) -> None:
    leased = await seed(sessions, "slack:T:C:1", days_ago=400, leased=True)
    with_a_person = await seed(sessions, "slack:T:C:2", days_ago=400, case="claimed")
    waiting = await seed(sessions, "slack:T:C:3", days_ago=400)
    async with sessions() as s, s.begin():
        await s.execute(update(m.Inbound).where(m.Inbound.conversation_id == waiting).values(processed_at=None))
    before = [await held(sessions, c) for c in (leased, with_a_person, waiting)]

    assert await Retention(sessions, DEFAULTS).run(now=NOW) == {}
    assert [await held(sessions, c) for c in (leased, with_a_person, waiting)] == before


async def test_a_period_of_zero_keeps_for_ever(sessions: Sessions) -> None:
    conversation = await seed(sessions, "slack:T:C:1", days_ago=4000)
    before = await held(sessions, conversation)
    assert await Retention(sessions, Periods({})).run(now=NOW) == {}
    assert await held(sessions, conversation) == before


async def test_batches_are_bounded_and_the_backlog_is_worked_off(sessions: Sessions) -> None:
    for n in range(5):
        await seed(sessions, f"slack:T:C:{n}", days_ago=400)
    transcripts = Periods({Kind.TRANSCRIPTS: 365})
    assert await Retention(sessions, transcripts, batch=1).run(now=NOW) == {Kind.TRANSCRIPTS: 4}
    assert await Retention(sessions, transcripts, batch=1).run(now=NOW) == {Kind.TRANSCRIPTS: 1}
    async with sessions() as s:
        assert await s.scalar(select(func.count()).select_from(m.Message)) == 0


def test_file_text_comes_out_and_the_rest_stays() -> None:
    files = [
        Attachment("a.txt", "text/plain", text="first\n\n[Attached file b.txt]\nsecond"),
        Attachment("photo.png", "image/png", problem="not shown"),
        Attachment("c.pdf", "application/pdf", problem="not a readable PDF"),
    ]
    assert without_file_text(with_attachments("hello\n\nthere", files)) == (
        "hello\n\nthere\n\n[Attached file a.txt: its text was erased after the retention period]\n\n"
        "[Attached file b.txt: its text was erased after the retention period]\n\n"
        "[Image sent: photo.png (image/png) (the assistant cannot view images: not shown)]\n\n"
        "[Attached file c.pdf (application/pdf): it could not be read: not a readable PDF]"
    )


async def test_support_status_shows_the_periods_and_what_the_bot_erased(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    """The bot's own housekeeping erases at start-up what is past its period; /support status says so."""
    await seed(sessions, "slack:T:C:1", days_ago=400)
    await seed(sessions, "slack:T:C:2", days_ago=1)
    async with serving_as_shipped(database_url, fake_llm, emulator, retention_llm_calls_days=0):

        async def erased() -> bool:
            async with sessions() as s:
                return bool(await s.scalar(select(func.count()).select_from(m.RetentionLog)))

        await until(erased)
        body = shown(await support(emulator, "status"))
    assert "Transcripts (365 days): 1 conversation(s) held, 1 erased in the last 24 h" in body
    assert "Tool results (90 days): 1 row(s) held, 1 erased in the last 24 h" in body
    assert "LLM call records (kept for ever): 2 row(s) held, 0 erased in the last 24 h" in body


async def test_a_message_that_arrives_while_a_transcript_is_erased_is_left_for_its_turn(sessions: Sessions) -> None:
    """It commits after the conversation was found idle, before its messages are blanked: a trigger on the first
    erase stands in for that moment."""
    old = await seed(sessions, "slack:T:C:1", days_ago=400)
    async with sessions() as s, s.begin():
        await s.execute(
            text(
                "CREATE FUNCTION test_arrives() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "INSERT INTO inbound (conversation_id, text, author, kind, external_id) "
                f"VALUES ({old}, 'it smokes again', 'U_ERIKA', 'customer', 'late'); RETURN NULL; END $$"
            )
        )
        await s.execute(text("CREATE TRIGGER test_arrives AFTER DELETE ON messages EXECUTE FUNCTION test_arrives()"))
    try:
        assert Kind.TRANSCRIPTS in await Retention(sessions, Periods({Kind.TRANSCRIPTS: 365})).run(now=NOW)
    finally:
        async with sessions() as s, s.begin():
            await s.execute(text("DROP TRIGGER test_arrives ON messages"))
            await s.execute(text("DROP FUNCTION test_arrives()"))
    async with sessions() as s:
        said = set(await s.scalars(select(m.Inbound.text).where(m.Inbound.conversation_id == old)))
    assert said == {"", "it smokes again"}
