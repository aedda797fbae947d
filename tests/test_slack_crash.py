"""Kill -9 the bot process at the worst moments, restart it: every reply arrives exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from db import models as m
from db.deliveries import Post
from fakes.openai_server import FakeOpenAI, reply, slow, tool_call, tools
from fakes.slack_api import SlackEmulator
from tests.conftest import SIGNING_SECRET

Sessions = async_sessionmaker[AsyncSession]
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SLACK_", "DATABASE_URL"))}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bot_env(database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator) -> dict[str, str]:
    """`python -m bot serve`'s environment against the test database, the fake LLM and the emulator."""
    return CLEAN | {
        "DATABASE_URL": database_url,
        "OPENAI_API_KEY": "test-key",
        "OPENAI_BASE_URL": fake_llm.base_url,
        "OPENAI_MODEL": "fake-model",
        "OPENAI_MAX_RETRIES": "0",
        "SLACK_BOT_TOKEN": "xoxb-test",
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "SLACK_API_URL": emulator.api_url,
        "STAFF_CHANNEL_ID": "C_STAFF",
        "HOST": "127.0.0.1",
        "LOG_LEVEL": "WARNING",
        "EMBEDDINGS": "openai",
    }


@pytest.fixture
async def bot_process(
    database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator, sessions: Sessions
) -> AsyncIterator[Callable[[], Any]]:
    """A factory: each call starts `python -m bot serve` as a real process and waits until it is ready."""
    port = free_port()
    env = bot_env(database_url, fake_llm, emulator) | {
        "PORT": str(port),
        "CASE_SUMMARY": "transcript",
        # A killed process's conversations are taken over when its leases run out: soon, in these tests.
        "LEASE_SECONDS": "2",
    }
    emulator.events_url = f"http://127.0.0.1:{port}/slack/events"
    started: list[asyncio.subprocess.Process] = []

    async def start() -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "serve", env=env, stdout=asyncio.subprocess.PIPE
        )
        started.append(proc)
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=30)
        assert json.loads(line)["event"] == "ready", line
        return proc

    yield start
    for proc in started:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def kill(proc: asyncio.subprocess.Process) -> None:
    proc.kill()
    await proc.wait()


async def test_killed_between_ack_and_reply(
    bot_process: Callable[[], Any], emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(slow(30, reply("never sent")), reply("Here I am, once."))
    first = await bot_process()
    said = await emulator.user_says("C_SUPPORT", "is anyone there?")
    assert said.result.status == 200
    await emulator.wait_for(lambda: fake_llm.calls == 1)  # mid-turn
    await kill(first)
    assert emulator.posts("C_SUPPORT", said.ts) == []

    second = await bot_process()
    posts = await emulator.wait_for(lambda: emulator.posts("C_SUPPORT", said.ts), timeout=20)
    await asyncio.sleep(1.0)  # time enough for a duplicate to show up, if one were coming
    assert [p.text for p in emulator.posts("C_SUPPORT", said.ts)] == ["Here I am, once."] == [p.text for p in posts]
    async with sessions() as s:
        assert await s.scalar(select(func.count()).where(m.Inbound.processed_at.is_(None))) == 0
    await kill(second)


async def test_killed_after_slack_accepted_the_post_before_the_answer(
    bot_process: Callable[[], Any], emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(reply("Posted exactly once."))
    emulator.hold("chat.postMessage")
    first = await bot_process()
    said = await emulator.user_says("C_SUPPORT", "hello")
    await emulator.wait_for(lambda: emulator.calls_to("chat.postMessage"))  # Slack has the post...
    await kill(first)  # ...and the bot dies before hearing so
    emulator.release("chat.postMessage")

    second = await bot_process()

    async def outbox_drained() -> bool:
        async with sessions() as s:
            return not await s.scalar(select(func.count()).where(m.Outbox.sent_at.is_(None)))

    for _ in range(200):
        if await outbox_drained():
            break
        await asyncio.sleep(0.05)
    assert await outbox_drained()
    posts = emulator.posts("C_SUPPORT", said.ts)
    assert [p.text for p in posts] == ["Posted exactly once."]
    async with sessions() as s:
        row = await s.scalar(select(m.Outbox).where(m.Outbox.kind == Post.kind))
    assert row is not None and row.result_ts == posts[0].ts and row.attempts == 1
    assert len(emulator.calls_to("chat.postMessage")) == 1
    await kill(second)


async def test_killed_between_a_staff_reply_and_its_relay(
    bot_process: Callable[[], Any], emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "wants a person"})))
    first = await bot_process()
    said = await emulator.user_says("C_SUPPORT", "a human please")
    [case] = await emulator.wait_for(lambda: [p for p in emulator.posts("C_STAFF") if not p.thread_ts], timeout=20)
    posts_before = len(emulator.calls_to("chat.postMessage"))

    emulator.hold("chat.postMessage")
    staff = await emulator.user_says("C_STAFF", "Hello, Sam from the team here.", user="U_STAFF", thread_ts=case.ts)
    assert staff.result.status == 200
    await emulator.wait_for(lambda: len(emulator.calls_to("chat.postMessage")) > posts_before)  # relay in flight
    await kill(first)
    emulator.release("chat.postMessage")

    second = await bot_process()
    relays = await emulator.wait_for(
        lambda: [p for p in emulator.posts("C_SUPPORT", said.ts) if p.username], timeout=20
    )
    await asyncio.sleep(1.5)  # time enough for a duplicate to show up, if one were coming
    assert [p.text for p in emulator.posts("C_SUPPORT", said.ts) if p.username] == [relays[0].text]
    assert relays[0].text == "Hello, Sam from the team here."
    await kill(second)


