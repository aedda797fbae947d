"""A transaction left waiting on its client (a process frozen by SIGSTOP or a paused VM, whose connection stays up)
is ended by the server after IDLE_IN_TRANSACTION_S, and its locks with it: the other processes' statements that
wait behind them go on (bench/fault_processes.py froze a process mid-send and saw the other's outbox stall for as
long as the freeze)."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from agents.db.engine import IDLE_IN_TRANSACTION_S, make_engine

LOCK_KEY = 260026


async def test_the_server_ends_a_transaction_left_waiting(database_url: str) -> None:
    frozen = make_engine(database_url, pool_size=1, idle_in_transaction_s=1.0)
    other = make_engine(database_url, pool_size=1)
    try:
        conn = await frozen.connect()
        await conn.begin()
        await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})
        # From here `frozen` sends nothing, as a stopped process would not.
        started = time.monotonic()
        async with other.begin() as waiting:
            await asyncio.wait_for(waiting.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY}), 30)
        assert time.monotonic() - started < 5
        with pytest.raises(DBAPIError):  # resumed, it finds its session gone: nothing it wrote is committed
            await conn.execute(text("SELECT 1"))
        await conn.invalidate()
        await conn.close()
    finally:
        await frozen.dispose()
        await other.dispose()


async def test_every_engine_bounds_it_by_default(database_url: str) -> None:
    engine = make_engine(database_url, pool_size=1)
    try:
        async with engine.connect() as conn:
            shown = await conn.scalar(text("SHOW idle_in_transaction_session_timeout"))
    finally:
        await engine.dispose()
    assert shown == f"{IDLE_IN_TRANSACTION_S:g}s"
