"""Kill -9 the bot process at the worst moments, restart it: every reply arrives exactly once."""

from __future__ import annotations

import asyncio

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.db.deliveries import Answer
from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI, reply, slow, tool_call, tools
from harness.bot import Start, bot_env, bot_process
from harness.database import case_known, settle

Sessions = async_sessionmaker[AsyncSession]


async def test_killed_between_ack_and_reply(
    start_bot: Start, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(slow(30, reply("never sent")), reply("Here I am, once."))
    first = await start_bot()
    said = await emulator.user_says("C_SUPPORT", "is anyone there?")
    assert said.result.status == 200
    await emulator.wait_for(lambda: fake_llm.calls == 1)  # mid-turn
    await first.kill()
    assert emulator.posts("C_SUPPORT", said.ts) == []

    second = await start_bot()
    posts = await emulator.wait_for(lambda: emulator.posts("C_SUPPORT", said.ts), timeout=20)
    await asyncio.sleep(1.0)  # time enough for a duplicate to show up, if one were coming
    assert [p.text for p in emulator.posts("C_SUPPORT", said.ts)] == ["Here I am, once."] == [p.text for p in posts]
    async with sessions() as s:
        assert await s.scalar(select(func.count()).where(m.Inbound.processed_at.is_(None))) == 0
    await second.kill()


async def test_killed_after_slack_accepted_the_post_before_the_answer(
    start_bot: Start, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(reply("Posted exactly once."))
    emulator.hold("chat.postMessage")
    first = await start_bot()
    said = await emulator.user_says("C_SUPPORT", "hello")
    await emulator.wait_for(lambda: emulator.calls_to("chat.postMessage"))  # Slack has the post...
    await first.kill()  # ...and the bot dies before hearing so
    emulator.release("chat.postMessage")

    second = await start_bot()

    await settle(sessions)
    posts = emulator.posts("C_SUPPORT", said.ts)
    assert [p.text for p in posts] == ["Posted exactly once."]
    async with sessions() as s:
        row = await s.scalar(select(m.Outbox).where(m.Outbox.kind == Answer.kind))
    assert row is not None and row.result_ts == posts[0].ts and row.attempts == 1
    assert len(emulator.calls_to("chat.postMessage")) == 1
    await second.kill()


async def test_killed_between_a_staff_reply_and_its_relay(
    start_bot: Start, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "wants a person"})))
    first = await start_bot()
    said = await emulator.user_says("C_SUPPORT", "a human please")
    [case] = await emulator.wait_for(lambda: [p for p in emulator.posts("C_STAFF") if not p.thread_ts], timeout=20)
    await case_known(sessions, case.ts)
    posts_before = len(emulator.calls_to("chat.postMessage"))

    emulator.hold("chat.postMessage")
    staff = await emulator.user_says("C_STAFF", "Hello, Sam from the team here.", user="U_STAFF", thread_ts=case.ts)
    assert staff.result.status == 200
    await emulator.wait_for(lambda: len(emulator.calls_to("chat.postMessage")) > posts_before)  # relay in flight
    await first.kill()
    emulator.release("chat.postMessage")

    second = await start_bot()
    relays = await emulator.wait_for(
        lambda: [p for p in emulator.posts("C_SUPPORT", said.ts) if p.username], timeout=20
    )
    await asyncio.sleep(1.5)  # time enough for a duplicate to show up, if one were coming
    assert [p.text for p in emulator.posts("C_SUPPORT", said.ts) if p.username] == [relays[0].text]
    assert relays[0].text == "Hello, Sam from the team here."
    await second.kill()


async def test_killed_while_holding_many_leases(
    start_bot: Start, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    """Twenty conversations mid-turn in one process (no connection held by any of them) when it is killed: a
    new process takes each over once its lease runs out and answers it exactly once."""
    count = 20
    fake_llm.script(*(slow(60, reply("never sent")) for _ in range(count)))
    first = await start_bot()
    said = [await emulator.user_says("C_SUPPORT", f"question {n}") for n in range(count)]
    await emulator.wait_for(lambda: fake_llm.calls == count, timeout=20)  # all twenty turns in flight at once
    async with sessions() as s:
        held = await s.scalar(select(func.count()).where(m.Conversation.lease_until > func.now()))
    assert held == count
    await first.kill()
    fake_llm.rule = lambda request: reply(f"answer to {request.last_user}")
    second = await start_bot()
    for n, message in enumerate(said):
        posts = await emulator.wait_for(lambda ts=message.ts: emulator.posts("C_SUPPORT", ts), timeout=20)
        assert [p.text for p in posts] == [f"answer to question {n}"]
    await asyncio.sleep(1.0)  # time enough for a duplicate to show up, if one were coming
    assert all(len(emulator.posts("C_SUPPORT", message.ts)) == 1 for message in said)
    await second.kill()


async def test_a_web_process_and_a_worker_process_share_the_work(
    database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator, sessions: Sessions
) -> None:
    """PROCESS_ROLE=web receives and acknowledges, PROCESS_ROLE=worker runs the turns and the outbox: the
    worker is woken through the database and answers once; the worker takes no Slack requests."""
    fake_llm.rule = lambda request: reply(f"re: {request.last_user}")
    env = bot_env(database_url, fake_llm, emulator)
    async with (
        bot_process(env | {"PROCESS_ROLE": "worker"}) as worker,
        bot_process(env | {"PROCESS_ROLE": "web"}) as web,
    ):
        emulator.events_url = web.events_url
        said = await emulator.user_says("C_SUPPORT", "split roles?")
        posts = await emulator.wait_for(lambda: emulator.posts("C_SUPPORT", said.ts), timeout=20)
        await asyncio.sleep(0.5)
        assert [p.text for p in emulator.posts("C_SUPPORT", said.ts)] == ["re: split roles?"] == [p.text for p in posts]
        emulator.events_url = worker.events_url
        refused = await emulator.user_says("C_SUPPORT", "to the worker")
        assert refused.result.status == 404
