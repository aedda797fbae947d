"""Benchmark of the install a new user makes and of the commands they try first: how long `python -m bot --help`
and `--version` take (the median of several fresh processes, with the modules `--help` imported), and the size of
two fresh virtualenvs, the bot alone (`make run`'s install) and the bot with the dev tools (`make test`'s), each
made as `make` makes it: pip upgraded, then `pip install -c constraints.txt` of a copy of the checkout (without
`-c` when the checkout has no constraints.txt).

pip sees PyPI (or the index in PIP_INDEX_URL) as a new user's pip does: no pip configuration files, extra indexes
or wheel directories of this machine, so the lines it prints are those a new user reads.

`--source PATH` measures another checkout (`git archive HEAD | tar -x -C /tmp/before` gives the last commit's),
which is how the "before" figures were taken. `--quick` times the commands only, with the current interpreter.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import tables
from bench.setup import RESULTS, ROOT, machine, section, table, write_report

HEAVY = ("openai", "sqlalchemy", "slack_bolt", "slack_sdk", "numpy", "microsoft_agents", "mcp", "pydantic")
"""Packages a command's own module needs and `--help` must not import."""
LEFT_OUT = shutil.ignore_patterns(
    ".git", ".venv", ".data", "build", "*.egg-info", "__pycache__", ".*_cache", "test-artifacts", "results"
)
WARNING = re.compile(r"\bWarning\b|Warning:")
"""The first line of a warning as pip relays it from the build (setuptools' run to 40 lines each)."""


def command_seconds(python: str, cwd: Path, *args: str, runs: int) -> list[float]:
    """Wall seconds of `python -m bot ARGS` in fresh processes, each run to its end."""
    times: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([python, "-m", "bot", *args], cwd=cwd, capture_output=True, check=True, timeout=120)
        times.append(time.perf_counter() - started)
    return times


def imported_by_help(python: str, cwd: Path) -> list[str]:
    """The modules `python -m bot --help` imports, as `-X importtime` lists them."""
    done = subprocess.run(
        [python, "-X", "importtime", "-m", "bot", "--help"], cwd=cwd, capture_output=True, text=True, check=True
    )
    return [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")][1:]


def commands(python: str, cwd: Path, runs: int) -> dict[str, Any]:
    help_s = command_seconds(python, cwd, "--help", runs=runs)
    version_s = command_seconds(python, cwd, "--version", runs=runs)
    modules = imported_by_help(python, cwd)
    heavy = sorted({m.split(".")[0] for m in modules} & set(HEAVY))
    return {
        "python": python,
        "runs": runs,
        "help_s": [round(s, 3) for s in help_s],
        "version_s": [round(s, 3) for s in version_s],
        "help_median_s": round(statistics.median(help_s), 3),
        "version_median_s": round(statistics.median(version_s), 3),
        "help_modules": len(modules),
        "help_heavy_imports": heavy,
    }


def pip_environment() -> dict[str, str]:
    """A new user's pip: the index only (PyPI, or PIP_INDEX_URL), none of this machine's pip configuration."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL")}
    return environment | {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def megabytes(folder: Path) -> float:
    """Disk usage, as `du` counts it."""
    used = sum(
        (Path(root) / name).lstat().st_blocks * 512 for root, dirs, files in os.walk(folder) for name in [*dirs, *files]
    )
    return round(used / 1e6, 1)


def largest(site_packages: Path, count: int = 6) -> dict[str, float]:
    """The largest top-level folders of a virtualenv's site-packages, in MB."""
    sizes = {p.name: megabytes(p) for p in site_packages.iterdir() if p.is_dir() and not p.name.endswith("-info")}
    return dict(sorted(sizes.items(), key=lambda item: -item[1])[:count])


def virtualenv(source: Path, target: Path, extra: str) -> dict[str, Any]:
    """A fresh virtualenv with the checkout installed (with `extra`, when one is named) as `make` installs it, quietly:
    what pip prints then is what a new user reads."""
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    pip = [str(target / "bin" / "python"), "-m", "pip", "install"]
    env = pip_environment()
    subprocess.run([*pip, "--quiet", "--upgrade", "pip"], env=env, check=True, timeout=600)
    constraints = ["--constraint", str(source / "constraints.txt")] if (source / "constraints.txt").exists() else []
    started = time.perf_counter()
    done = subprocess.run(
        [*pip, "--quiet", *constraints, f"{source}[{extra}]" if extra else str(source)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"pip install failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    lines = (done.stdout + done.stderr).splitlines()
    site_packages = next((target / "lib").glob("python3*/site-packages"))
    return {
        "constraints": bool(constraints),
        "install_s": round(seconds, 1),
        "mb": megabytes(target),
        "packages": len(list(site_packages.glob("*.dist-info"))),
        "pip_output_lines": len(lines),
        "warnings": sum(bool(WARNING.search(line)) for line in lines),
        "largest_mb": largest(site_packages),
    }


def main(quick: bool = False, results: Path = RESULTS, source: Path = ROOT, runs: int | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    runs = runs or (3 if quick else 15)
    source = source.resolve()
    report: dict[str, Any] = {"benchmark": "install", "quick": quick, "source": str(source)}
    if quick:
        section(f"--help and --version ({runs} runs each, {sys.executable})")
        report["commands"] = commands(sys.executable, source, runs)
    else:
        with tempfile.TemporaryDirectory(prefix="helpdesk-install-") as tmp:
            copy = Path(tmp) / "source"
            shutil.copytree(source, copy, ignore=LEFT_OUT)
            venvs: dict[str, Any] = {}
            for label, extra in (("runtime", ""), ("runtime+dev", "dev")):
                section(f"a fresh virtualenv: {label}")
                venvs[label] = virtualenv(copy, Path(tmp) / label, extra)
            print(
                table(
                    ["virtualenv", "MB", "packages", "install s", "lines pip printed", "warnings"],
                    [
                        [label, v["mb"], v["packages"], v["install_s"], v["pip_output_lines"], v["warnings"]]
                        for label, v in venvs.items()
                    ],
                )
            )
            report["virtualenvs"] = venvs
            python = str(Path(tmp) / "runtime" / "bin" / "python")
            section(f"--help and --version in the runtime virtualenv ({runs} runs each)")
            # An empty folder, as a user runs the installed bot: the checkout's packages must not shadow the install.
            home = Path(tmp) / "home"
            home.mkdir()
            report["commands"] = commands(python, home, runs)
    section("summary")
    summary = tables.install(report)
    print(table(summary.headers, summary.rows))
    report["machine"] = machine("none", None)
    report["total_s"] = round(time.perf_counter() - started, 1)
    name = "install.json" if source == ROOT.resolve() else "install-other.json"
    return write_report(report, results / name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.install", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout to install (default: this one)")
    parser.add_argument("--runs", type=int, help="runs of each command (default 15, 3 with --quick)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder for the JSON results")
    args = parser.parse_args()
    main(quick=args.quick, results=args.results, source=args.source, runs=args.runs)
