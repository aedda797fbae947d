"""`python -m bench [NAME ...] [--quick] [--profile]`: run the named benchmarks (all when none is named)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import (
    admin,
    cpu,
    embedding,
    engine,
    faults,
    first_start,
    inflight,
    install,
    knowledge,
    relay,
    routing,
    scale,
    shape,
    slack,
    streaming,
    teams,
    tools,
)
from bench.setup import RESULTS

MODULES = (
    engine,
    slack,
    teams,
    relay,
    knowledge,
    routing,
    admin,
    first_start,
    install,
    inflight,
    tools,
    faults,
    shape,
    streaming,
    cpu,
    embedding,
    scale,
)
BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {m.__name__.removeprefix("bench."): m.main for m in MODULES}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run: {', '.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true", help="a smaller run (under 30 s) to check that it works")
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="folder for the JSON results (default: bench/results)"
    )
    parser.add_argument("--profile", action="store_true", help="cpu only: flame graphs of the bot process (py-spy)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    if args.profile and args.names != ["cpu"]:
        parser.error("--profile goes with the cpu benchmark alone: python -m bench cpu --profile")
    options = {"profile": True} if args.profile else {}
    for name in args.names or list(BENCHMARKS):
        BENCHMARKS[name](quick=args.quick, results=args.results, **options)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
