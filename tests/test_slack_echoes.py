"""The bot's own posts coming back from Slack (issue 30): acknowledged on the signed body, before Bolt parses them,
and nothing started; a customer's message that names the bot's id is still a customer's message."""

from __future__ import annotations

from typing import Any

import pytest
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from bot.compose import Bot
from bot.playground.slack_emulator import BOT_ID, BOT_USER_ID, Delivery, SlackEmulator
from fakes.openai_server import FakeOpenAI, reply
from harness.database import count, settle
from harness.slack import replies_in


def echoed(delivery: Delivery) -> bool:
    event = delivery.payload.get("event") or {}
    message = event.get("message") or event.get("previous_message") or event
    return BOT_ID in (event.get("bot_id"), message.get("bot_id"))


async def test_echoes_are_acknowledged_before_bolt_and_a_message_naming_the_bot_is_answered(
    slack_bot: Bot,
    emulator: SlackEmulator,
    fake_llm: FakeOpenAI,
    sessions: async_sessionmaker[AsyncSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert slack_bot.app is not None
    bolt = slack_bot.app.async_dispatch
    dispatched: list[dict[str, Any]] = []

    async def seen_by_bolt(req: AsyncBoltRequest) -> BoltResponse:
        dispatched.append(req.body)
        return await bolt(req)

    monkeypatch.setattr(slack_bot.app, "async_dispatch", seen_by_bolt)
    fake_llm.script(reply("That is my own id."))
    # The bot's ids in the customer's words, quoted as a payload would hold them: the message is theirs all the same.
    words = f'my screen says "bot_id": "{BOT_ID}" and "user": "{BOT_USER_ID}", what is that?'
    said = await emulator.user_says("C_SUPPORT", words)
    assert said.result.status == 200
    assert await replies_in(emulator, "C_SUPPORT", said.ts, 1) == ["That is my own id."]
    await settle(sessions)
    echoes = await emulator.wait_for(lambda: [d for d in emulator.deliveries if echoed(d) and d.result is not None])
    assert all(d.result is not None and (d.result.status, d.result.body) == (200, "") for d in echoes)
    ids = [body.get("event_id") for body in dispatched]
    assert ids == [said.event_id]  # the customer's message went to Bolt, no echo did
    assert fake_llm.requests[0].last_user == words and fake_llm.calls == 1
    assert await count(sessions, m.Inbound) == 1
