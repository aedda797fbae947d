"""Statements built once, for the hot path: a statement's SQL is rendered for the driver when its module is imported
(`:name` placeholders become asyncpg's `$n`), and each call hands the driver that string and the values in order. No
clause is built, no cache key generated, nothing compiled and no ORM session made per call; asyncpg prepares the
string once per connection (its statement cache).

A statement that is a transaction by itself runs on a connection of `alone(engine)`: the driver's own connection,
lent by the engine's pool, outside any transaction. Postgres commits it alone, without the BEGIN and COMMIT round
trips around it, and none of SQLAlchemy's connection, execution context or result objects is made for it (they were
two thirds of a statement's CPU in the client). Its errors are SQLAlchemy's as any other statement's: translated by
the dialect, a dropped connection invalidating the pool's older connections, the engine's `on_error` callbacks
told. Statements that must commit together run in one (`engine.begin()`), through SQLAlchemy."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from typing import Any, TypeAlias, TypeVar
from weakref import WeakKeyDictionary

from sqlalchemy import event, text
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection, PGDialect_asyncpg
from sqlalchemy.engine import Engine, ExceptionContext
from sqlalchemy.exc import DBAPIError, MultipleResultsFound, NoResultFound
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.util import greenlet_spawn

TRANSACTION_POOLER = "helpdesk_transaction_pooler"
"""An engine's execution option, set by `agents.db.engine.make_engine` when its URL is a pooler in transaction mode."""

_DRIVER = PGDialect_asyncpg()  # type: ignore[no-untyped-call]

T = TypeVar("T")
ErrorCallback = Callable[[BaseException], None]
_CALLBACKS: WeakKeyDictionary[Engine, list[ErrorCallback]] = WeakKeyDictionary()


class Row:
    """One row: its values by position (`row[0]`, unpacking) and by column name (`row.id`, `row._mapping`)."""

    __slots__ = ("_index", "_values")

    def __init__(self, values: tuple[Any, ...], index: Mapping[str, int]) -> None:
        self._values = values
        self._index = index

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # the slots themselves, before they are set (copy, pickle), and dunders
            raise AttributeError(name)
        try:
            return self._values[self._index[name]]
        except KeyError:
            raise AttributeError(name) from None

    def __eq__(self, other: object) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Row | tuple) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __getitem__(self, position: int) -> Any:
        return self._values[position]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Row({self._mapping!r})"

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._index, self._values, strict=True))


class Rows:
    """A statement's outcome: the rows it returned (none for one without RETURNING) and how many rows it touched."""

    __slots__ = ("rowcount", "rows")

    def __init__(self, rows: list[Row], rowcount: int) -> None:
        self.rows = rows
        self.rowcount = rowcount

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def all(self) -> list[Row]:
        return self.rows

    def first(self) -> Row | None:
        return self.rows[0] if self.rows else None

    def one(self) -> Row:
        if len(self.rows) != 1:
            raise NoResultFound("no row") if not self.rows else MultipleResultsFound(f"{len(self.rows)} rows")
        return self.rows[0]

    def scalar(self) -> Any:
        return self.rows[0][0] if self.rows else None


def _rows(names: Sequence[str], records: Sequence[Sequence[Any]]) -> Rows:
    index = {name: n for n, name in enumerate(names)}
    return Rows([Row(tuple(record), index) for record in records], len(records))


class Statement:
    """One statement's SQL as the driver takes it, and the order of its values."""

    def __init__(self, sql: str, *, returns_rows: bool | None = None) -> None:
        compiled = text(sql).compile(dialect=_DRIVER)
        self.sql = compiled.string
        self.names = tuple(compiled.positiontup or ())
        words = sql.split()
        guess = words[0].upper() in ("SELECT", "WITH", "VALUES") or "RETURNING" in (w.upper() for w in words)
        self.returns_rows = guess if returns_rows is None else returns_rows
        """Read with the driver's `fetch`; otherwise `execute`, whose status line tells the rows touched. Guessed
        from the SQL unless said (a WITH whose last statement returns nothing)."""

    async def run(self, conn: Conn, values: Mapping[str, Any]) -> Rows:
        ordered = tuple(values[name] for name in self.names)
        if isinstance(conn, Lent):
            return await conn.run(self, ordered)
        result = await conn.exec_driver_sql(self.sql, ordered)
        if not result.returns_rows:
            return Rows([], result.rowcount)
        return _rows(tuple(result.keys()), result.all())

    async def run_many(self, conn: Conn, rows: Sequence[Mapping[str, Any]]) -> None:
        """The statement once for each of `rows` (no rows read): one round trip, the driver pipelining them."""
        ordered = [tuple(values[name] for name in self.names) for values in rows]
        if isinstance(conn, Lent):
            await conn.call(conn.driver.executemany(self.sql, ordered), self)
        else:
            await conn.exec_driver_sql(self.sql, ordered)


