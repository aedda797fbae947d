"""Leases instead of held locks: one holder per conversation, a fence on every commit, take-over at expiry.
Real Postgres, the real `openai` client against the fake server; two `Conversations` with different owners
stand for two processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from agents.conversations import Conversations
from agents.db import models as m
from agents.db.deliveries import AddReaction, Outcome, Post, RemoveReaction, enqueue
from agents.leases import LeaseLost, Leases
from agents.model import OpenAIChatModel
from bot.channels.capabilities import Channels
from bot.delivery.sender import OutboxSender
from bot.metrics import Metrics
from bot.runtime.workers import Workers
from bot.slack.app import slack_client
from bot.slack.channel import SLACK
from bot.slack.messenger import SlackMessenger
from escalation.machine import TAKEOVER
from fakes.openai_server import FakeOpenAI, reply, slow
from harness.database import count
from harness.llm import CONFIG
from harness.sample import default_roster

Sessions = async_sessionmaker[AsyncSession]


def process(sessions: Sessions, model: OpenAIChatModel, owner: str, ttl_s: float = 30.0) -> Conversations:
    leases = Leases(sessions, owner=owner, ttl_s=ttl_s)
    return Conversations(
        takeover=TAKEOVER, sessions=sessions, roster=default_roster(), model=model, config=CONFIG, leases=leases
    )


async def replies(sessions: Sessions, conversation_id: int) -> list[str]:
    async with sessions() as s:
        rows = await s.scalars(
            select(m.Message.content)
            .where(m.Message.conversation_id == conversation_id, m.Message.role == "assistant")
            .order_by(m.Message.id)
        )
        return [r or "" for r in rows]


async def test_a_stalled_holder_cannot_commit_after_its_lease_expired(
    sessions: Sessions, model: OpenAIChatModel, fake_llm: FakeOpenAI
) -> None:
    """Process A claims the conversation and stalls in its model call past the lease (no renewal, as a
    stopped process); B takes the conversation over and answers. A's late commit is refused: the message is
    answered once, by B."""
    a = process(sessions, model, "A", ttl_s=1.0)
    b = process(sessions, model, "B", ttl_s=1.0)
    submitted = await a.submit("test:stall", "hello?")
    fake_llm.script(slow(2.5, reply("late answer")), reply("on-time answer"))
    [lease_a] = await a.leases.claim_pending(10)
    stalled = asyncio.create_task(a.run_one(lease_a))
    await asyncio.sleep(1.3)  # A's lease has expired; A is still waiting for the model
    [lease_b] = await b.leases.claim_pending(10)
    assert lease_b.token > lease_a.token
    result = await b.run_one(lease_b)
    assert result is not None and result.reply == "on-time answer"
    with pytest.raises(LeaseLost):
        await stalled
    assert await replies(sessions, submitted.conversation_id) == ["on-time answer"]
    async with sessions() as s:
        inbound = await s.get(m.Inbound, submitted.inbound_id)
        assert inbound is not None and inbound.attempts == 2 and inbound.outcome is not None
        assert inbound.outcome["reply"] == "on-time answer"


async def test_two_processes_racing_for_one_conversation_answer_each_message_once_in_order(
    sessions: Sessions, model: OpenAIChatModel, fake_llm: FakeOpenAI
) -> None:
    a, b = process(sessions, model, "A"), process(sessions, model, "B")
    messages = [f"message {n}" for n in range(12)]
    for n, text in enumerate(messages):
        await (a if n % 2 else b).submit("test:race", text, external_id=str(n), order_key=f"{n:04d}")
    fake_llm.rule = lambda request: reply(f"re: {request.last_user}")

    async def drain(conversations: Conversations) -> int:
        done = 0
        while (await conversations.process_next()) is not None:
            done += 1
        return done

    done = await asyncio.gather(drain(a), drain(b), drain(a), drain(b))
    assert sum(done) == len(messages)
    state = await a.state("test:race")
    assert state is not None
    assert await replies(sessions, state.id) == [f"re: {text}" for text in messages]
    assert fake_llm.calls == len(messages)


async def test_no_holder_twice_and_expired_leases_are_taken(sessions: Sessions, model: OpenAIChatModel) -> None:
    a = process(sessions, model, "A", ttl_s=0.5)
    b = process(sessions, model, "B", ttl_s=0.5)
    submitted = await a.submit("test:claim", "hi")
    assert len(await a.leases.claim_pending(10)) == 1
    assert await b.leases.claim_pending(10) == []  # A holds it
    assert await b.leases.claim(submitted.conversation_id) is None
    await asyncio.sleep(0.6)
    taken = await b.leases.claim(submitted.conversation_id)
    assert taken is not None and taken.owner == "B"
    async with sessions() as s:
        assert await s.scalar(select(func.count()).where(m.Conversation.lease_owner == "B")) == 1


async def test_a_claim_that_meets_the_old_holders_commit_does_not_run_its_message_again(
    sessions: Sessions, model: OpenAIChatModel, fake_llm: FakeOpenAI
) -> None:
    """A's lease ran out while A was committing (nobody had taken it, so A's fence still held). B's claim waits
    for A's row lock and then finds the lease free: it must also find the message answered, not run it again
    from its older snapshot."""
    gate, committing = asyncio.Event(), asyncio.Event()

    async def held_commit(_: AsyncConnection, __: object) -> None:
        committing.set()
        await gate.wait()

    a = Conversations(
        takeover=TAKEOVER, sessions=sessions, roster=default_roster(), model=model, config=CONFIG,
        leases=Leases(sessions, owner="A", ttl_s=0.5), after_turn=held_commit,
    )  # fmt: skip
    b = process(sessions, model, "B", ttl_s=0.5)
    submitted = await a.submit("test:overlap", "hello?")
    fake_llm.script(reply("first answer"), reply("second answer"))
    [lease] = await a.leases.claim_pending(1)
    running = asyncio.create_task(a.run_one(lease))  # not renewed: the lease runs out during the commit
    await committing.wait()
    await asyncio.sleep(0.7)
    claiming = asyncio.create_task(b.process_next(submitted.conversation_id, wait_s=5))
    await asyncio.sleep(0.3)  # B's claim now waits on A's row lock
    gate.set()
    first = await running
    assert first is not None and first.reply == "first answer"
    assert await claiming is None
    assert fake_llm.calls == 1
    assert await replies(sessions, submitted.conversation_id) == ["first answer"]


# --- the dispatcher's claims -----------------------------------------------------------------------------------


class _NoOutbox:
    async def send_pending(self, **_: Any) -> int:
        return 0


async def _processed(sessions: Sessions, n: int) -> None:
    for _ in range(1000):
        if await count(sessions, m.Inbound, m.Inbound.processed_at.is_not(None)) >= n:
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{n} messages not processed")


@asynccontextmanager
async def _dispatching(service: Conversations, max_turns: int) -> AsyncIterator[Workers]:
    """Workers that claim only when rung (no polling within a test, no LISTEN)."""
    workers = Workers(conversations=service, sender=_NoOutbox(), metrics=Metrics(), max_turns=max_turns, poll_s=600)
    await workers.start()
    try:
        yield workers
    finally:
        await workers.stop()


async def test_with_no_place_left_the_next_conversation_runs_when_a_turn_ends(
    sessions: Sessions, model: OpenAIChatModel, fake_llm: FakeOpenAI
) -> None:
    """One place, two conversations waiting: the second is claimed as the first's turn ends, not at the next poll."""
    service = process(sessions, model, "A")
    fake_llm.rule = lambda _: slow(0.2, reply("Answered."))
    async with _dispatching(service, max_turns=1) as workers:
        for n in range(2):
            await service.submit(f"test:one_place{n}", "hi")
        workers.wake_turns()
        await _processed(sessions, 2)


