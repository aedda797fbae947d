"""A database server that is up but refuses writes (its disk full: "could not extend file", SQLSTATE 53100) answers
/healthz's SELECT 1, while every event the bot cannot store is refused: /healthz says so, and recovers once the
refusals stop. (`python -m bench.fault_disk` fills a real disk; here the server raises the same error.)"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

DISK_FULL = text(
    "DO $$ BEGIN RAISE EXCEPTION 'could not extend file \"base/1/2\": No space left on device' "
    "USING ERRCODE = 'disk_full'; END $$"
)


async def health(bot: Any) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{bot.monitoring_url}/healthz") as response:
        return response.status, await response.json()


async def test_refused_writes_make_healthz_unready_until_they_stop(slack_bot: Any) -> None:
    status, body = await health(slack_bot)
    assert status == 200 and body["database"] == "ok" and "database_writes" not in body

    slack_bot.db.writes.window_s = 0.5
    for _ in range(2):
        with pytest.raises(DBAPIError):
            async with slack_bot.db.engine.connect() as conn:
                await conn.execute(DISK_FULL)
    status, body = await health(slack_bot)
    assert status == 503 and body["ready"] is False
    assert body["database"].startswith("refusing writes: 53100") and "No space left" in body["database"]
    assert body["database_writes"]["status"] == "failing" and body["database_writes"]["failures"] == 2

    await asyncio.sleep(0.6)
    status, body = await health(slack_bot)
    assert status == 200 and body["database"] == "ok" and "database_writes" not in body


async def test_other_errors_are_not_refused_writes(slack_bot: Any) -> None:
    with pytest.raises(DBAPIError):
        async with slack_bot.db.engine.connect() as conn:
            await conn.execute(text("SELECT 1/0"))
    status, body = await health(slack_bot)
    assert status == 200 and body["database"] == "ok" and "database_writes" not in body
