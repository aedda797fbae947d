"""Answers streamed in Teams personal chats (issue 28): the bot in this process against the Teams emulator over HTTP,
the fake model writing word by word through the real openai client, a real Postgres. What the customer saw is the
emulator's record of the stream (`TeamsEmulator.shown_in`) and the chat's messages; the answer of record is the
outbox's."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from microsoft_agents.authentication.msal import MsalAuth
from microsoft_agents.hosting.core.authorization import AgentAuthConfiguration
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from agents.db import models as m
from bot.channels.messenger import Refused, Where
from bot.compose import Bot
from bot.playground.slack_emulator import SlackEmulator
from bot.teams.messenger import ServiceUrls, TeamsMessenger
from fakes.openai_server import FakeOpenAI, slow_words
from fakes.teams_api import BOT_NAME, ErrorCode, Message, Op, StreamType, TeamsEmulator
from harness import teams as th
from harness.bot import bot_settings, serving
from harness.database import settle

Sessions = async_sessionmaker[AsyncSession]
ANSWER = (
    "Your order ships from our Rotterdam warehouse within two working days, and you will get a tracking link "
    "by email as soon as the courier has it."
)


@pytest.fixture
async def bot(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator, teams: TeamsEmulator
) -> AsyncIterator[Bot]:
    settings = bot_settings(database_url, fake_llm, emulator, **th.teams_settings(teams))
    async with serving(settings, emulator) as running:
        teams.messaging_url = f"{running.url}/api/messages"
        yield running


def writing(first_s: float = 0.3, each_s: float = 0.12) -> Any:
    """The answer as a model writes it: about three seconds, so the stream has updates to show."""
    return slow_words(ANSWER, first_s, each_s)


async def answered(teams: TeamsEmulator, conversation: str, root: str | None = None) -> list[Message]:
    return await teams.wait_for(lambda: teams.posts(conversation, root) or None, timeout=20)


async def test_a_personal_chat_answer_streams_then_stands_once(
    bot: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(writing())
    sent = await th.personal(teams, "when does my order ship?")
    [post] = await answered(teams, sent.conversation_id)
    await settle(sessions)

    shown = teams.shown_in(sent.conversation_id)
    kinds = [s.kind for s in shown]
    assert kinds[0] == StreamType.INFORMATIVE and kinds[-1] == StreamType.FINAL
    words = [s.text for s in shown if s.kind == StreamType.STREAMING]
    assert words, "the customer saw the answer grow before it was finished"
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(words))
    assert all(ANSWER.startswith(w) for w in words) and words[0] != ANSWER
    assert kinds.count(StreamType.FINAL) == 1 and shown[-1].text == ANSWER
    # The final message is the chat's only post from the bot, in the streamed message's place, labelled AI-made.
    assert [p.text for p in teams.posts(sent.conversation_id)] == [ANSWER]
    assert post.id == shown[0].stream_id
    assert any("AIGeneratedContent" in (e.get("additionalType") or []) for e in post.activity["entities"])
    async with sessions() as s:
        [preview] = (await s.execute(select(m.Preview))).scalars().all()
        outbox = (await s.execute(select(m.Outbox.result_ts).where(m.Outbox.result_ts.is_not(None)))).scalars()
        assert post.id in list(outbox), "the outbox recorded the final message as the answer's post"
    assert (preview.state, preview.stream_id) == ("finished", post.id)
    assert preview.shown == words[-1]


async def test_teams_feedback_on_a_streamed_answer_is_recorded_as_slacks_is(
    bot: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(writing(each_s=0.02))
    sent = await th.personal(teams, "when does my order ship?")
    [post] = await answered(teams, sent.conversation_id)
    assert post.activity["channelData"]["feedbackLoopEnabled"] is True
    await settle(sessions)
    assert (await th.feedback(teams, post, "dislike")).status == 200
    assert (await th.feedback(teams, post, "like")).status == 200  # the latest rating wins
    await th.feedback(teams, post, "like", user=th.STAFF)  # not the customer's: not their verdict
    rated = await _ratings(sessions, until=lambda rows: bool(rows) and rows[0][1] == "good")
    assert rated == [(th.CUSTOMER, "good", post.id)]


async def _ratings(
    sessions: Sessions, *, until: Callable[[list[tuple[str, str, str]]], bool]
) -> list[tuple[str, str, str]]:
    """The answers' ratings (who, how, which message), once `until` holds of them (recorded after Teams' answer)."""
    deadline = time.monotonic() + 10
    while True:
        async with sessions() as s:
            rows = [(r.user_id, r.rating, r.message_ts) for r in (await s.execute(select(m.AnswerFeedback))).scalars()]
        if until(rows) or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("where", ["channel", "group chat"])
async def test_channels_and_group_chats_do_not_stream_they_type(
    bot: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions, where: str
) -> None:
    fake_llm.script(writing(each_s=0.05))
    if where == "channel":
        sent = await th.channel_post(teams, "support", "when does my order ship?")
        conversation, root = th.channel(teams, "support"), sent.id
    else:
        sent = await th.group_chat(teams, "19:orders@thread.v2", "when does my order ship?")
        conversation, root = sent.conversation_id, None
    posts = await answered(teams, conversation, root)
    await settle(sessions)
    assert [p.text for p in posts] == [ANSWER]
    assert teams.typing_in(conversation), "typing stayed the signal"
    assert not teams.shown_in(conversation) and not teams.streams, "the bot never tried to stream there"
    async with sessions() as s:
        assert (await s.execute(select(m.Preview))).first() is None


async def test_an_expired_stream_still_ends_with_the_whole_answer_once(
    bot: Bot, teams: TeamsEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    teams.stream_lifetime_s = 1.5  # Teams' two minutes, shortened: the model writes for about three seconds
    fake_llm.script(writing())
    sent = await th.personal(teams, "when does my order ship?")
    [post] = await answered(teams, sent.conversation_id)
    await settle(sessions)

    assert post.text == ANSWER and [p.text for p in teams.posts(sent.conversation_id)] == [ANSWER]
    [stream] = teams.streams.values()
    assert stream.expired and not stream.final
    assert StreamType.FINAL not in [s.kind for s in teams.shown_in(sent.conversation_id)]
    refused = [c for c in teams.calls_to(Op.SEND) if c.error == ErrorCode.STREAM_NOT_ALLOWED]
    assert refused and refused[-1].body["type"] == "message", "the final message was refused, then posted"
    async with sessions() as s:
        [preview] = (await s.execute(select(m.Preview))).scalars().all()
    assert preview.state == "finished"


@pytest.fixture
async def messenger(teams: TeamsEmulator, engine: AsyncEngine, sessions: Sessions) -> AsyncIterator[TeamsMessenger]:
    """The bot's Teams messenger alone (`sessions`: no earlier test's service URLs)."""
    credentials = AgentAuthConfiguration(client_id=th.APP_ID, tenant_id=th.TENANT_ID, client_secret=th.APP_PASSWORD)
    teams_bot = TeamsMessenger(
        credentials=MsalAuth(credentials),
        urls=ServiceUrls(engine, default=teams.service_url),
        tenant=teams.tenant_id,
        bot_id=teams.bot_id,
        bot_name=BOT_NAME,
    )
    yield teams_bot
    await teams_bot.close()


async def test_the_emulator_refuses_what_teams_refuses(teams: TeamsEmulator, messenger: TeamsMessenger) -> None:
    teams.stream_interval_s = 0.3
    chat = Where(teams.personal_chat(th.CUSTOMER).id, None)
    stream_id = await messenger.stream(chat, "Looking…", kind="informative", sequence=1, stream_id=None)
    with pytest.raises(Refused) as too_fast:
        await messenger.stream(chat, "Your", kind="streaming", sequence=2, stream_id=stream_id)
    assert too_fast.value.error == "ratelimited" and too_fast.value.retry_after == 1.0
    await teams.wait_for(lambda: teams.calls[-1].at + teams.stream_interval_s < time.monotonic(), timeout=5)
    assert await messenger.stream(chat, "Your", kind="streaming", sequence=2, stream_id=stream_id) == stream_id
    await teams.wait_for(lambda: teams.calls[-1].at + teams.stream_interval_s < time.monotonic(), timeout=5)
    with pytest.raises(Refused):  # an update must contain what the stream showed
        await messenger.stream(chat, "Hello", kind="streaming", sequence=3, stream_id=stream_id)
    with pytest.raises(Refused) as in_channel:
        await messenger.stream(
            Where(th.channel(teams, "support"), None), "Looking…", kind="informative", sequence=1, stream_id=None
        )
    assert teams.calls[-1].error == ErrorCode.STREAM_NOT_ALLOWED and in_channel.value.error == "not_in_channel"
    assert [s.text for s in teams.shown_in(chat.channel)] == ["Looking…", "Your"]
