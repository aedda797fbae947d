"""Ready means warm (issue 30): a `python -m bot serve` process with the router on says it is ready (its ready line,
/healthz, /livez) only once the router has embedded its examples; meanwhile /healthz answers 503 and says what it is
waiting for. A warm-up that fails ends ready all the same, the failure shown.

The router's embedding is held back for real: the process imports this checkout through a copy of its tree whose
static table's scales (`minilm/static.scale.npy`) are a named pipe, which the table's loading reads from (and waits
on) until the test writes the real file into it; or which is missing, as in a damaged install."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.knowledge import static
from agents.knowledge.local import LocalEmbedder
from agents.knowledge.multilingual import MultilingualEmbedder
from agents.knowledge.static import StaticEmbedder
from agents.router import MIN_SCORE
from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI
from harness import bot as harness

HELD = Path(static.__file__).resolve().parent / "minilm" / static.SCALE_FILE


def shadow_tree(where: Path, config: Callable[[Path], None]) -> Path:
    """This checkout's packages as links, but for `agents/knowledge/static.py` (copied: it finds its table next to
    itself) and its model folder, whose `static.scale.npy` is made by `config`."""
    root = harness.ROOT
    shadow = where / "tree"
    knowledge = shadow / "agents" / "knowledge"
    model = knowledge / "minilm"
    model.mkdir(parents=True)
    for entry in root.iterdir():
        if entry.name != "agents":
            (shadow / entry.name).symlink_to(entry)
    for entry in (root / "agents").iterdir():
        if entry.name != "knowledge":
            (shadow / "agents" / entry.name).symlink_to(entry)
    for entry in (root / "agents" / "knowledge").iterdir():
        if entry.name not in ("static.py", "minilm", "__pycache__"):
            (knowledge / entry.name).symlink_to(entry)
    (knowledge / "static.py").write_bytes((root / "agents" / "knowledge" / "static.py").read_bytes())
    for entry in HELD.parent.iterdir():
        if entry.name != HELD.name:
            (model / entry.name).symlink_to(entry)
    config(model / HELD.name)
    return shadow


@asynccontextmanager
async def serving(env: dict[str, str], folder: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, str, str]]:
    """`python -m bot serve`, not waited for: (the process, its public URL, its monitoring URL)."""
    port, metrics_port = harness.free_port(), harness.free_port()
    log = (folder / "bot.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "serve",
        env=env | {"PORT": str(port), "METRICS_PORT": str(metrics_port)},
        cwd=folder, stdout=asyncio.subprocess.PIPE, stderr=log,
    )  # fmt: skip
    try:
        yield proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}"
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), timeout=15)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()


async def health(url: str, path: str = "/healthz") -> tuple[int, dict[str, Any]]:
    """The first answer of a process that is still starting (its port opens once its listeners are up)."""
    async with aiohttp.ClientSession() as http:
        for _ in range(600):
            try:
                async with http.get(f"{url}{path}") as response:
                    return response.status, await response.json()
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
    raise AssertionError(f"{url}{path} never answered")


async def ready_line(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
    assert line, "the bot exited before saying it was ready"
    said: dict[str, Any] = json.loads(line)
    return said


async def release(pipe: Path, proc: asyncio.subprocess.Process) -> None:
    """The real file into the pipe, once the table's loading has opened it (unless the process is gone)."""
    while proc.returncode is None:
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: nobody reads it yet
                raise
            await asyncio.sleep(0.05)
            continue
        os.set_blocking(fd, True)  # 120 kB, more than the pipe's buffer: written as the process reads it
        with os.fdopen(fd, "wb") as writer:
            writer.write(HELD.read_bytes())
        return


def router_env(database_url: str, llm: FakeOpenAI, emulator: SlackEmulator, tree: Path) -> dict[str, str]:
    env = harness.bot_env(database_url, llm, emulator, router_min_score=MIN_SCORE, log_level="INFO")
    return env | {"PYTHONPATH": str(tree)}


