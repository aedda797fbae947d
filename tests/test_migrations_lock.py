"""Start-up on a fresh database: processes started together migrate one at a time (a Postgres advisory lock), and
with MIGRATE_AT_START=false a process refuses a schema its release was not written for."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.engine import make_url

from agents.db import migrate
from bot.runtime.startup import open_database
from bot.settings import Settings
from bot.slack.preflight import RefusedToStart
from harness.bot import ROOT, clean_environ
from harness.database import admin


@pytest.fixture
async def empty_database(server_url: str) -> AsyncIterator[str]:
    """A database with nothing in it, not even the pgvector extension: as a new deployment's."""
    name = f"helpdesk_fresh_{uuid.uuid4().hex[:8]}"
    await admin(server_url, f'CREATE DATABASE "{name}"')
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        await admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_four_processes_migrating_a_fresh_database_at_once_all_succeed(empty_database: str) -> None:
    env = clean_environ() | {"DATABASE_URL": empty_database}
    start = [sys.executable, "-m", "bot", "migrate"]
    pipes = {"stdout": asyncio.subprocess.PIPE, "stderr": asyncio.subprocess.PIPE}
    processes = [await asyncio.create_subprocess_exec(*start, env=env, cwd=ROOT, **pipes) for _ in range(4)]
    results = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in processes)), timeout=240)
    codes = [p.returncode for p in processes]
    assert codes == [0, 0, 0, 0], [err.decode()[-800:] for _, err in results]
    assert await migrate.behind(empty_database) is None


async def test_a_process_that_does_not_migrate_refuses_a_schema_behind_its_release(empty_database: str) -> None:
    settings = Settings(_env_file=None, database_url=empty_database, migrate_at_start=False)  # type: ignore[call-arg]
    with pytest.raises(
        RefusedToStart, match=r"at revision none and this release needs \w+: run `python -m bot migrate`"
    ):
        async with open_database(settings):
            pass
    await asyncio.to_thread(migrate.upgrade, empty_database)
    async with open_database(settings) as db:
        assert db.url == empty_database
