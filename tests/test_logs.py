"""LOG_FORMAT=json: one JSON object per line, naming the conversation and the message a turn's lines concern."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.conversations import Conversations
from agents.offline import FallbackModel
from bot import logs
from escalation.machine import TAKEOVER
from fakes.openai_server import FakeOpenAI, error
from harness.bot import clean_environ
from harness.llm import CONFIG, make_model
from harness.sample import default_roster


async def test_a_turns_lines_name_its_conversation_and_message(
    sessions: async_sessionmaker[AsyncSession], fake_llm: FakeOpenAI
) -> None:
    """The provider failure is logged inside the turn (FallbackModel), several layers below where the engine
    names the conversation and the message."""
    model = make_model(fake_llm)
    service = Conversations(
        takeover=TAKEOVER,
        sessions=sessions,
        roster=default_roster(),
        model=FallbackModel(model, None),
        config=CONFIG,
    )
    as_json, as_text = io.StringIO(), io.StringIO()
    handlers = [logs.handler("json", as_json), logs.handler("text", as_text)]
    watched = logging.getLogger("agents")
    for handler in handlers:
        watched.addHandler(handler)
    fake_llm.script(error(500, "upstream exploded"))
    try:
        # A task of its own, as a worker runs a turn: the context variables stay with it.
        result = await asyncio.create_task(service.handle("t:logs", "where is my order?"))
    finally:
        for handler in handlers:
            watched.removeHandler(handler)
        await model.close()
    lines = [json.loads(line) for line in as_json.getvalue().splitlines()]
    failed = next(line for line in lines if "failed" in line["message"])
    assert failed["level"] == "ERROR" and failed["logger"] == "agents.offline"
    assert failed["conversation"] == "t:logs"
    assert failed["message_id"] == result.inbound_id
    assert failed["time"].endswith("Z")
    assert "[t:logs]" in as_text.getvalue()


def test_an_exception_is_one_string_in_one_line() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("tests.logs.exception")
    logger.addHandler(logs.handler("json", stream))
    logger.propagate = False
    try:
        try:
            1 / 0  # noqa: B018
        except ZeroDivisionError:
            logger.exception("could not divide %s", "by zero")
    finally:
        logger.handlers.clear()
        logger.propagate = True
    [line] = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["message"] == "could not divide by zero"
    assert record["exc_info"].startswith("Traceback") and "ZeroDivisionError" in record["exc_info"]
    # Outside a turn there is nothing to name.
    assert "conversation" not in record and "message_id" not in record


async def run_cli(*args: str, env: dict[str, str], cwd: Path) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**clean_environ(), **env},
        cwd=cwd,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode or 0, err.decode()


async def test_the_cli_writes_json_lines_when_asked(database_url: str, tmp_path: Path) -> None:
    env = {"DATABASE_URL": database_url, "LOG_LEVEL": "DEBUG"}
    code, err = await run_cli("migrate", env=env | {"LOG_FORMAT": "json"}, cwd=tmp_path)
    assert code == 0, err
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert lines and all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    code, err = await run_cli("migrate", env=env, cwd=tmp_path)
    assert code == 0 and err.strip() and not err.lstrip().startswith("{")
    code, err = await run_cli("migrate", env=env | {"LOG_FORMAT": "yaml"}, cwd=tmp_path)
    assert code == 2 and "LOG_FORMAT: Input should be 'text' or 'json'" in err


def test_slack_sdk_builds_its_debug_text_only_when_debug_lines_are_written() -> None:
    """slack_sdk formats every request and response for a debug line when its client logger's own level is at most
    DEBUG, unset included: `configure` gives it the process's level."""
    readers = [logging.getLogger(name) for name in logs.LEVEL_READERS]
    before = [reader.level for reader in readers]
    root = logging.getLogger()
    root_level, root_handlers = root.level, list(root.handlers)
    try:
        logs.configure("INFO")
        assert all(reader.level > logging.DEBUG for reader in readers)
        logs.configure("DEBUG")  # asked for: the lines are still there
        assert all(reader.level <= logging.DEBUG for reader in readers)
    finally:
        for reader, level in zip(readers, before, strict=True):
            reader.setLevel(level)
        root.setLevel(root_level)
        root.handlers = root_handlers
