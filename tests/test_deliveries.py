"""The outbox's deliveries: a closed set of typed values that round-trip through their `outbox` rows, one sender
that posts them, and escalation that renders without posting."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agents.db import deliveries as d
from agents.db import models as m
from agents.db.deliveries import KINDS, Delivery, Outcome, delivery_of, enqueue, row_of
from agents.db.engine import make_engine
from agents.db.statements import Statement, alone
from bot.channels.capabilities import Channels
from bot.delivery.ledger import _RELEASE, DUE_BATCH, Ledger
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
    # The due conversations, the lease, the rows, the answer's attempt (which reads the preview it may finish, in
    # the same statement) and its claim, and the release.
    assert DriverLog.first_words(statements) == ["WITH", "INSERT", "SELECT", "WITH", "UPDATE", "WITH"]
    assert "JOIN previews" in statements[3]
    assert "DELETE FROM send_leases" in statements[-1]
    message = emulator.message("C_SUPPORT", ts)
    assert message is not None and set(message.reactions) == {"white_check_mark"}
    async with sessions() as s:
        rows = (await s.execute(select(m.Outbox.outcome, m.Outbox.attempts).order_by(m.Outbox.id))).all()
    assert [tuple(row) for row in rows] == [(Outcome.SENT, 1)] * 4


async def test_a_notice_before_an_answer_reads_nothing_between_its_attempt_and_its_post(
    sessions: Sessions, engine: AsyncEngine, emulator: SlackEmulator
) -> None:
    """A handoff's notice while the customer watches a preview, the answer queued after it: the notice is posted on
    its own and the answer finishes the preview. Whether an answer follows comes with the notice's attempt, so that
    nothing is read between an attempt and its post: a read that failed there would leave in doubt a post never
    made, which a channel that cannot find its posts gives up."""
    ts = emulator.add_message("C_SUPPORT", "is the Harrier X4 waterproof?").ts
    async with sessions() as s, s.begin():
        conversation = m.Conversation(key=f"slack:T0001:C_SUPPORT:{ts}", active_agent="triage")
        s.add(conversation)
        await s.flush()
        s.add(m.Preview(conversation_id=conversation.id, platform="slack", channel="C_SUPPORT", thread=ts))
    async with sessions() as s, s.begin():  # the turn's commit, after its preview began
        notice = d.Post(conversation.id, "C_SUPPORT", ts, "Connecting you with Sales.")
        await enqueue(s, [notice, d.Post(conversation.id, "C_SUPPORT", ts, "It is.", answer=True)])
    async with sessions() as s:  # written through SQLAlchemy: a notice's sources are SQL's NULL, not JSON's null
        assert (await s.scalars(select(m.Outbox.sources.is_(None)).order_by(m.Outbox.id))).all() == [True, False]
    with DriverLog(engine) as driver:
        assert await _sender(engine, emulator).send_pending() == 2
        statements = await driver.settled()
    attempts = [n for n, sql in enumerate(statements) if "JOIN previews" in sql]
    assert len(attempts) == 2
    assert [statements[n + 1].split()[0] for n in attempts] == ["UPDATE", "BEGIN"]  # the claims: the answer's closes
    assert not any("SELECT EXISTS" in sql for sql in statements)
    assert next(p.text for p in emulator.posts("C_SUPPORT", ts)) == "Connecting you with Sales."
    async with sessions() as s:
        assert await s.scalar(select(m.Preview.state)) == "finished"


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


def _sender(engine: AsyncEngine, emulator: SlackEmulator, owner: str = "", lease_s: float = 30.0) -> OutboxSender:
    client = slack_client(token="xoxb-test", base_url=emulator.api_url, idempotent_only=True)
    messengers = [SlackMessenger(client)]
    return OutboxSender(engine=engine, channels=Channels([SLACK]), messengers=messengers, owner=owner, lease_s=lease_s)


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


async def test_a_conversation_that_waited_past_its_lease_in_a_pass_reads_its_rows_again(
    sessions: Sessions, engine: AsyncEngine, emulator: SlackEmulator
) -> None:
    """Its rows were read with the pass's other conversations; it waited its turn longer than its lease, and another
    sender took it meanwhile, added the 👀 and took it away again. Its stale rows are not sent: the 👀 stays gone."""
    lease_s = 1.0
    await _conversation(sessions, emulator, lambda c, ts: [d.Post(c, "C_SUPPORT", ts, "a slow one")], "q1")
    c2, ts2 = await _conversation(sessions, emulator, lambda c, ts: [d.AddReaction(c, "C_SUPPORT", ts, "eyes")], "q2")
    a, b = _sender(engine, emulator, "A", lease_s), _sender(engine, emulator, "B", lease_s)
    stalled, go_on = asyncio.Event(), asyncio.Event()

    async def stall_once() -> None:
        if not stalled.is_set():
            stalled.set()
            await go_on.wait()

    passing = asyncio.create_task(a.send_pending(concurrency=1, pace=stall_once))
    await asyncio.wait_for(stalled.wait(), 10)
    await asyncio.sleep(lease_s * 1.5)  # the second conversation waits behind the first; its lease runs out
    assert await b.send_pending() == 1  # B takes it: the working reaction
    async with sessions() as s, s.begin():  # its turn ends: the reaction taken away
        await enqueue(s, [d.RemoveReaction(c2, "C_SUPPORT", ts2, "eyes")])
    assert await b.send_pending() == 1
    go_on.set()
    await asyncio.wait_for(passing, 10)
    message = emulator.message("C_SUPPORT", ts2)
    assert message is not None and not message.reactions


async def _give_back(engine: AsyncEngine, owner: str, keys: list[int]) -> None:
    async with alone(engine)() as conn:
        await _RELEASE.run(conn, {"keys": keys, "o": owner, "changed": []})


async def test_a_batched_release_and_another_senders_leases_lock_in_the_same_order(
    sessions: Sessions, engine: AsyncEngine, database_url: str
) -> None:
    """A holds conversations 2 and 1 (their rows in that order on disk); B leases both, in key order, while A gives
    both back in one statement that reads the table in its order on disk (as the planner does on a small table; here
    told to). Both lock in key order, so neither deadlocks."""
    other = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    a_engine = make_engine(database_url, pool_size=1)
    try:
        async with alone(a_engine)() as conn:  # A's one connection scans tables in their order on disk
            await Statement("SET enable_indexscan = off").run(conn, {})
            await Statement("SET enable_bitmapscan = off").run(conn, {})
        await other.execute("DELETE FROM send_leases")
        await other.execute(
            "INSERT INTO send_leases VALUES (2, 'A', now() + interval '30 s'), (1, 'A', now() + interval '30 s')"
        )
        async with other.transaction():  # holds lease 1 a moment, so that both statements start before either ends
            await other.execute("SELECT FROM send_leases WHERE conversation_id = 1 FOR UPDATE")
            b = asyncio.create_task(Ledger(engine=engine, owner="B", lease_s=30.0).lease_each([1, 2]))
            await asyncio.sleep(0.3)
            released = asyncio.create_task(_give_back(a_engine, "A", [1, 2]))  # A's statement: both together
            await asyncio.sleep(0.3)
        results = await asyncio.wait_for(asyncio.gather(b, released, return_exceptions=True), 10)
        assert [r for r in results if isinstance(r, BaseException)] == []
        await other.execute("DELETE FROM send_leases")
    finally:
        await other.close()
        await a_engine.dispose()


async def test_a_release_that_went_with_a_failed_statement_fails_too(
    sessions: Sessions, engine: AsyncEngine, database_url: str
) -> None:
    """Releases asked for while one is in flight go together in the next statement; when that statement fails
    (here cancelled by the server), each of them fails, and none reports its lease given back."""
    url = database_url.replace("postgresql+asyncpg://", "postgresql://")
    ledger = Ledger(engine=engine, owner="A", lease_s=30.0)
    assert await ledger.lease_each([1, 2, 3]) == {1, 2, 3}
    admin_, holder = await asyncpg.connect(url), await asyncpg.connect(url)

    async def cancel_the_waiting_release() -> None:
        for _ in range(100):
            waiting = await admin_.fetch(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE '%send_leases%FOR UPDATE%' "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if waiting:
                await admin_.execute("SELECT pg_cancel_backend($1)", waiting[0]["pid"])
                return
            await asyncio.sleep(0.05)
        raise AssertionError("no release waiting")

    try:
        async with holder.transaction():
            await holder.execute("SELECT FROM send_leases WHERE conversation_id IN (1, 2) FOR UPDATE")
            first = asyncio.create_task(ledger.release(1))  # in flight, waiting for the holder's locks
            await asyncio.sleep(0.2)
            together = [asyncio.create_task(ledger.release(key)) for key in (2, 3)]  # the next statement
            await asyncio.sleep(0.2)
            await cancel_the_waiting_release()
            await asyncio.sleep(0.2)
            await cancel_the_waiting_release()
            results = await asyncio.gather(first, *together, return_exceptions=True)
        assert all(isinstance(r, Exception) for r in results), results
        assert await ledger.lease_each([1, 2, 3]) == {1, 2, 3}  # still A's: taken again, and given back now
        await asyncio.gather(*(ledger.release(key) for key in (1, 2, 3)))
        assert await admin_.fetchval("SELECT count(*) FROM send_leases") == 0
    finally:
        await admin_.close()
        await holder.close()


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
