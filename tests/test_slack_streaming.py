"""Answers streamed into the customer's Slack thread while the model writes them (issue 28): the stream is a preview,
the outbox's answer is the answer of record, and whatever cuts a stream short, the thread ends with the answer
standing once (the emulator plays Slack's streaming methods with their limits)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.db.deliveries import Answer
from bot.playground.slack_emulator import SlackEmulator, Task
from fakes.openai_server import FakeOpenAI, FakeReply, reply, slow_words, tool_call, tools
from harness.bot import Start, bot_settings, free_port, serving
from harness.database import settle

Sessions = async_sessionmaker[AsyncSession]
ANSWER = " ".join(f"word{i}" for i in range(1, 25)) + "."
"""Written a word at a time: long enough that the bot starts a stream and appends to it."""


def bot_messages(emulator: SlackEmulator, thread: str) -> list[str]:
    return [p.text for p in emulator.posts("C_SUPPORT", thread)]


async def preview_states(sessions: Sessions) -> list[str]:
    async with sessions() as s:
        return list((await s.scalars(select(m.Preview.state))).all())


async def test_an_answer_streams_then_stands_once_as_the_answer_of_record(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    fake_llm.script(slow_words(ANSWER, first_s=0.2, each_s=0.1))
    async with serving(bot_settings(database_url, fake_llm, emulator), emulator):
        said = await emulator.user_says("C_SUPPORT", "tell me a long story")
        await settle(sessions, timeout_s=20)
    [stream] = emulator.streams("C_SUPPORT")
    assert stream.ended == "stopped"
    texts = stream.texts
    assert len(texts) >= 3 and texts[0] != ANSWER  # the customer watched it grow
    assert all(ANSWER.startswith(t) for t in texts[:-1])  # every preview was the start of the answer, never more
    assert bot_messages(emulator, said.ts) == [ANSWER]  # the stream is the answer: one message
    assert emulator.calls_to("chat.postMessage") == []
    async with sessions() as s:
        row = await s.scalar(select(m.Outbox).where(m.Outbox.kind == Answer.kind))
    assert row is not None and row.result_ts == stream.ts
    assert await preview_states(sessions) == ["finished"]


async def test_a_quick_answer_is_posted_without_a_stream(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    fake_llm.script(reply("Short and sweet."))
    async with serving(bot_settings(database_url, fake_llm, emulator), emulator):
        said = await emulator.user_says("C_SUPPORT", "hi")
        await settle(sessions)
    assert emulator.streams("C_SUPPORT") == []
    assert bot_messages(emulator, said.ts) == ["Short and sweet."]


async def test_streaming_off_posts_the_answer_whole(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    fake_llm.script(slow_words(ANSWER, first_s=0.1, each_s=0.05))
    async with serving(bot_settings(database_url, fake_llm, emulator, stream_answers=False), emulator):
        said = await emulator.user_says("C_SUPPORT", "tell me a long story")
        await settle(sessions, timeout_s=20)
    assert emulator.streams("C_SUPPORT") == []
    assert bot_messages(emulator, said.ts) == [ANSWER]
    assert not fake_llm.requests[-1].stream


async def test_an_expired_stream_is_finished_with_chat_update(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    emulator.stream_lifetime_s = 1.0  # Slack's is about five minutes
    fake_llm.script(slow_words(ANSWER, first_s=0.1, each_s=0.1))
    async with serving(bot_settings(database_url, fake_llm, emulator), emulator):
        said = await emulator.user_says("C_SUPPORT", "tell me a long story")
        await settle(sessions, timeout_s=20)
    [stream] = emulator.streams("C_SUPPORT")
    assert stream.ended == "updated"
    assert bot_messages(emulator, said.ts) == [ANSWER]
    assert await preview_states(sessions) == ["finished"]


async def test_a_refused_stream_start_leaves_the_answer_posted_as_usual(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    emulator.fail_next("chat.startStream", status=200, error="channel_type_not_supported")
    fake_llm.script(slow_words(ANSWER, first_s=0.1, each_s=0.05))
    async with serving(bot_settings(database_url, fake_llm, emulator), emulator):
        said = await emulator.user_says("C_SUPPORT", "tell me a long story")
        await settle(sessions, timeout_s=20)
    assert emulator.streams("C_SUPPORT") == []
    assert bot_messages(emulator, said.ts) == [ANSWER]
    assert await preview_states(sessions) == ["dropped"]


async def test_killed_mid_stream_the_answer_stands_once_where_the_preview_was(
    start_bot: Start, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    long = " ".join(f"slow{i}" for i in range(60))
    fake_llm.script(slow_words(long, first_s=0.1, each_s=0.2), reply("The whole answer, once."))
    first = await start_bot()
    said = await emulator.user_says("C_SUPPORT", "tell me a long story")
    await emulator.wait_for(lambda: len(emulator.calls_to("chat.appendStream")) >= 1, timeout=20)
    await first.kill()  # mid-stream: a half answer shows in the thread
    [stream] = emulator.streams("C_SUPPORT")
    assert stream.ended is None and stream.texts[-1] != long

    second = await start_bot()
    await settle(sessions, timeout_s=30)
    await asyncio.sleep(1.0)  # time enough for a duplicate to show up, if one were coming
    assert bot_messages(emulator, said.ts) == ["The whole answer, once."]  # the half answer became the answer
    assert emulator.posts("C_SUPPORT", said.ts)[0].ts == stream.ts
    assert await preview_states(sessions) == ["finished"]
    await second.kill()


@pytest.mark.parametrize(
    ("method", "fault"),
    [
        ("chat.appendStream", {"status": 429}),  # an append rate-limited: the preview stops growing
        ("chat.appendStream", {"status": 200, "error": "message_not_in_streaming_state"}),
        ("chat.stopStream", {"status": 429}),  # the finish rate-limited: the outbox tries again later
        ("chat.stopStream", {"status": 200, "error": "internal_error"}),  # the finish's outcome unknown
        ("chat.stopStream", {"status": 200, "error": "internal_error", "performed": True}),  # ...and it was done
    ],
)
async def test_a_refused_call_still_ends_with_the_answer_once(
    database_url: str,
    sessions: Sessions,
    fake_llm: FakeOpenAI,
    emulator: SlackEmulator,
    method: str,
    fault: dict[str, Any],
) -> None:
    emulator.fail_next(method, **fault)
    fake_llm.script(slow_words(ANSWER, first_s=0.1, each_s=0.1))
    async with serving(bot_settings(database_url, fake_llm, emulator), emulator):
        said = await emulator.user_says("C_SUPPORT", "tell me a long story")
        await settle(sessions, timeout_s=30)
    assert emulator.calls_to(method)  # the fault was met
    assert bot_messages(emulator, said.ts) == [ANSWER]
    [stream] = emulator.streams("C_SUPPORT")
    assert stream.texts[-1] == ANSWER
    assert await preview_states(sessions) == ["finished"]


def stream_chunks(emulator: SlackEmulator) -> list[dict[str, Any]]:
    """Every chunk the bot streamed, in order (start, appends, stop)."""
    methods = ("chat.startStream", "chat.appendStream", "chat.stopStream")
    return [chunk for c in emulator.calls if c.method in methods for chunk in c.params.get("chunks") or []]


def cards(emulator: SlackEmulator, ts: str, title: str) -> list[Task]:
    msg = emulator.message("C_SUPPORT", ts)
    assert msg is not None
    return [task for task in msg.tasks if task.title == title]


SLOW_TOOL = """\
version: 1
brand: {{name: Quillwork}}
entry: desk
http:
  unsigned: true
  allowed_hosts: ["127.0.0.1"]