class Lent:
    """The driver's connection, lent by the engine's pool for statements that are each a transaction."""

    def __init__(self, engine: Engine, fairy: Any) -> None:
        self._engine = engine
        self._fairy = fairy
        self.driver = fairy.driver_connection
        self._broken: BaseException | None = None

    async def run(self, statement: Statement, values: tuple[Any, ...]) -> Rows:
        if statement.returns_rows:
            records = await self.call(self.driver.fetch(statement.sql, *values), statement)
            return _rows(tuple(records[0].keys()) if records else (), records)
        return Rows([], _touched(await self.call(self.driver.execute(statement.sql, *values), statement)))

    async def call(self, work: Awaitable[T], statement: Statement | str) -> T:
        """`work` on the driver's connection, its failure as SQLAlchemy's."""
        try:
            return await work
        except Exception as exc:
            raise self._translated(exc, statement) from exc
        except BaseException as exc:
            # Cancelled mid-statement: whether the server ran it, and what the connection is in the middle of, are
            # unknown, so it is not pooled again (as SQLAlchemy does with its own).
            self._broken = exc
            raise

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Lent]:
        """The block's statements in one transaction: committed at its end, rolled back if it raises."""
        began = self.driver.transaction()
        try:
            await self.call(began.start(), "BEGIN")
        except BaseException as exc:
            self._broken = exc  # the driver holds on to a transaction that never began
            raise
        try:
            yield self
        except BaseException:
            if self._broken is None and not self.driver.is_closed():
                try:
                    await self.call(began.rollback(), "ROLLBACK")
                except Exception:  # the block's own failure is the one to raise; this connection is not lent again
                    self._broken = self._broken or RuntimeError("rollback failed")
            raise
        try:
            await self.call(began.commit(), "COMMIT")
        except BaseException as exc:
            self._broken = exc
            raise

    def _translated(self, exc: Exception, statement: Statement | str) -> Exception:
        """`exc` as SQLAlchemy raises it for its own statements (`DBAPIError` and its kinds), telling the engine's
        `on_error` callbacks; a dropped connection invalidates the pool's connections of its generation."""
        dialect = self._engine.dialect
        dbapi = dialect.loaded_dbapi
        try:
            AsyncAdapt_asyncpg_connection._handle_exception_no_connection(dbapi, exc)
        except dbapi.Error as adapted:
            disconnected = bool(self.driver.is_closed())
            wrapped = DBAPIError.instance(
                statement if isinstance(statement, str) else statement.sql, None, adapted, dbapi.Error,
                hide_parameters=True, dialect=dialect, connection_invalidated=disconnected,
            )  # fmt: skip
            if disconnected:
                self._engine.pool._invalidate(self._fairy, wrapped, _checkin=False)
                self._broken = wrapped
            for callback in _CALLBACKS.get(self._engine, ()):
                callback(adapted)
            return wrapped
        except Exception:
            pass
        self._broken = exc  # not the server's answer (a reset socket, a timeout): the connection is suspect
        return exc

    async def give_back(self) -> None:
        if self._broken is None and self.driver.is_in_transaction():  # never pooled in the middle of one
            self._broken = RuntimeError("given back inside a transaction")
        if self._broken is not None:
            self._fairy.invalidate(self._broken)
        await greenlet_spawn(self._fairy.close)


Conn: TypeAlias = Lent | AsyncConnection
"""What a `Statement` runs on: a connection lent by `alone`, or SQLAlchemy's (in a transaction)."""


def _touched(status: str) -> int:
    """The rows an INSERT, UPDATE or DELETE touched, from its status line ("UPDATE 3", "INSERT 0 1")."""
    last = status.rpartition(" ")[2]
    return int(last) if last.isdigit() else 0


def on_error(engine: AsyncEngine, callback: ErrorCallback) -> None:
    """Call `callback` with the driver's error (as the dialect adapts it: `.sqlstate`) of every statement of
    `engine` that fails, whether through SQLAlchemy or `alone`."""
    sync_engine = engine.sync_engine

    def heard(context: ExceptionContext) -> None:
        callback(context.original_exception)

    event.listen(sync_engine, "handle_error", heard)
    _CALLBACKS.setdefault(sync_engine, []).append(callback)


def engine_of(sessions: async_sessionmaker[AsyncSession]) -> AsyncEngine:
    """The engine `sessions` are made on (`agents.db.engine.make_sessions`)."""
    engine = sessions.kw["bind"]
    assert isinstance(engine, AsyncEngine)
    return engine


def alone(engine: AsyncEngine) -> Callable[[], AbstractAsyncContextManager[Conn]]:
    """A connection of `engine` for statements that are a transaction each (`async with alone(engine)() as conn`).
    Behind a pooler in transaction mode a statement is prepared and run in two round trips, which only a
    transaction keeps on one server connection: there they keep their BEGIN and COMMIT."""
    if engine.get_execution_options().get(TRANSACTION_POOLER):
        return engine.begin

    return partial(_lent, engine)


def begun(engine: AsyncEngine) -> Callable[[], AbstractAsyncContextManager[Conn]]:
    """A connection of `engine` in a transaction, for statements that must commit together (`async with
    begun(engine)() as conn`): the driver's own, as with `alone`; SQLAlchemy's behind a transaction pooler."""
    if engine.get_execution_options().get(TRANSACTION_POOLER):
        return engine.begin
    return partial(_begun, engine)


@asynccontextmanager
async def _lent(engine: AsyncEngine) -> AsyncIterator[Lent]:
    conn = Lent(engine.sync_engine, await engine.raw_connection())
    try:
        yield conn
    finally:
        await conn.give_back()


@asynccontextmanager
async def _begun(engine: AsyncEngine) -> AsyncIterator[Lent]:
    async with _lent(engine) as conn, conn.transaction():
        yield conn
