"""`python -m bench shape`: the shape of the code a newcomer reads, measured rather than described.

Files and lines per package, the longest functions of the product, the uses of a platform value (`Platform.SLACK` /
`Platform.TEAMS`) outside the channels' own folders (`bot/slack`, `bot/teams`) and the composition root
(`bot/compose.py`, `bot/server.py`, `bot/settings.py`), what a wheel built from the tree holds at its top level, the
README's length, and how long the fast lane (`make test-fast`) takes. `--at REV` measures a past commit the same way
(from `git archive`, without its fast lane, which it may not have had); `--before REV` puts both in one report.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.setup import RESULTS, section, table, write_report

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("bot", "agents", "escalation", "db", "slacktext", "teamstext")
"""The shipped packages, under their present names and the names they had before issue 27."""
PACKAGES = (*PRODUCT, "fakes", "harness", "bench", "tests")
CHANNEL_HOMES = ("bot/slack/", "bot/teams/", "bot/slack_", "bot/teams_", "teamstext/")
"""Where a platform's own code lives (now, and before the channels had folders)."""
ROOT_MODULES = ("bot/compose.py", "bot/server.py", "bot/settings.py")
"""The composition root, which chooses the channels and so names them."""


def _python_files(tree: Path, package: str) -> list[Path]:
    return sorted(p for p in (tree / package).rglob("*.py") if "__pycache__" not in p.parts)


def packages(tree: Path) -> dict[str, dict[str, int]]:
    """Files and lines per package and per sub-package of the product (`bot/slack`, `agents/db`, ...)."""
    counts: dict[str, Counter[str]] = {}
    for package in PACKAGES:
        for path in _python_files(tree, package):
            parts = path.relative_to(tree).parts
            for name in {parts[0], "/".join(parts[:2])} if len(parts) > 2 and package in PRODUCT else {parts[0]}:
                entry = counts.setdefault(name, Counter())
                entry["files"] += 1
                entry["lines"] += len(path.read_text().splitlines())
    return {name: dict(entry) for name, entry in sorted(counts.items())}


def longest_functions(tree: Path, top: int = 10) -> list[dict[str, Any]]:
    found: list[tuple[int, str]] = []
    for package in PRODUCT:
        for path in _python_files(tree, package):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                    found.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(tree)}:{node.name}"))
    return [{"function": name, "lines": lines} for lines, name in sorted(found, reverse=True)[:top]]


def platform_branches(tree: Path) -> list[str]:
    """Each `Platform.SLACK` / `Platform.TEAMS` in shipped code outside the channels' folders and the root."""
    found = []
    for package in PRODUCT:
        for path in _python_files(tree, package):
            where = str(path.relative_to(tree))
            if where.startswith(CHANNEL_HOMES) or where in ROOT_MODULES:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "Platform"
                    and node.attr in ("SLACK", "TEAMS")
                ):
                    found.append(f"{where}:{node.lineno}")
    return found


def wheel(tree: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, str(tree)],
            check=True,
            capture_output=True,
        )
        built = next(Path(out).glob("*.whl"))
        names = zipfile.ZipFile(built).namelist()
        size = built.stat().st_size
    top = sorted({n.split("/")[0] for n in names if "/" in n and ".dist-info" not in n})
    return {"top_level": top, "files": len(names), "bytes": size}


def readme(tree: Path) -> dict[str, int]:
    text = (tree / "README.md").read_text()
    return {"lines": len(text.splitlines()), "words": len(text.split()), "bytes": len(text.encode())}


def fast_lane(tree: Path) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "not services", "-p", "no:cacheprovider"],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    last = (done.stdout.strip().splitlines() or [""])[-1]
    return {"seconds": round(time.perf_counter() - started, 1), "result": last, "ok": done.returncode == 0}


def measure(tree: Path, *, lane: bool) -> dict[str, Any]:
    return {
        "packages": packages(tree),
        "longest_functions": longest_functions(tree),
        "platform_branches": platform_branches(tree),
        "wheel": wheel(tree),
        "readme": readme(tree),
        "fast_lane": fast_lane(tree) if lane else None,
    }


def at(rev: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        return measure(Path(tmp), lane=False) | {"commit": rev}


def show(title: str, shape: dict[str, Any]) -> None:
    section(title)
    print(table(("package", "files", "lines"), [(k, v["files"], v["lines"]) for k, v in shape["packages"].items()]))
    print()
    print(table(("longest functions", "lines"), [(f["function"], f["lines"]) for f in shape["longest_functions"]]))
    branches = shape["platform_branches"]
    print(f"\nplatform branches outside the channels' folders: {len(branches)}", *branches, sep="\n  ")
    built = shape["wheel"]
    print(f"wheel: {built['files']} files, {built['bytes']:,} bytes; top level: {', '.join(built['top_level'])}")
    print("README: {lines} lines, {words} words, {bytes:,} bytes".format(**shape["readme"]))
    if shape["fast_lane"]:
        print("fast lane: {seconds} s ({result})".format(**shape["fast_lane"]))


def main(*, quick: bool = False, results: Path = RESULTS, before: str | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    report: dict[str, Any] = {"now": measure(ROOT, lane=not quick)}
    if before:
        report["before"] = at(before)
        show(f"before ({before})", report["before"])
    show("now", report["now"])
    report["total_s"] = round(time.perf_counter() - started, 1)
    return write_report(report, results / "shape.json")


def cli(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shape", description=__doc__)
    parser.add_argument("--before", help="also measure this commit (e.g. the one before a restructuring)")
    parser.add_argument("--at", help="measure only this commit")
    args = parser.parse_args(argv)
    if args.at:
        show(args.at, at(args.at))
        return 0
    main(before=args.before)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