async def test_killed_while_holding_many_leases(
    bot_process: Callable[[], Any], emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    """Twenty conversations mid-turn in one process (no connection held by any of them) when it is killed: a
    new process takes each over once its lease runs out and answers it exactly once."""
    count = 20
    fake_llm.script(*(slow(60, reply("never sent")) for _ in range(count)))
    first = await bot_process()
    said = [await emulator.user_says("C_SUPPORT", f"question {n}") for n in range(count)]
    await emulator.wait_for(lambda: fake_llm.calls == count, timeout=20)  # all twenty turns in flight at once
    async with sessions() as s:
        held = await s.scalar(select(func.count()).where(m.Conversation.lease_until > func.now()))
    assert held == count
    await kill(first)
    fake_llm.rule = lambda request: reply(f"answer to {request.last_user}")
    second = await bot_process()
    for n, message in enumerate(said):
        posts = await emulator.wait_for(lambda ts=message.ts: emulator.posts("C_SUPPORT", ts), timeout=20)
        assert [p.text for p in posts] == [f"answer to question {n}"]
    await asyncio.sleep(1.0)  # time enough for a duplicate to show up, if one were coming
    assert all(len(emulator.posts("C_SUPPORT", message.ts)) == 1 for message in said)
    await kill(second)


async def test_a_web_process_and_a_worker_process_share_the_work(
    database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator, sessions: Sessions
) -> None:
    """PROCESS_ROLE=web receives and acknowledges, PROCESS_ROLE=worker runs the turns and the outbox: the
    worker is woken through the database and answers once; the worker takes no Slack requests."""
    fake_llm.rule = lambda request: reply(f"re: {request.last_user}")
    started: list[tuple[asyncio.subprocess.Process, int]] = []
    for role in ("worker", "web"):
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "serve",
            env=bot_env(database_url, fake_llm, emulator) | {"PORT": str(port), "PROCESS_ROLE": role},
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout is not None
        assert json.loads(await asyncio.wait_for(proc.stdout.readline(), timeout=30))["event"] == "ready"
        started.append((proc, port))
    [worker_port, web_port] = [port for _, port in started]
    try:
        emulator.events_url = f"http://127.0.0.1:{web_port}/slack/events"
        said = await emulator.user_says("C_SUPPORT", "split roles?")
        posts = await emulator.wait_for(lambda: emulator.posts("C_SUPPORT", said.ts), timeout=20)
        await asyncio.sleep(0.5)
        assert [p.text for p in emulator.posts("C_SUPPORT", said.ts)] == ["re: split roles?"] == [p.text for p in posts]
        emulator.events_url = f"http://127.0.0.1:{worker_port}/slack/events"
        refused = await emulator.user_says("C_SUPPORT", "to the worker")
        assert refused.result.status == 404
    finally:
        for proc, _ in started:
            await kill(proc)
