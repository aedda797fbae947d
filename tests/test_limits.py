"""Rate limits and the daily token budget (agents.limits): over a limit a message is stored and kept, no LLM call
is made, the customer is told once per window and the message is marked with the limit; other people and
channels are answered as usual. The engine on a real Postgres with the fake LLM over HTTP, and the whole bot
over Slack HTTP with the emulator (notice, reactions, /metrics, `/support stats` and `status`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.conversations import Conversations
from agents.db import models as m
from agents.identity import Author
from agents.limits import Limit, Limits
from agents.model import OpenAIChatModel
from agents.texts import Texts
from bot.playground.slack_emulator import BOT_USER_ID, SlackEmulator
from bot.runtime import startup as runtime
from bot.settings import Settings
from escalation.machine import TAKEOVER
from fakes.openai_server import FakeOpenAI, RecordedRequest, reply
from harness.bot import bot_settings, serving
from harness.database import settle
from harness.llm import CONFIG
from harness.sample import default_roster
from harness.scenarios import ADMIN, shown, support
from harness.slack import replies_in

Sessions = async_sessionmaker[AsyncSession]
SUPPORT = "C_SUPPORT"


def echo(request: RecordedRequest) -> Any:
    return reply(f"echo {request.last_user}")


def limited_service(sessions: Sessions, model: OpenAIChatModel, limits: Limits) -> Conversations:
    return Conversations(
        takeover=TAKEOVER, sessions=sessions, roster=default_roster(), model=model, config=CONFIG, limits=limits
    )


async def minute_to_spare(seconds: float = 20.0) -> None:
    """Start in a minute with `seconds` left, so that a test of a per-minute limit does not straddle two of them
    (the windows are the database's calendar minutes; this machine's clock is the database's)."""
    into = time.time() % 60
    if into > 60 - seconds:
        await asyncio.sleep(60 - into + 0.2)


async def outcomes(sessions: Sessions) -> list[tuple[str | None, str, str | None]]:
    """(author, outcome kind, limited_by) of every message, in order."""
    async with sessions() as s:
        rows = await s.execute(select(m.Inbound.author, m.Inbound.outcome).order_by(m.Inbound.id))
        return [(author, o["kind"], o.get("limited_by")) for author, o in rows]


async def test_a_person_over_the_per_minute_limit_gets_no_llm_call_and_one_notice(
    sessions: Sessions, model: OpenAIChatModel, fake_llm: FakeOpenAI
) -> None:
    fake_llm.rule = echo
    service = limited_service(sessions, model, Limits(user_per_minute=2))
    await minute_to_spare()
    # Two threads of one person: the limit is the person's, not the conversation's.
    assert (await service.handle("t:a", "one", author=Author("slack", "T1", "U1"))).reply == "echo one"
    assert (await service.handle("t:b", "two", author=Author("slack", "T1", "U1"))).reply == "echo two"
    assert fake_llm.calls == 2

    # A flood over three conversations at once: no LLM call, and one notice between them.
    flood = await asyncio.gather(
        *(service.handle(f"t:{k}", f"again {k}", author=Author("slack", "T1", "U1")) for k in "abd")
    )
    notice = Texts().limited("minute")
    assert {(r.kind, r.limited_by) for r in flood} == {("limited", Limit.USER)}
    assert sorted(r.reply or "" for r in flood) == ["", "", notice]
    later = await service.handle("t:a", "still there?", author=Author("slack", "T1", "U1"))
    assert (later.kind, later.reply) == ("limited", None)  # told already, in this minute
    assert fake_llm.calls == 2

    # Someone else is answered as usual.
    assert (await service.handle("t:c", "hello", author=Author("slack", "T1", "U2"))).reply == "echo hello"
    assert fake_llm.calls == 3
    assert await outcomes(sessions) == [("U1", "reply", None)] * 2 + [("U1", "limited", "user")] * 4 + [
        ("U2", "reply", None)
    ]
    # Nothing is lost: the limited messages are in the transcript, where the agents read them next time.
    async with sessions() as s:
        users = await s.scalars(select(m.Message.content).where(m.Message.role == "user"))
        assert sorted(users) == sorted(["one", "two", "again a", "again b", "again d", "still there?", "hello"])
        said = await s.scalars(select(m.Message.content).where(m.Message.role == "assistant"))
        assert list(said).count(notice) == 1


async def test_a_person_over_the_daily_token_budget_gets_no_more_llm_calls_today(
    sessions: Sessions, model: OpenAIChatModel, fake_llm: FakeOpenAI
) -> None:
    fake_llm.rule = echo
    service = limited_service(sessions, model, Limits(daily_tokens_per_user=50))
    first = await service.handle("t:a", "what drones do you sell?", author=Author("slack", "T1", "U1"))
    assert first.reply == "echo what drones do you sell?" and fake_llm.calls == 1
    async with sessions() as s:  # what the fake server counted, as the audit trail recorded it
        spent = await s.scalar(select(func.sum(m.LLMCall.prompt_tokens + m.LLMCall.completion_tokens)))
        counter = await s.get(m.RateCounter, ("user", "U1"))
    assert spent is not None and spent > 50 and counter is not None and counter.tokens == spent

    second = await service.handle("t:b", "and cameras?", author=Author("slack", "T1", "U1"))
    assert (second.kind, second.limited_by) == ("limited", Limit.DAILY_TOKENS)
    assert second.reply == Texts().limited("day")
    third = await service.handle("t:a", "hello?", author=Author("slack", "T1", "U1"))
    assert (third.kind, third.reply) == ("limited", None)
    assert fake_llm.calls == 1

    assert (await service.handle("t:c", "hi", author=Author("slack", "T1", "U2"))).reply == "echo hi"
    assert fake_llm.calls == 2


async def metric(bot: Any, name: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{bot.monitoring_url}/metrics") as response:
        return "\n".join(line for line in (await response.text()).splitlines() if line.startswith(name))


async def test_over_slack_one_notice_per_flood_and_the_admins_see_it(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    fake_llm.rule = echo
    emulator.add_user(ADMIN, "ada", "Ada Admin")
    emulator.add_channel("C_OTHER", "#other")
    settings = bot_settings(
        database_url,
        fake_llm,
        emulator,
        admin_user_ids=ADMIN,
        rate_limit_user_per_minute=2,
        rate_limit_channel_per_minute=3,
    )
    await minute_to_spare(30)
    async with serving(settings, emulator) as bot:
        first = await emulator.user_says(SUPPORT, "first question")
        assert await replies_in(emulator, SUPPORT, first.ts, 1) == ["echo first question"]
        await emulator.user_says(SUPPORT, "second question", thread_ts=first.ts)
        await replies_in(emulator, SUPPORT, first.ts, 2)
        flood = [await emulator.user_says(SUPPORT, f"again {n}") for n in range(3)]
        await settle(sessions)
        assert fake_llm.calls == 2
        notice = "You've sent more messages than I can answer right now."
        posted = [[p.text for p in emulator.posts(SUPPORT, said.ts)] for said in flood]
        # One notice, not one per message, under whichever of the three was handled first (they are three
        # conversations, run at once: not necessarily in the order written).
        [told] = [texts for texts in posted if texts]
        assert len(told) == 1 and told[0].startswith(notice) and "write again in a minute" in told[0]
        for said in flood:  # seen (the 👀 is gone), not answered: no ✅
            message = emulator.message(SUPPORT, said.ts)
            assert message is not None and dict(message.reactions) == {}

        # Someone else in the channel is answered (the channel's third this minute), then the channel is full;
        # another channel is not.
        other = await emulator.user_says(SUPPORT, "hello", user="U_OTHER")
        assert await replies_in(emulator, SUPPORT, other.ts, 1) == ["echo hello"]
        crowd = await emulator.user_says(SUPPORT, "me too", user="U_THIRD")
        elsewhere = await emulator.user_says("C_OTHER", "hi there", user="U_THIRD")
        assert await replies_in(emulator, "C_OTHER", elsewhere.ts, 1) == ["echo hi there"]
        await settle(sessions)
        assert [p.text[: len(notice)] for p in emulator.posts(SUPPORT, crowd.ts)] == [notice]
        assert fake_llm.calls == 4
        done = emulator.message("C_OTHER", elsewhere.ts)
        assert done is not None and dict(done.reactions) == {"white_check_mark": (BOT_USER_ID,)}

        assert await metric(bot, "helpdesk_rate_limited_total") == "\n".join(
            ['helpdesk_rate_limited_total{scope="user"} 3.0', 'helpdesk_rate_limited_total{scope="channel"} 1.0']
        )
        assert 'helpdesk_messages_processed_total{kind="limited"} 4.0' in await metric(bot, "helpdesk_messages")
        stats = shown(await support(emulator, "stats 1"))
        assert "4 not answered, over a rate limit (user: 3, channel: 1)" in stats
        status = shown(await support(emulator, "status"))
        assert "*Rate limits*\\n2 customer(s) over a limit now" in status


def test_the_notice_is_a_template_checked_at_start_up() -> None:
    with pytest.raises(ValidationError, match=r"unknown placeholder \{whn\}; it may use \{when\}"):
        Settings(_env_file=None, rate_limited_message="Write again {whn}.")  # type: ignore[call-arg]
    settings = Settings(_env_file=None, rate_limit_user_per_minute=0)  # type: ignore[call-arg]
    assert runtime.limits(settings) == Limits(channel_per_minute=120, daily_tokens_per_user=1_000_000)
    assert runtime.loop_config(settings).texts.limited("day").endswith("again tomorrow and I'll pick it up from there.")