tools:
  lookup_order:
    method: GET
    url: http://127.0.0.1:{port}/orders
    description: The customer's order.
agents:
  desk:
    title: the desk
    description: Answers about orders.
    instructions: You answer questions about Quillwork orders.
    tools: [lookup_order]
"""


@pytest.fixture
async def slow_orders() -> AsyncIterator[int]:
    """An operator's order endpoint that takes a second to answer."""

    async def orders(request: web.Request) -> web.Response:
        await asyncio.sleep(1.0)
        return web.json_response({"order": "DW-1001", "status": "shipped"})

    app = web.Application()
    app.router.add_get("/orders", orders)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield port
    await runner.cleanup()


async def test_a_slow_tool_starts_the_stream_with_its_task(
    database_url: str,
    sessions: Sessions,
    fake_llm: FakeOpenAI,
    emulator: SlackEmulator,
    slow_orders: int,
    tmp_path: Path,
) -> None:
    """No words yet, but a look-up running: the customer sees it as a task in the thread, then the answer grows
    below it and stands once, finished by chat.stopStream."""
    path = tmp_path / "helpdesk.yaml"
    path.write_text(SLOW_TOOL.format(port=slow_orders))
    fake_llm.script(tools(tool_call("lookup_order", {}, id="call_slow")), slow_words(ANSWER, first_s=0.1, each_s=0.1))
    async with serving(bot_settings(database_url, fake_llm, emulator, helpdesk_file=path), emulator):
        said = await emulator.user_says("C_SUPPORT", "where is my order?")
        await settle(sessions, timeout_s=20)
    [stream] = emulator.streams("C_SUPPORT")
    [start] = emulator.calls_to("chat.startStream")
    assert start.params["chunks"] == [
        {"type": "task_update", "id": "call_slow", "title": "Checking your order…", "status": "in_progress"}
    ]
    statuses = [c["status"] for c in stream_chunks(emulator) if c["type"] == "task_update"]
    assert statuses == ["in_progress", "complete"]
    assert stream.texts[0] == "" and len(stream.texts) >= 3  # the task first, then the words as they came
    assert stream.ended == "stopped" and emulator.calls_to("chat.update") == []
    assert bot_messages(emulator, said.ts) == [ANSWER]
    assert [t.status for t in cards(emulator, stream.ts, "Checking your order…")] == ["complete"]