# --- the outbox's send leases ---------------------------------------------------------------------------------


async def _one_post_queued(
    sessions: Sessions, emulator: Any, *, first: type[AddReaction] | None = None, reaction: str = "eyes"
) -> str:
    """A customer's message and the bot's answer queued for it (after a reaction on it, with `first`)."""
    root = emulator.add_message("C_SUPPORT", "hi")
    async with sessions() as s, s.begin():
        conv = m.Conversation(key=f"slack:T0001:C_SUPPORT:{root.ts}", active_agent="triage")
        s.add(conv)
        await s.flush()
        before = [first(conv.id, "C_SUPPORT", root.ts, reaction)] if first else []
        await enqueue(s, [*before, Post(conv.id, "C_SUPPORT", root.ts, "the answer")])
    return str(root.ts)


def _sender(engine: Any, emulator: Any, owner: str) -> OutboxSender:
    client = slack_client(token="xoxb-test", base_url=emulator.api_url, idempotent_only=True)
    return OutboxSender(
        engine=engine, channels=Channels([SLACK]), messengers=[SlackMessenger(client)], owner=owner, lease_s=1.0
    )


async def test_a_slow_send_keeps_its_lease_and_posts_once(sessions: Sessions, engine: Any, emulator: Any) -> None:
    """Slack holds A's post past A's lease time: A renews the lease meanwhile, so B cannot take the row over
    and post it a second time."""
    thread = await _one_post_queued(sessions, emulator)
    a, b = _sender(engine, emulator, "A"), _sender(engine, emulator, "B")
    emulator.hold("chat.postMessage")
    sending = asyncio.create_task(a.send_pending())
    await emulator.wait_for(lambda: emulator.calls_to("chat.postMessage"))
    await asyncio.sleep(1.5)  # longer than the lease
    assert await b.send_pending() == 0
    emulator.release("chat.postMessage")
    assert await sending == 1
    assert [p.text for p in emulator.posts("C_SUPPORT", thread)] == ["the answer"]


