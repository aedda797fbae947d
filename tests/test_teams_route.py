"""`POST /api/messages` as a stranger and as Teams with a broken body: the token is checked before the body is read,
so a stranger's body (however deep) is never parsed, and nothing anyone sends gets a 500 or a logged traceback."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest

from bot.compose import Bot
from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI
from fakes.teams_api import TeamsEmulator
from fakes.teams_identity import TokenKind
from harness import teams as th
from harness.bot import bot_settings, serving

DEEP = b"[" * 100_000 + b"]" * 100_000
"""Valid JSON under the 256 KB limit, nested past what a recursive parser survives."""


@pytest.fixture
async def bot(
    database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator, teams: TeamsEmulator
) -> AsyncIterator[Bot]:
    async with serving(bot_settings(database_url, fake_llm, emulator, **th.teams_settings(teams)), emulator) as bot:
        yield bot


async def post(bot: Bot, teams: TeamsEmulator, body: bytes, token: TokenKind) -> int:
    bearer = teams.login.channel_token(token, service_url=teams.service_url)
    headers = {"Content-Type": "application/json"} | ({} if bearer is None else {"Authorization": f"Bearer {bearer}"})
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{bot.url}/api/messages", data=body, headers=headers) as answer,
    ):
        return answer.status


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Exceptions logged: aiohttp's "Error handling request" for a handler that raised (and answered 500), or ours.
    (The Agents SDK logs a wrong audience at ERROR with the stack, not an exception: its own noise.)"""
    return [r for r in caplog.records if r.exc_info]


@pytest.mark.parametrize("token", [TokenKind.FORGED, TokenKind.EXPIRED, TokenKind.WRONG_AUDIENCE])
async def test_a_stranger_is_refused_before_the_body_is_parsed(
    bot: Bot, teams: TeamsEmulator, token: TokenKind, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    assert await post(bot, teams, DEEP, token) == 401
    assert await post(bot, teams, b"not even JSON", token) == 401  # a 400 would say the body was read first
    assert not tracebacks(caplog), "no traceback for strangers"


async def test_teams_with_a_malformed_body_gets_400_never_500(
    bot: Bot, teams: TeamsEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    for body in (DEEP, b"not even JSON", b"[]", b'{"type": "message"}'.replace(b"}", b""), b"\xff\xfe{}"):
        assert await post(bot, teams, body, TokenKind.VALID) == 400, body[:20]
    assert not tracebacks(caplog)
