"""Benchmark of a new user's first start: `python -m bot playground` with nothing configured, in an empty
folder, from the process's launch to the line that gives the page's URL (the embedded Postgres created and
migrated, the sample knowledge stored, the bot and the page serving); then the second start of the same
folder. Each run is a fresh process, as a user would start it.

`--python PATH` times another installation's interpreter (another checkout's `.venv/bin/python`, run from
that checkout), which is how the README's "before" figure was taken.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import tables
from bench.setup import RESULTS, machine, section, summary, table, write_report

READY = "Playground: open"


def start_until_ready(python: str, cwd: Path, data_dir: Path, timeout_s: float = 300.0) -> float:
    """Seconds from launch to the playground's URL line; the process is then stopped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "OPENAI_", "EMBEDDINGS"))}
    env |= {"DATA_DIR": str(data_dir), "PLAYGROUND_PORT": "0", "DATABASE_URL": ""}
    started = time.perf_counter()
    process = subprocess.Popen(
        [python, "-m", "bot", "playground"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    try:
        for line in process.stdout:
            lines.append(line)
            if READY in line:
                return time.perf_counter() - started
            if time.perf_counter() - started > timeout_s:
                break
        raise RuntimeError("the playground did not start:\n" + "".join(lines[-30:]))
    finally:
        process.terminate()
        process.wait(timeout=30)


def main(
    quick: bool = False, results: Path = RESULTS, python: str = sys.executable, cwd: Path | None = None
) -> dict[str, Any]:
    runs = 1 if quick else 3
    where = cwd or Path(__file__).resolve().parent.parent
    first: list[float] = []
    second: list[float] = []
    section(f"first start of the playground ({runs} runs, {python})")
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="helpdesk-first-start-") as tmp:
            first.append(start_until_ready(python, where, Path(tmp) / "data"))
            second.append(start_until_ready(python, where, Path(tmp) / "data"))
    report = {
        "benchmark": "first_start",
        "python": python,
        "first_start_s": [round(s, 2) for s in first],
        "second_start_s": [round(s, 2) for s in second],
        "first_start": summary(first),
        "second_start": summary(second),
        "machine": machine("embedded", None),
        "total_s": round(sum(first) + sum(second), 1),
    }
    starts = tables.first_start(report)
    print(table(starts.headers, starts.rows))
    name = "first_start.json" if python == sys.executable else "first_start-other.json"
    return write_report(report, results / name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.first_start", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the installation to time")
    parser.add_argument("--cwd", type=Path, help="where to run it (that installation's checkout)")
    args = parser.parse_args()
    main(quick=args.quick, python=args.python, cwd=args.cwd)