async def test_a_rate_limited_post_waits_in_the_outbox_not_in_the_client(
    sessions: Sessions, engine: Any, emulator: Any
) -> None:
    """A 429 is waited out by the outbox (Retry-After), not inside the call, so no call outlives its sender's
    lease unseen; another sender then posts it once."""
    thread = await _one_post_queued(sessions, emulator)
    a, b = _sender(engine, emulator, "A"), _sender(engine, emulator, "B")
    emulator.fail_next("chat.postMessage", status=429, retry_after=1)
    assert await a.send_pending() == 0
    async with sessions() as s:
        row = (await s.scalars(select(m.Outbox))).one()
        assert row.last_error == "ratelimited" and row.next_attempt_at is not None and row.done_at is None
    await asyncio.sleep(1.2)
    assert await b.send_pending() == 1
    assert [p.text for p in emulator.posts("C_SUPPORT", thread)] == ["the answer"]


async def test_a_working_reaction_whose_removal_is_already_queued_is_never_sent(
    sessions: Sessions, engine: Any, emulator: Any
) -> None:
    """Under load the reply can be ready before the sender gets to the :eyes: reaction: adding it and taking it
    off again would be two Slack calls nobody sees. Other reactions go out as queued."""
    root = emulator.add_message("C_SUPPORT", "hi")
    other = emulator.add_message("C_SUPPORT", "and this?", thread_ts=root.ts)
    async with sessions() as s, s.begin():
        conv = m.Conversation(key=f"slack:T0001:C_SUPPORT:{root.ts}", active_agent="triage")
        s.add(conv)
        await s.flush()
        await enqueue(
            s,
            [
                AddReaction(conv.id, "C_SUPPORT", root.ts, "eyes"),
                Post(conv.id, "C_SUPPORT", root.ts, "the answer"),
                RemoveReaction(conv.id, "C_SUPPORT", root.ts, "eyes"),
                AddReaction(conv.id, "C_SUPPORT", root.ts, "white_check_mark"),
                AddReaction(conv.id, "C_SUPPORT", other.ts, "eyes"),
            ],
        )
    assert await _sender(engine, emulator, "A").send_pending() == 3
    added = [(c.params["timestamp"], c.params["name"]) for c in emulator.calls_to("reactions.add")]
    assert added == [(root.ts, "white_check_mark"), (other.ts, "eyes")]
    assert emulator.calls_to("reactions.remove") == []
    assert [p.text for p in emulator.posts("C_SUPPORT", root.ts)] == ["the answer"]
    async with sessions() as s:
        unsent = await s.scalar(select(func.count()).select_from(m.Outbox).where(m.Outbox.done_at.is_(None)))
        skipped = await s.scalar(select(func.count()).select_from(m.Outbox).where(m.Outbox.outcome == Outcome.SKIPPED))
    assert unsent == 0 and skipped == 2


