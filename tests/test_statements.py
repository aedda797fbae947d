"""The hot path's statements on the driver's own connection (`agents.db.statements.alone`): what they return, and
that their failures are SQLAlchemy's as any other statement's (the callers' handling and /healthz depend on it).
A real Postgres; a server-side error, a backend killed under a pooled connection, a statement cancelled."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.exc import DBAPIError, IntegrityError, NoResultFound
from sqlalchemy.ext.asyncio import AsyncEngine

import agents
import bot
import escalation
from agents.db.engine import database_unavailable, make_engine, watch_writes
from agents.db.statements import Lent, Statement, alone, begun
from harness.database import admin

DISK_FULL = Statement(
    "DO $$ BEGIN RAISE EXCEPTION 'could not extend file \"base/1/2\": No space left on device' "
    "USING ERRCODE = 'disk_full'; END $$"
)
PID = Statement("SELECT pg_backend_pid() AS pid")


@pytest.fixture
async def one_connection(database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine whose pool holds one connection, so that each `alone` gets the same one back."""
    engine = make_engine(database_url, pool_size=1)
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_rows_read_by_name_and_position_and_writes_say_how_many(engine: AsyncEngine) -> None:
    async with alone(engine)() as conn:
        assert isinstance(conn, Lent)
        rows = await Statement("SELECT n, n * 2 AS twice FROM generate_series(1, :top) AS n").run(conn, {"top": 3})
        assert [(row.n, row.twice) for row in rows] == [(1, 2), (2, 4), (3, 6)]
        assert rows.first() is not None and rows.first()._mapping == {"n": 1, "twice": 2}  # type: ignore[union-attr]
        assert rows.scalar() == 1 and [tuple(row) for row in rows.all()] == [(1, 2), (2, 4), (3, 6)]
        with pytest.raises(NoResultFound):
            (await Statement("SELECT 1 WHERE false").run(conn, {})).one()
        await Statement("CREATE TEMP TABLE t (n int PRIMARY KEY)").run(conn, {})
        inserted = await Statement("INSERT INTO t SELECT generate_series(1, :top)").run(conn, {"top": 4})
        updated = await Statement("UPDATE t SET n = n + 10 WHERE n > :above").run(conn, {"above": 1})
        assert (inserted.rowcount, updated.rowcount, updated.all()) == (4, 3, [])
        with pytest.raises(IntegrityError):  # the dialect's kind of error, as through SQLAlchemy
            await Statement("INSERT INTO t VALUES (:n)").run(conn, {"n": 1})
        await Statement("DROP TABLE t").run(conn, {})


async def test_a_refused_write_is_sqlalchemys_error_and_tells_the_write_health(one_connection: AsyncEngine) -> None:
    health = watch_writes(one_connection)
    with pytest.raises(DBAPIError) as caught:
        async with alone(one_connection)() as conn:
            await DISK_FULL.run(conn, {})
    assert getattr(caught.value.orig, "sqlstate", None) == "53100" and database_unavailable(caught.value)
    assert "No space left on device" in str(caught.value) and not caught.value.connection_invalidated
    assert health.failing and health.failures == 1 and (health.last_error or "").startswith("53100")
    async with alone(one_connection)() as conn:  # the connection was fine: lent again, and it works
        assert (await Statement("SELECT 1").run(conn, {})).scalar() == 1


async def test_a_killed_connection_is_a_lost_connection_and_the_next_statement_gets_a_new_one(
    one_connection: AsyncEngine, database_url: str
) -> None:
    async with alone(one_connection)() as conn:
        pid = (await PID.run(conn, {})).scalar()
    await admin(database_url, f"SELECT pg_terminate_backend({int(pid)})")
    await asyncio.sleep(0.2)
    with pytest.raises(DBAPIError) as caught:
        async with alone(one_connection)() as conn:
            await PID.run(conn, {})
    assert caught.value.connection_invalidated and database_unavailable(caught.value)
    async with alone(one_connection)() as conn:
        assert (await PID.run(conn, {})).scalar() not in (None, pid)


async def test_a_statement_cancelled_midway_does_not_lend_its_connection_again(one_connection: AsyncEngine) -> None:
    async with alone(one_connection)() as conn:
        pid = (await PID.run(conn, {})).scalar()

    async def slow() -> None:
        async with alone(one_connection)() as conn:
            await Statement("SELECT pg_sleep(5)").run(conn, {})

    task = asyncio.create_task(slow())
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with alone(one_connection)() as conn:
        assert (await PID.run(conn, {})).scalar() not in (None, pid)


async def test_a_transaction_commits_its_statements_together_or_none_of_them(one_connection: AsyncEngine) -> None:
    insert, count = Statement("INSERT INTO tx_probe VALUES (:n)"), Statement("SELECT count(*) FROM tx_probe")
    async with alone(one_connection)() as conn:
        await Statement("CREATE TABLE tx_probe (n int PRIMARY KEY)").run(conn, {})
    try:
        async with begun(one_connection)() as conn:
            await insert.run_many(conn, [{"n": 1}, {"n": 2}])
        with pytest.raises(IntegrityError):
            async with begun(one_connection)() as conn:
                await insert.run(conn, {"n": 3})
                await insert.run(conn, {"n": 1})  # refused: the 3 goes too
        with pytest.raises(RuntimeError):
            async with begun(one_connection)() as conn:
                await insert.run(conn, {"n": 4})
                raise RuntimeError("the block's own failure")
        async with alone(one_connection)() as conn:  # the same connection, outside any transaction again
            assert (await count.run(conn, {})).scalar() == 2
            assert not isinstance(conn, Lent) or not conn.driver.is_in_transaction()
    finally:
        async with alone(one_connection)() as conn:
            await Statement("DROP TABLE tx_probe").run(conn, {})


def _statements() -> list[tuple[str, Statement]]:
    """Every statement the bot's modules build at import (a module's `Statement`s, by module and name)."""
    found = []
    for package in (agents, bot, escalation):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if module.name.endswith("__main__"):
                continue
            for name, value in vars(importlib.import_module(module.name)).items():
                if isinstance(value, Statement):
                    found.append((f"{module.name}.{name}", value))
    return found


async def test_every_statement_says_rightly_whether_it_returns_rows_and_names_its_columns_once(
    engine: AsyncEngine,
) -> None:
    """Prepared on the server: a statement read with `fetch` has result columns, one run with `execute` has none
    (its rows-touched count comes from the status line), and no two columns share a name (`Row` reads by name)."""
    statements = _statements()
    assert len(statements) > 30
    wrong = []
    async with alone(engine)() as conn:
        assert isinstance(conn, Lent)
        for name, statement in statements:
            columns = [column.name for column in (await conn.driver.prepare(statement.sql)).get_attributes()]
            if bool(columns) != statement.returns_rows or len(set(columns)) != len(columns):
                wrong.append((name, statement.returns_rows, columns))
    assert wrong == []


async def test_a_connection_given_back_inside_a_transaction_is_not_lent_again(one_connection: AsyncEngine) -> None:
    async with alone(one_connection)() as conn:
        assert isinstance(conn, Lent)
        pid = (await PID.run(conn, {})).scalar()
        await conn.driver.execute("BEGIN")  # left open, as a BEGIN whose failure the driver did not undo would be
    async with alone(one_connection)() as conn:
        assert isinstance(conn, Lent) and not conn.driver.is_in_transaction()
        assert (await PID.run(conn, {})).scalar() not in (None, pid)
