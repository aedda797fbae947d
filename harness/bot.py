"""The real bot against the fakes: its settings, the bot in this process on a free port (most tests), and
`python -m bot serve` as a process of its own (crash tests, benchmarks), started, waited for and stopped."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from bot.compose import Bot, running_bot
from bot.playground.slack_emulator import SlackEmulator
from bot.server import listening
from bot.settings import Settings
from fakes.openai_server import FakeOpenAI

ROOT = Path(__file__).resolve().parent.parent
"""The checkout: a bot process imports its code from here, whatever is installed."""
SIGNING_SECRET = "test-signing-secret"
BOT_TOKEN = "xoxb-test"
STAFF_CHANNEL = "C_STAFF"
OURS = {name.upper() for name in Settings.model_fields} | {"OPENAI_EMBEDDING_MODEL"}
"""The variables the bot reads: a bot process gets only the harness's values of them."""


def emulator(**options: Any) -> SlackEmulator:
    """The Slack emulator with the credentials the bot is given (not started)."""
    return SlackEmulator(signing_secret=SIGNING_SECRET, bot_token=BOT_TOKEN, **options)


def bot_config(database_url: str, llm: FakeOpenAI, slack: SlackEmulator, **overrides: Any) -> dict[str, Any]:
    """The bot's settings, by field name: this database, the fake LLM (which serves embeddings too) and the
    emulator as Slack; transcripts as case summaries, so that no LLM call is on an escalation's path."""
    return {
        "database_url": database_url,
        "openai_api_key": "test-key",
        "openai_base_url": llm.base_url,
        "openai_model": "fake-model",
        "openai_max_retries": 0,
        "slack_bot_token": BOT_TOKEN,
        "slack_signing_secret": SIGNING_SECRET,
        "slack_api_url": slack.api_url,
        "staff_channel_id": STAFF_CHANNEL,
        "case_summary": "transcript",
        "embeddings": "openai",
        "embeddings_model": "fake-embed",
        # The emulator's customer is one person in one channel writing at load-test rates: the tests of the
        # rate limits switch them on.
        "rate_limit_user_per_minute": 0,
        "rate_limit_channel_per_minute": 0,
        # A rating question after every Resolve would be one more post in every takeover test: the tests of CSAT
        # switch it on.
        "csat": False,
        # The router loads the local model on a bot's first message (seconds): the tests of routing switch it on.
        "router_min_score": "off",
        # Monitoring on any free loopback port: tests run side by side, and a test may start several bots.
        "metrics_port": 0,
    } | overrides


def bot_settings(database_url: str, llm: FakeOpenAI, slack: SlackEmulator, **overrides: Any) -> Settings:
    """Settings for a bot in this process; a few turns at once and short leases, as tests want them."""
    values = {"max_concurrent_turns": 8, "lease_seconds": 3} | overrides
    return Settings(_env_file=None, **bot_config(database_url, llm, slack, **values))  # type: ignore[call-arg]


def clean_environ() -> dict[str, str]:
    """This process's environment without the bot's variables, with this checkout first on the import path."""
    env = {k: v for k, v in os.environ.items() if k.upper() not in OURS and not k.startswith(("OPENAI_", "SLACK_"))}
    return env | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


async def run_bot(
    *args: str, env: dict[str, str], stdin: str = "", cwd: Path, wait_s: float = 60
) -> tuple[int, str, str]:
    """`python -m bot <args>` run to its end as a user runs it, `env` on top of `clean_environ()`: (exit code,
    stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**clean_environ(), **env},
        cwd=cwd,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), timeout=wait_s)
    return proc.returncode or 0, out.decode(), err.decode()


def bot_env(database_url: str, llm: FakeOpenAI, slack: SlackEmulator, **overrides: Any) -> dict[str, str]:
    """The environment of a `python -m bot serve` process: `bot_config`'s values, on 127.0.0.1, warnings only."""
    values = bot_config(database_url, llm, slack, **({"host": "127.0.0.1", "log_level": "WARNING"} | overrides))
    return clean_environ() | {name.upper(): str(value) for name, value in values.items() if value is not None}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def serving(
    settings: Settings, slack: SlackEmulator, *, clock: Callable[[], datetime] | None = None
) -> AsyncIterator[Bot]:
    """The bot in this process on a free port (`bot.url`), the emulator delivering to it, once it is warm (as
    `python -m bot serve` says it is ready)."""
    async with running_bot(settings, clock=clock) as bot, listening(bot, host="127.0.0.1", port=0):
        await bot.warm_up.wait()
        slack.events_url = f"{bot.url}/slack/events"
        yield bot


@dataclass
class BotProcess:
    """A running `python -m bot serve`; its log (stderr) is `log`."""

    proc: asyncio.subprocess.Process
    url: str
    log: Path
    started_s: float
    """From spawning the process to its being ready (imports, migrations check, pools, workers)."""
    monitoring_url: str = ""
    """Where its /healthz and /metrics are, as its ready line says."""
    loop: str = ""
    """The event loop it runs on (`uvloop` or `asyncio`), as its ready line says."""

    @property
    def events_url(self) -> str:
        return f"{self.url}/slack/events"

    def check_alive(self) -> None:
        if self.proc.returncode is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"the bot exited with {self.proc.returncode}; its log ends:\n{tail}")

    async def kill(self) -> None:
        """kill -9: no clean-up of any kind."""
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=15)
            except TimeoutError:
                await self.kill()


Start = Callable[[], Awaitable[BotProcess]]
"""Starts `python -m bot serve` as a real process and waits until it is ready (the tests' `start_bot`)."""


@asynccontextmanager
async def bot_process(
    env: dict[str, str], slack: SlackEmulator | None = None, *, workdir: Path | None = None
) -> AsyncIterator[BotProcess]:
    """`python -m bot serve` with `env` (see `bot_env`; PORT is chosen here) in a folder of its own (`workdir`,
    which keeps its log, or a temporary one), so that no `.env` is read; ready once it says so and /healthz (on
    its monitoring listener) agrees. The emulator, if given, delivers to it."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="helpdesk-bot-") as tmp:
        folder = workdir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / "bot.log"
        started = time.monotonic()
        with log.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "serve", env=env | {"PORT": str(port)}, cwd=folder,
                stdout=asyncio.subprocess.PIPE, stderr=stderr,
            )  # fmt: skip
        bot = BotProcess(proc, f"http://127.0.0.1:{port}", log, 0.0)
        try:
            await _ready(bot)
            bot.started_s = time.monotonic() - started
            if slack is not None:
                slack.events_url = bot.events_url
            yield bot
        finally:
            await bot.stop()


async def _ready(bot: BotProcess) -> None:
    assert bot.proc.stdout is not None
    line = await asyncio.wait_for(bot.proc.stdout.readline(), timeout=60)
    if not line:  # stdout closed: the bot is exiting
        await asyncio.wait_for(bot.proc.wait(), timeout=15)
    bot.check_alive()
    said = json.loads(line)
    if said.get("event") != "ready":
        raise RuntimeError(f"the bot said {line!r} instead of being ready")
    bot.monitoring_url, bot.loop = said["monitoring"], said["loop"]
    async with aiohttp.ClientSession() as http, http.get(f"{bot.monitoring_url}/healthz") as health:
        if health.status != 200:
            raise RuntimeError(f"the bot said it was ready, but /healthz answered {health.status}")
