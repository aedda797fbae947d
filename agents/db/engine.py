"""Engine and session factory, made at start-up and disposed at shutdown (never at import)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from agents.db.statements import TRANSACTION_POOLER, on_error
from agents.db.url import async_url

Sessions = async_sessionmaker[AsyncSession]


IDLE_IN_TRANSACTION_S = 10.0
"""How long the server keeps a transaction of ours that waits on us (idle in transaction) before it ends the
session. Every transaction here is a few statements in a row, so one left waiting is a frozen or cut-off process's
(SIGSTOP, a paused VM, a partition: its connection stays up): without this bound its row locks outlive its leases
for as long as it is frozen, and another process's outbox waits behind them (bench/fault_processes.py)."""


def make_engine(
    url: str,
    *,
    pool_size: int = 20,
    transaction_pooler: bool = False,
    idle_in_transaction_s: float | None = IDLE_IN_TRANSACTION_S,
) -> AsyncEngine:
    """`transaction_pooler`: `url` is PgBouncer (or alike) in transaction mode, where a prepared statement may
    meet another server connection than the one it was prepared on: no statement caches, unique names; a pooler
    passes no server settings either (`idle_in_transaction_s` is then the role's, ALTER ROLE ... SET
    idle_in_transaction_session_timeout)."""
    pooled: dict[str, object] = {}
    if transaction_pooler:
        pooled = {
            "connect_args": {
                "statement_cache_size": 0,
                "prepared_statement_name_func": lambda: f"__asyncpg_{uuid.uuid4()}__",
            },
            "execution_options": {TRANSACTION_POOLER: True},
        }
        url = async_url(url).update_query_dict({"prepared_statement_cache_size": "0"}).render_as_string(False)
    elif idle_in_transaction_s is not None:
        timeout_ms = str(round(idle_in_transaction_s * 1000))
        pooled = {"connect_args": {"server_settings": {"idle_in_transaction_session_timeout": timeout_ms}}}
    return create_async_engine(
        async_url(url),
        # A hard cap, no overflow: a connection opened past the pool was closed again on its return, so a burst
        # paid a Postgres backend's start and its statements' preparing over and over (and `pool_size` did not
        # say how many connections a process could take). Connections open as they are first needed.
        pool_size=pool_size,
        max_overflow=0,
        # No pre-ping: with asyncpg it is three round trips (BEGIN, a ping, ROLLBACK) on every checkout, more
        # than a turn's own statements. A connection the server dropped fails its first statement instead;
        # SQLAlchemy then discards the whole pool, and the caller's retry (a turn run again, Slack's redelivery)
        # gets a fresh one. Recycling bounds how stale an idle connection can get.
        pool_recycle=600,
        # Errors and logs name the statement, never its values: those are customers' messages.
        hide_parameters=True,
        **pooled,
    )


def make_sessions(engine: AsyncEngine) -> Sessions:
    return async_sessionmaker(engine, expire_on_commit=False)


REFUSING_WRITES = ("53", "58")
"""SQLSTATE classes of a server that is up but cannot write: insufficient resources (53100 disk full, "could not
extend file"; 53200 out of memory) and system errors (58030 I/O error). A read such as /healthz's SELECT 1 still
succeeds then, while every message the bot cannot store is refused."""


@dataclass
class WriteHealth:
    """Whether the server has lately refused to write (`REFUSING_WRITES`): failing while the last such error is
    less than `window_s` old, with when the run of them began, how many and the last one."""

    window_s: float = 10.0
    failing_since: datetime | None = None
    failures: int = 0
    last_error: str | None = None
    _last_at: float = field(default=0.0, repr=False)

    @property
    def failing(self) -> bool:
        return self.failing_since is not None and time.monotonic() - self._last_at < self.window_s

    def record(self, sqlstate: str, error: BaseException) -> None:
        if not self.failing:
            self.failing_since, self.failures = datetime.now(UTC), 0
        self.failures += 1
        self._last_at = time.monotonic()
        self.last_error = f"{sqlstate}: {str(error).splitlines()[0][:200]}"

    def status(self) -> dict[str, object]:
        failing = self.failing
        return {
            "status": "failing" if failing else "ok",
            "failing_since": self.failing_since.isoformat() if failing and self.failing_since else None,
            "failures": self.failures if failing else 0,
            "last_error": self.last_error,
        }


def watch_writes(engine: AsyncEngine, health: WriteHealth | None = None) -> WriteHealth:
    """A `WriteHealth` (`health`, or a new one) fed by every statement of `engine` that the server refuses for want
    of disk, memory or I/O."""
    health = health if health is not None else WriteHealth()

    def refused(error: BaseException) -> None:
        sqlstate = getattr(error, "sqlstate", None)
        if isinstance(sqlstate, str) and sqlstate.startswith(REFUSING_WRITES):
            health.record(sqlstate, error)

    on_error(engine, refused)
    return health


UNAVAILABLE = ("08", "53100", "53200", "53300", "57P01", "57P02", "57P03", "58")
"""SQLSTATEs that say the server could not do the work, not that the work is wrong: connection failures, a full
disk, out of memory, too many connections, a shutdown or crash restart, and system errors (not 57014, a statement
timeout: that can be the statement's own fault)."""


def database_unavailable(exc: BaseException) -> bool:
    """Whether `exc` is the database failing (lost connection, full disk, restart), not the statement: what is
    tried again when the database is back, without counting against the work."""
    if isinstance(exc, ConnectionError):
        return True
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        sqlstate = getattr(exc.orig, "sqlstate", None)
        return isinstance(sqlstate, str) and sqlstate.startswith(UNAVAILABLE)
    return False
