"""A Slack-only bot that declares no MCP server never loads the MCP SDK or Microsoft's Agents SDK: together some
40 MB of every process's memory that only an operator using them should pay for."""

from __future__ import annotations

import asyncio
import json
import sys

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI
from harness import bot as harness

STARTS = """
import asyncio, json, sys

from bot.compose import running_bot
from bot.settings import get_settings


async def main() -> None:
    async with running_bot(get_settings()) as bot:
        await bot.warm_up.wait()
        loaded = sorted({name.split(".")[0] for name in sys.modules})
        print(json.dumps(loaded))


asyncio.run(main())
"""


async def test_a_slack_only_bot_without_mcp_servers_loads_neither_sdk(
    database_url: str,
    fake_llm: FakeOpenAI,
    emulator: SlackEmulator,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """The composition root itself, run in a fresh interpreter with the settings a Slack-only operator has (the
    sample declaration, which names no MCP server), up to warm."""
    env = harness.bot_env(database_url, fake_llm, emulator)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        STARTS,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    loaded = set(json.loads(out.decode().strip().splitlines()[-1]))
    assert "slack_bolt" in loaded  # it did build the Slack side
    assert not loaded & {"mcp", "mcp_types", "microsoft_agents"}
