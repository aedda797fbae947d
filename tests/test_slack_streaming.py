"""Answers streamed into the customer's Slack thread while the model writes them (issue 28): the stream is a preview,
the outbox's answer is the answer of record, and whatever cuts a stream short, the thread ends with the answer
standing once (the emulator plays Slack's streaming methods with their limits)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.db.deliveries import Answer
from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI, reply, slow_words
from harness.bot import Start, bot_settings, serving
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