async def test_a_tool_run_while_streaming_shows_as_a_task_that_ends_complete(
    database_url: str,
    sessions: Sessions,
    fake_llm: FakeOpenAI,
    emulator: SlackEmulator,
    slow_orders: int,
    tmp_path: Path,
) -> None:
    """The model writes, looks the order up, then answers: the look-up is a task card in the stream, done by the time
    the answer stands, and the message is the answer once."""
    before = FakeReply(
        content="Let me look that order up for you.",
        tool_calls=(tool_call("lookup_order", {}, id="call_order"),),
        delay=0.1,
        word_delay=0.1,
    )
    fake_llm.script(before, slow_words(ANSWER, first_s=0.1, each_s=0.1))
    path = tmp_path / "helpdesk.yaml"
    path.write_text(SLOW_TOOL.format(port=slow_orders))
    async with serving(bot_settings(database_url, fake_llm, emulator, helpdesk_file=path), emulator):
        said = await emulator.user_says("C_SUPPORT", "where is my order DW-1001?")
        await settle(sessions, timeout_s=20)
    [stream] = emulator.streams("C_SUPPORT")
    assert stream.mode == "chunks"  # words and tasks in one stream: Slack refuses to mix the two modes
    assert not [c for c in emulator.calls if c.method.startswith("chat.") and c.failed]
    shown = [c for c in stream_chunks(emulator) if c["type"] == "task_update" and c["id"] == "call_order"]
    assert shown and shown[-1]["status"] == "complete" and shown[0]["title"] == "Checking your order…"
    assert [t.status for t in cards(emulator, stream.ts, "Checking your order…")] == ["complete"]
    assert bot_messages(emulator, said.ts) == [ANSWER]  # the answer of record, once
    assert emulator.calls_to("chat.postMessage") == []
    assert await preview_states(sessions) == ["finished"]


async def test_a_handoff_notice_and_the_answer_stream_as_one_message(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    fake_llm.script(tools(tool_call("transfer_to_sales")), slow_words(ANSWER, first_s=0.1, each_s=0.1))
    async with serving(bot_settings(database_url, fake_llm, emulator), emulator):
        said = await emulator.user_says("C_SUPPORT", "I want to buy a drone")
        await settle(sessions, timeout_s=20)
    [stream] = emulator.streams("C_SUPPORT")
    whole = f"_Connecting you with Sales…_\n\n{ANSWER}"
    # The notice led the stream from its first words, and the answer of record is that one message.
    assert all(text.startswith("_Connecting you with Sales…_") for text in stream.texts)
    assert [p.text for p in emulator.posts("C_SUPPORT", said.ts)] == [whole]
    assert stream.ended == "stopped" and emulator.calls_to("chat.update") == []
    assert await preview_states(sessions) == ["finished"]
