"""The outbox's deliveries: a closed set of typed values that round-trip through their `outbox` rows, one sender
that posts them, and escalation that renders without posting."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import event, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agents.db import deliveries as d
from agents.db import models as m
from agents.db.deliveries import KINDS, Delivery, Outcome, delivery_of, enqueue, row_of
from bot.channels.capabilities import Channels
from bot.delivery.ledger import DUE_BATCH, Ledger
from bot.delivery.sender import OutboxSender
from bot.playground.slack_emulator import SlackEmulator
from bot.slack.app import slack_client
from bot.slack.channel import SLACK
from bot.slack.messenger import SlackMessenger
from harness.database import DriverLog
from harness.slack_calls import calls
from tests import ROOT

Sessions = async_sessionmaker[AsyncSession]


def examples(conversation_id: int = 1, escalation_id: int = 1) -> list[Delivery]:
    """One of each kind, every field set to a value no other field has."""
    c, e = conversation_id, escalation_id
    return [
        d.Post(c, "C_SUPPORT", "1.000001", "hello"),
        d.Post(c, "D_DIRECT", None, "a direct message"),
        d.Answer(c, "C_SUPPORT", "1.000009", "**an** answer"),
        d.AddReaction(c, "C_SUPPORT", "1.000002", "eyes"),
        d.RemoveReaction(c, "C_SUPPORT", "1.000003", "white_check_mark"),
        d.Typing(c, "19:chat@thread.tacv2", "1700000000005"),
        d.CasePost(c, e, "C_STAFF"),
        d.CaseUpdate(c, e),
        d.RelayToStaff(c, e, "U_CUSTOMER", "hello? anyone?"),
        d.RelayToCustomer(c, e, "C_SUPPORT", "1.000004", "U_STAFF", "Sam here.", "2.000001"),
        d.RelayEdit(c, e, "2.000002", "Sam here, edited."),
        d.RelayDelete(c, e, "2.000003"),
        d.Reminder(c, e, "Case #1 has waited 16 min"),
        d.StaffNotice(c, e, "U_GUEST", "Only the support team can reply."),
        d.CsatAsk(c, e, "C_SUPPORT", "1.000005", "How did we do?"),
        d.FilesToStaff(c, e, "U_CUSTOMER", "my receipt", "1.000015"),
        d.FilesToCustomer(c, e, "C_SUPPORT", "1.000016", "U_STAFF", "2.000004"),
        d.Erase(c, 7),
        d.Erase(c, None, "C_SUPPORT", "1.000017", "1.000018"),
    ]


def test_every_delivery_kind_round_trips_through_its_row() -> None:
    owed = examples()
    assert {type(d) for d in owed} == set(KINDS.values())  # an example of every kind, so a new one is tested too
    assert len(KINDS) == len({cls.kind for cls in KINDS.values()})
    for delivery in owed:
        row = row_of(delivery)
        assert row["kind"] == delivery.kind and delivery_of(row) == delivery
        assert set(row) <= {c.name for c in m.Outbox.__table__.columns}
    with pytest.raises(ValueError, match="unknown outbox kind 'carrier_pigeon'"):
        delivery_of(row_of(owed[0]) | {"kind": "carrier_pigeon"})


async def test_deliveries_round_trip_through_the_outbox_table(sessions: Sessions, engine: AsyncEngine) -> None:
    async with sessions() as s, s.begin():
        conversation = m.Conversation(key="slack:T0001:C_SUPPORT:1.000001", active_agent="triage")
        s.add(conversation)
        await s.flush()
        escalation = m.Escalation(conversation_id=conversation.id, reason="r", trigger="tool", agent="triage")
        s.add(escalation)
        await s.flush()
        owed = examples(conversation.id, escalation.id)
        await enqueue(s, owed)
    async with engine.connect() as conn:
        rows = (await conn.execute(select(m.Outbox).order_by(m.Outbox.id))).all()
    assert [delivery_of(r._mapping) for r in rows] == owed


async def test_a_row_of_an_unknown_kind_is_given_up_not_retried(
    sessions: Sessions, engine: AsyncEngine, emulator: SlackEmulator
) -> None:
    async with sessions() as s, s.begin():
        conversation = m.Conversation(key="slack:T0001:C_SUPPORT:1.000001", active_agent="triage")
        s.add(conversation)
        await s.flush()
        s.add(m.Outbox(conversation_id=conversation.id, kind="carrier_pigeon", channel="C_SUPPORT"))
        await enqueue(s, [d.Post(conversation.id, "C_SUPPORT", None, "after the pigeon")])
    client = slack_client(token="xoxb-test", base_url=emulator.api_url, idempotent_only=True)
    assert (
        await OutboxSender(
            engine=engine, channels=Channels([SLACK]), messengers=[SlackMessenger(client)]
        ).send_pending()
        == 1
    )  # the pigeon is given up, not sent
    async with sessions() as s:
        pigeon, post = (await s.scalars(select(m.Outbox).order_by(m.Outbox.id))).all()
    assert pigeon.outcome == Outcome.GIVEN_UP and pigeon.last_error == "unknown outbox kind 'carrier_pigeon'"
    assert post.result_ts is not None and [p.text for p in emulator.posts("C_SUPPORT")] == ["after the pigeon"]


async def _conversations(engine: AsyncEngine, n: int) -> list[int]:
    async with engine.begin() as conn:
        made = await conn.execute(
            text(
                "INSERT INTO conversations (key, active_agent) "
                "SELECT 'slack:T0001:C_SUPPORT:' || i, 'triage' FROM generate_series(1, :n) i RETURNING id"
            ),
            {"n": n},
        )
        return sorted(made.scalars())


async def _queue(engine: AsyncEngine, conversation_id: int | None, rows: int, *, backoff: bool = False) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO outbox (conversation_id, kind, channel, text, next_attempt_at) "
                "SELECT :c, 'post', 'C_SUPPORT', 'words', CASE WHEN :backoff AND i = 1 "
                "THEN now() + interval '1 hour' END FROM generate_series(1, :rows) i"
            ),
            {"c": conversation_id, "rows": rows, "backoff": backoff},
        )


async def test_due_conversations_are_each_found_once_past_long_queues_and_backoffs(
    sessions: Sessions, engine: AsyncEngine
) -> None:
    """A conversation with a long queue is one of the due, one whose first row waits out a backoff is none, nor is
    one whose rows are all done; more than a pass takes are all reached by the next pass, which goes on after the
    last one taken, then the search begins from the first again."""
    waiting, long, done, *rest = await _conversations(engine, DUE_BATCH + 53)
    await _queue(engine, waiting, 30, backoff=True)
    await _queue(engine, long, 500)
    await _queue(engine, done, 3)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE outbox SET done_at = now(), outcome = 'sent' WHERE conversation_id = :c"), {"c": done}
        )
    for conversation_id in reversed(rest):  # the newest conversation's rows the oldest
        await _queue(engine, conversation_id, 2)
    await _queue(engine, None, 2)
    ledger = Ledger(engine=engine, owner="test", lease_s=30.0)
    first, second, third = await ledger.due(), await ledger.due(), await ledger.due()
    due = [long, *rest]
    assert len([c for c, _ in first if c is not None]) == DUE_BATCH
    found = [c for c, _ in first + second if c is not None]
    assert sorted(found) == due  # each once
    assert [c for c, _ in first if c is None] == [c for c, _ in second if c is None] == [None]  # in every pass
    assert [c for c, _ in first] == [long, *reversed(due[1:DUE_BATCH]), None]  # the oldest first row first
    assert first[0] == (long, "slack:T0001:C_SUPPORT:2")  # with its key
    assert third == first


async def test_a_row_queued_while_its_conversation_is_sent_goes_out_next_pass_in_order(
    sessions: Sessions, engine: AsyncEngine, emulator: SlackEmulator
) -> None:
    """A pass that read fewer rows than it could does not read the conversation again: what was queued meanwhile
    rang the sender (NOTIFY, the doorbell), and the send loop runs another pass at once after one that sent. Every
    statement of a pass is a transaction by itself (no BEGIN, no COMMIT)."""
    conversation, ts = await _conversation(
        sessions,
        emulator,
        lambda c, ts: [d.AddReaction(c, "C_SUPPORT", ts, "eyes"), d.Post(c, "C_SUPPORT", ts, "first")],
    )
    sender = _sender(engine, emulator)
    queued: list[int] = []

    async def queue_once() -> None:
        if not queued:
            async with sessions() as s, s.begin():
                await enqueue(s, [d.Post(conversation, "C_SUPPORT", ts, "second")])
            queued.append(1)

    through_sqlalchemy: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        through_sqlalchemy.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", seen)
    try:
        with DriverLog(engine) as driver:
            assert await sender.send_pending(pace=queue_once) == 2
            statements = await driver.settled()
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", seen)
    # The test's own INSERT goes through SQLAlchemy in a transaction; each of the sender's statements runs alone.
    assert [sql.split()[0] for sql in through_sqlalchemy] == ["INSERT"]
    assert DriverLog.first_words(statements).count("BEGIN") == 1  # the test's
    reads = [sql for sql in statements if "AS spoken_language" in sql]  # the rows to send read
    assert len(reads) == 1
    assert [p.text for p in emulator.posts("C_SUPPORT", ts)] == ["first"]
    assert await sender.send_pending() == 1
    assert [p.text for p in emulator.posts("C_SUPPORT", ts)] == ["first", "second"]


async def test_changes_are_marked_done_with_the_release_of_the_lease(
    sessions: Sessions, engine: AsyncEngine, emulator: SlackEmulator
) -> None:
    """A reaction costs its call and no statement of its own: the changes made under a send lease are marked done
    in the statement that releases it. The post between them keeps its attempt, recorded before it is made."""
    conversation, ts = await _conversation(
        sessions, emulator, lambda c, ts: [d.AddReaction(c, "C_SUPPORT", ts, "eyes")]
    )
    sender = _sender(engine, emulator)
    assert await sender.send_pending() == 1  # the working reaction, while the turn runs
    async with sessions() as s, s.begin():
        await enqueue(
            s,
            [
                d.Post(conversation, "C_SUPPORT", ts, "the answer"),
                d.RemoveReaction(conversation, "C_SUPPORT", ts, "eyes"),
                d.AddReaction(conversation, "C_SUPPORT", ts, "white_check_mark"),
            ],
        )
    with DriverLog(engine) as driver:
        assert await sender.send_pending() == 3
        statements = await driver.settled()
    # The due conversations, the lease, the rows, the answer's look for a preview to finish, its attempt and its
    # claim, and the release.
    assert DriverLog.first_words(statements) == ["WITH", "INSERT", "SELECT", "SELECT", "UPDATE", "UPDATE", "WITH"]
    assert "DELETE FROM send_leases" in statements[-1]
    message = emulator.message("C_SUPPORT", ts)
    assert message is not None and set(message.reactions) == {"white_check_mark"}
    async with sessions() as s:
        rows = (await s.execute(select(m.Outbox.outcome, m.Outbox.attempts).order_by(m.Outbox.id))).all()
    assert [tuple(row) for row in rows] == [(Outcome.SENT, 1)] * 4


async def _conversation(
    sessions: Sessions, emulator: SlackEmulator, owed: Callable[[int, str], list[Delivery]], text: str = "hi"
) -> tuple[int, str]:
    """A customer's message in the emulator's support channel and its conversation, with `owed(conversation id,
    the message's ts)` queued: (conversation id, ts)."""
    root = emulator.add_message("C_SUPPORT", text)
    async with sessions() as s, s.begin():
        conversation = m.Conversation(key=f"slack:T0001:C_SUPPORT:{root.ts}", active_agent="triage")
        s.add(conversation)
        await s.flush()
        await enqueue(s, owed(conversation.id, root.ts))
    return conversation.id, root.ts


def _sender(engine: AsyncEngine, emulator: SlackEmulator) -> OutboxSender:
    client = slack_client(token="xoxb-test", base_url=emulator.api_url, idempotent_only=True)
    return OutboxSender(engine=engine, channels=Channels([SLACK]), messengers=[SlackMessenger(client)])


async def _conversations_with_a_post(sessions: Sessions, emulator: SlackEmulator, n: int) -> list[int]:
    ids = []
    for i in range(n):
        answer = f"answer {i}"
        cid, _ = await _conversation(
            sessions, emulator, lambda c, ts, answer=answer: [d.Post(c, "C_SUPPORT", ts, answer)], f"q {i}"
        )
        ids.append(cid)
    return ids


async def test_a_pass_leases_its_conversations_and_reads_their_rows_in_a_statement_each(
    sessions: Sessions, engine: AsyncEngine, emulator: SlackEmulator
) -> None:
    """Under load many conversations are due at once: their leases are one statement and their rows another, not
    two per conversation. A conversation another sender holds is left to it; the rest go out."""
    ids = await _conversations_with_a_post(sessions, emulator, 5)
    other = Ledger(engine=engine, owner="another sender", lease_s=30.0)
    assert await other.lease(ids[2])
    sender = _sender(engine, emulator)
    with DriverLog(engine) as driver:
        assert await sender.send_pending() == 4
        statements = await driver.settled()
    leases = [sql for sql in statements if sql.startswith("INSERT INTO send_leases")]
    reads = [sql for sql in statements if "AS spoken_language" in sql]
    assert len(leases) == 1 and len(reads) == 1
    assert sorted(p.text for p in emulator.posts("C_SUPPORT") if p.text.startswith("answer")) == [
        f"answer {i}" for i in (0, 1, 3, 4)
    ]
    await other.release(ids[2])
    assert await sender.send_pending() == 1


async def test_a_pass_cancelled_before_its_conversations_are_sent_gives_their_leases_back(
    sessions: Sessions, engine: AsyncEngine, emulator: SlackEmulator
) -> None:
    ids = await _conversations_with_a_post(sessions, emulator, 3)
    sender = _sender(engine, emulator)
    stuck, forever = asyncio.Event(), asyncio.Event()

    async def stall() -> None:
        stuck.set()
        await forever.wait()

    sending = asyncio.create_task(sender.send_pending(concurrency=1, pace=stall))
    await asyncio.wait_for(stuck.wait(), 10)
    async with sessions() as s:
        held = set(await s.scalars(select(m.SendLease.conversation_id)))
    assert held == set(ids)  # all three leased, one of them being sent
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    async with sessions() as s:
        assert list(await s.scalars(select(m.SendLease.conversation_id))) == []
    assert await sender.send_pending() == 3


def _imports(path: Any) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


def test_escalation_renders_and_never_imports_the_bot_or_a_slack_client() -> None:
    for path in sorted((ROOT / "escalation").rglob("*.py")):
        forbidden = {i for i in _imports(path) if i.split(".")[0] in ("bot", "slack_sdk", "slack_bolt")}
        assert not forbidden, f"{path.relative_to(ROOT)} imports {forbidden}"


def test_only_the_sender_posts_edits_deletes_or_reacts() -> None:
    """Through its Slack messenger, which makes the calls the sender decides on (and nothing else makes them)."""
    changing = {"chat.postMessage", "chat.update", "chat.delete", "reactions.add", "reactions.remove"}
    callers = {call.where.split(":")[0] for call in calls() if call.method in changing}
    assert callers == {"bot/slack/messenger.py"}
