"""A provider outage shows: logged once when it starts (with its cause) and once when it ends, counted by kind in
/metrics, and /healthz says degraded (customers still get an apology and a colleague) rather than down."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI, error, reply
from harness.database import settle
from harness.slack import replies_in

Sessions = async_sessionmaker[AsyncSession]


async def get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        body = await response.json() if response.content_type == "application/json" else await response.text()
        return response.status, body


async def test_an_outage_is_logged_once_counted_by_kind_and_degrades_health(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agents.offline")
    status, health = await get(f"{slack_bot.monitoring_url}/healthz")
    assert status == 200 and health["llm"]["status"] == "ok"

    fake_llm.rule = lambda request: error(503, "overloaded")  # every chat completion fails
    for text in ("what is the warranty on the harrier?", "and on the kestrel?"):
        said = await emulator.user_says("C_SUPPORT", text)
        await replies_in(emulator, "C_SUPPORT", said.ts, 1)
    await settle(sessions)
    started = [r for r in caplog.records if "failed (server" in r.getMessage()]
    assert len(started) == 1 and "fake-model" in started[0].getMessage(), [r.getMessage() for r in caplog.records]
    status, health = await get(f"{slack_bot.monitoring_url}/healthz")
    assert status == 200 and health["ready"] is True
    assert health["llm"]["status"] == "degraded" and health["llm"]["failures"] >= 2
    assert "server" in health["llm"]["last_error"]
    _, metrics = await get(f"{slack_bot.monitoring_url}/metrics")
    failed = [line for line in metrics.splitlines() if line.startswith('helpdesk_llm_failures_total{kind="server"}')]
    assert failed and float(failed[0].rsplit(" ", 1)[1]) >= 2

    fake_llm.rule = None
    fake_llm.script(reply("The Harrier X4 has a two-year warranty."))
    said = await emulator.user_says("C_SUPPORT", "thanks, one more: the osprey?")
    await replies_in(emulator, "C_SUPPORT", said.ts, 1)
    assert any("answers again" in r.getMessage() for r in caplog.records)
    status, health = await get(f"{slack_bot.monitoring_url}/healthz")
    assert health["llm"] == {"status": "ok", "failing_since": None, "failures": 0, "last_error": None}
    _, metrics = await get(f"{slack_bot.monitoring_url}/metrics")
    assert "helpdesk_llm_call_seconds_count 1.0" in metrics