async def test_a_reaction_slack_rejects_does_not_hold_the_replies(
    sessions: Sessions, engine: Any, emulator: Any
) -> None:
    """A working reaction Slack refuses (a deleted custom emoji: invalid_name) is given up at once; the reply
    behind it goes out in the same pass instead of waiting out the reaction's backoff."""
    thread = await _one_post_queued(sessions, emulator, first=AddReaction, reaction="deleted_emoji")
    emulator.fail_next("reactions.add", status=200, error="invalid_name")
    assert await _sender(engine, emulator, "A").send_pending() == 1  # the reaction is given up, not sent
    assert [p.text for p in emulator.posts("C_SUPPORT", thread)] == ["the answer"]
    async with sessions() as s:
        ends = (await s.execute(select(m.Outbox.outcome, m.Outbox.last_error).order_by(m.Outbox.id))).all()
    assert [tuple(e) for e in ends] == [(Outcome.GIVEN_UP, "invalid_name"), (Outcome.SENT, None)]


async def test_a_deterministic_error_is_given_up_after_a_few_tries(
    sessions: Sessions, engine: Any, emulator: Any
) -> None:
    """An error that answers the call the same way every time (restricted_action) is given up after three
    tries, not retried for a day in front of the conversation's later rows."""
    thread = await _one_post_queued(sessions, emulator)
    async with sessions() as s, s.begin():
        conversation_id = (await s.scalars(select(m.Outbox.conversation_id))).one()
        await enqueue(s, [Post(conversation_id, "C_SUPPORT", thread, "the next answer")])
    emulator.fail_next("chat.postMessage", status=200, error="restricted_action", times=3)
    sender = _sender(engine, emulator, "A")
    for _ in range(2):
        assert await sender.send_pending() == 0
        async with sessions() as s, s.begin():  # the backoff, fast-forwarded
            await s.execute(update(m.Outbox).where(m.Outbox.done_at.is_(None)).values(next_attempt_at=func.now()))
    assert await sender.send_pending() == 1
    assert [p.text for p in emulator.posts("C_SUPPORT", thread)] == ["the next answer"]


async def test_conversations_waiting_out_a_backoff_do_not_starve_a_healthy_one(
    sessions: Sessions, engine: Any, emulator: Any
) -> None:
    """Two hundred conversations whose next row waits out a backoff take no place in the sender's batch: a
    later, healthy conversation's reply goes out at once."""
    async with sessions() as s, s.begin():
        for i in range(200):
            conv = m.Conversation(key=f"slack:T0001:C_BUSY:{i}.0", active_agent="triage")
            s.add(conv)
            await s.flush()
            await enqueue(s, [Post(conv.id, "C_BUSY", f"{i}.0", "stuck")])
        await s.execute(update(m.Outbox).values(next_attempt_at=func.now() + timedelta(hours=1), attempts=1))
    thread = await _one_post_queued(sessions, emulator)
    assert await _sender(engine, emulator, "A").send_pending() == 1
    assert [p.text for p in emulator.posts("C_SUPPORT", thread)] == ["the answer"]


async def test_a_turn_longer_than_its_lease_keeps_it_renewed(
    sessions: Sessions, model: OpenAIChatModel, fake_llm: FakeOpenAI
) -> None:
    """The renewer starts when the first renewal is due (a timer, not a task per turn): a model call five times the
    lease's life still finds the lease A's all along, B never takes the conversation, and the answer commits."""
    a = process(sessions, model, "A", ttl_s=0.3)
    b = process(sessions, model, "B", ttl_s=0.3)
    fake_llm.script(slow(1.5, reply("late but mine")))
    submitted = await a.submit("test:renewed", "hi")
    [lease] = await a.leases.claim_pending(1)
    turn = asyncio.create_task(a.run_leased(lease))
    taken_meanwhile = []
    while not turn.done():
        await asyncio.sleep(0.1)
        taken_meanwhile.append(await b.leases.claim(submitted.conversation_id))
    [result] = await turn
    assert result.reply == "late but mine" and len(taken_meanwhile) >= 10
    assert taken_meanwhile[:-1] == [None] * (len(taken_meanwhile) - 1)  # the last may follow A's release
    assert await replies(sessions, submitted.conversation_id) == ["late but mine"]
