"""The bot's processes on uvloop (issue 30), unless told otherwise: real `python -m bot serve` processes, their ready
lines, and a customer answered through aiohttp, asyncpg and the Slack and OpenAI clients on that loop."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI, reply
from harness.bot import Start, bot_env, bot_process
from harness.slack import replies_in


async def test_a_serve_process_runs_on_uvloop_and_answers(
    start_bot: Start, emulator: SlackEmulator, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(reply("Answered on libuv."))
    bot = await start_bot()
    assert bot.loop == "uvloop"
    said = await emulator.user_says("C_SUPPORT", "which loop are you on?")
    assert await replies_in(emulator, "C_SUPPORT", said.ts, 1) == ["Answered on libuv."]
    # Bolt's warning that the client wins over SLACK_BOT_TOKEN (it does, as meant) is not written at every start.
    assert "WARNING" not in bot.log.read_text(errors="replace")


async def test_event_loop_asyncio_runs_the_standard_loop(
    database_url: str,
    sessions: async_sessionmaker[AsyncSession],
    fake_llm: FakeOpenAI,
    emulator: SlackEmulator,
) -> None:
    fake_llm.script(reply("Answered on asyncio's loop."))
    env = bot_env(database_url, fake_llm, emulator) | {"EVENT_LOOP": "asyncio"}
    async with bot_process(env, emulator) as bot:
        assert bot.loop == "asyncio"
        said = await emulator.user_says("C_SUPPORT", "and now?")
        assert await replies_in(emulator, "C_SUPPORT", said.ts, 1) == ["Answered on asyncio's loop."]