async def test_healthz_says_warming_until_the_router_has_embedded_its_examples(
    database_url: str,
    sessions: async_sessionmaker[AsyncSession],
    fake_llm: FakeOpenAI,
    emulator: SlackEmulator,
    tmp_path: Path,
) -> None:
    tree = shadow_tree(tmp_path, lambda path: os.mkfifo(path))
    pipe = tree / "agents" / "knowledge" / "minilm" / HELD.name
    async with serving(router_env(database_url, fake_llm, emulator, tree), tmp_path) as (proc, public, url):
        said = asyncio.ensure_future(ready_line(proc))
        try:
            status, body = await health(url)
            assert status == 503 and body["ready"] is False and "router" in body["warming"], body
            assert body["database"] == "ok"
            assert await health(public, "/livez") == (503, {"ready": False})
            assert not said.done()  # no ready line while the router's model is held back
        except BaseException:
            said.cancel()
            raise
        finally:
            await release(pipe, proc)
        assert (await said)["event"] == "ready"
        status, body = await health(url)
        assert status == 200 and body["ready"] is True, body
        assert "warming" not in body and "warm_up_failed" not in body
        assert await health(public, "/livez") == (200, {"ready": True})
        log = (tmp_path / "bot.log").read_text()
        assert "warming up before saying ready: knowledge, language, router" in log
        assert "warm in " in log


async def test_a_router_that_cannot_warm_ends_ready_with_the_failure_shown(
    database_url: str,
    sessions: async_sessionmaker[AsyncSession],
    fake_llm: FakeOpenAI,
    emulator: SlackEmulator,
    tmp_path: Path,
) -> None:
    """A damaged install (the table's files missing): the model routes every message, and the process is ready."""
    tree = shadow_tree(tmp_path, lambda path: None)
    async with serving(router_env(database_url, fake_llm, emulator, tree), tmp_path) as (proc, _, url):
        assert (await ready_line(proc))["event"] == "ready"
        status, body = await health(url)
        assert status == 200 and body["ready"] is True and "warming" not in body, body
        assert "FileNotFoundError" in body["warm_up_failed"]["router"], body
        assert HELD.name in body["warm_up_failed"]["router"]
        log = (tmp_path / "bot.log").read_text()
        assert "warm-up of router failed, running without it: could not embed its examples" in log
        assert "degraded: router" in log


async def test_a_process_that_runs_no_turns_does_not_warm_them(
    database_url: str,
    sessions: async_sessionmaker[AsyncSession],
    fake_llm: FakeOpenAI,
    emulator: SlackEmulator,
) -> None:
    """PROCESS_ROLE=web: the router and the models are the workers' (which are elsewhere); ready at once."""
    settings = harness.bot_settings(database_url, fake_llm, emulator, router_min_score=MIN_SCORE, process_role="web")
    async with harness.serving(settings, emulator) as bot:
        assert bot.warm_up.steps == {} and bot.warm_up.warm
        status, body = await health(bot.monitoring_url)
        assert status == 200 and "warming" not in body, body


async def test_with_embeddings_off_the_warm_up_loads_no_model(
    database_url: str,
    sessions: async_sessionmaker[AsyncSession],
    fake_llm: FakeOpenAI,
    emulator: SlackEmulator,
) -> None:
    """EMBEDDINGS=none and the router off: the sample's collections were embedded by MiniLM, but no search embeds,
    so warming loads neither model (each costs about 100 MB resident)."""
    settings = harness.bot_settings(database_url, fake_llm, emulator, embeddings="none", router_min_score="off")
    async with harness.serving(settings, emulator) as bot:
        assert bot.warm_up.warm and not bot.warm_up.failed
        local = [model for model in bot.knowledge.models if isinstance(model, LocalEmbedder | MultilingualEmbedder)]
        assert len(local) == 2 and not any(model.loaded for model in local), local


async def test_the_router_warms_without_minilm(
    database_url: str,
    sessions: async_sessionmaker[AsyncSession],
    fake_llm: FakeOpenAI,
    emulator: SlackEmulator,
) -> None:
    """The router on, no search embedding locally (EMBEDDINGS=none, as with a provider's embeddings): the router's
    static table is loaded, and MiniLM, which it is distilled from, never is."""
    settings = harness.bot_settings(database_url, fake_llm, emulator, embeddings="none", router_min_score=MIN_SCORE)
    async with harness.serving(settings, emulator) as bot:
        await bot.warm_up.wait()
        assert not bot.warm_up.failed, bot.warm_up.failed
        router = bot.conversations.router
        assert router is not None and isinstance(router.embedder, StaticEmbedder)
        assert router.embedder.loaded
        local = [model for model in bot.knowledge.models if isinstance(model, LocalEmbedder | MultilingualEmbedder)]
        assert not any(model.loaded for model in local), local
