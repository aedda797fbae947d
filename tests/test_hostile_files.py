"""Hostile files customers attach, over HTTP against the whole bot: a small DOCX that unpacks to 20 MB of XML, read
in a process of its own (so the event loop keeps answering others), within a memory limit, and only for a message
that gets a turn; a cap on the files of one message. Issue 26: such a file froze the process for seconds, even for
a customer over the daily token budget."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.knowledge.readers import ReaderLimits, docx_text
from bot.compose import Bot
from bot.playground.slack_emulator import SlackEmulator
from bot.slack.files import clip
from fakes.openai_server import FakeOpenAI, RecordedRequest, reply
from harness import bot as harness
from harness import documents
from harness.slack import replies_in

Sessions = async_sessionmaker[AsyncSession]
SUPPORT = "C_SUPPORT"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XML_BYTES = 19_900_000
"""Just within the readers' unpacked-size cap (20 MB): the file is refused by nothing but the work it costs."""

Serve = Callable[..., AbstractAsyncContextManager[Bot]]


def echo(request: RecordedRequest) -> Any:
    return reply(f"echo {request.last_user[:60]}")


@pytest.fixture
def bot_with(database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator) -> Serve:
    """Serve a bot with settings changed: `async with bot_with(max_files_per_message=2): ...`."""

    @asynccontextmanager
    async def serve(**overrides: Any) -> AsyncIterator[Bot]:
        settings = harness.bot_settings(database_url, fake_llm, emulator, **overrides)
        async with harness.serving(settings, emulator) as bot:
            yield bot

    return serve


def asked(fake_llm: FakeOpenAI, text: str) -> list[str]:
    """The customer's words (with what their files say) of each model request whose last user message starts so."""
    return [r.last_user for r in fake_llm.requests if r.last_user.startswith(text)]


async def test_a_customer_over_the_daily_budget_has_no_file_read(
    bot_with: Serve, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    """Over the budget, the message gets no turn: its hostile DOCX is not even downloaded (it used to be downloaded
    and parsed, seconds of a frozen process, before the limit was looked at). The transcript names it, unread."""
    fake_llm.rule = echo
    async with bot_with(daily_token_budget_per_user=50):
        first = await emulator.user_says(SUPPORT, "what drones do you sell?")
        await replies_in(emulator, SUPPORT, first.ts, 1)  # more than 50 tokens spent: over the budget from now
        letter = emulator.add_file("letter.docx", DOCX, documents.docx_of_xml(XML_BYTES))
        said = await emulator.user_says(SUPPORT, "see my letter", files=[letter])
        [notice] = await replies_in(emulator, SUPPORT, said.ts, 1)
    assert "tomorrow" in notice and fake_llm.calls == 1
    assert emulator.downloads == []
    async with sessions() as s:
        kept = await s.scalar(select(m.Message.content).where(m.Message.content.startswith("see my letter")))
    assert kept == (
        "see my letter\n\n[Attached file letter.docx (" + DOCX + "): it could not be read: "
        "not read, as the assistant did not answer this message]"
    )


async def test_a_docx_of_20_mb_of_xml_does_not_stop_the_others_being_answered(
    slack_bot: Bot, emulator: SlackEmulator, fake_llm: FakeOpenAI
) -> None:
    """Two 58 KB DOCX files of 20 MB of XML each: while they are read (in processes of their own), another customer
    is acknowledged and answered, and /livez answers, before the first customer's turn reaches the model. Parsed in a
    thread of the bot's process, each held the GIL for its whole parse: nothing else ran until it ended, and the
    turn whose files they were went on first."""
    fake_llm.rule = echo
    emulator.add_user("U_OTHER", "olive", "Olive Other")
    letters = [
        emulator.add_file(f"letter-{n}.docx", DOCX, documents.docx_of_xml(XML_BYTES, element=documents.PROOF_MARKS))
        for n in (1, 2)
    ]
    hostile = await emulator.user_says(SUPPORT, "see my letters", files=letters)
    await emulator.wait_for(lambda: emulator.downloads)  # the first is being read
    other = await emulator.user_says(SUPPORT, "where is my order?", user="U_OTHER")
    async with aiohttp.ClientSession() as http, http.get(f"{slack_bot.url}/livez") as live:
        assert live.status == 200
    assert await replies_in(emulator, SUPPORT, other.ts, 1) == ["echo where is my order?"]
    assert asked(fake_llm, "see my letters") == []  # still reading: the others did not wait for it
    [answer] = await replies_in(emulator, SUPPORT, hostile.ts, 1, wait_s=20)
    [seen] = asked(fake_llm, "see my letters")
    assert seen.count("it could not be read: it holds no text (empty)") == 2, seen
    assert answer.startswith("echo see my letters")


async def test_files_past_the_cap_are_named_unread(
    bot_with: Serve, emulator: SlackEmulator, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(reply("Thanks, I have read two of them."))
    notes = [emulator.add_file(f"note-{n}.txt", "text/plain", f"note {n}".encode()) for n in (1, 2, 3)]
    async with bot_with(max_files_per_message=2):
        said = await emulator.user_says(SUPPORT, "three notes", files=notes)
        await replies_in(emulator, SUPPORT, said.ts, 1)
    assert fake_llm.requests[0].last_user == (
        "three notes\n\n[Attached file note-1.txt]\nnote 1\n\n[Attached file note-2.txt]\nnote 2\n\n"
        "[Attached file note-3.txt (text/plain): it could not be read: only the first 2 files of a message are read]"
    )
    assert [file_id for file_id, _ in emulator.downloads] == [notes[0]["id"], notes[1]["id"]]


async def test_a_reader_over_its_memory_limit_ends_unread_and_the_bot_goes_on(
    bot_with: Serve, emulator: SlackEmulator, fake_llm: FakeOpenAI
) -> None:
    """20 MB of paragraphs of text takes some 300 MB to parse: at 128 MB the reader process fails, the file is named
    unread, and the bot answers this message and the next."""
    fake_llm.rule = echo
    letter = emulator.add_file("letter.docx", DOCX, documents.docx_of_xml(XML_BYTES))
    async with bot_with(file_reader_memory_mb=128):
        said = await emulator.user_says(SUPPORT, "my letter", files=[letter])
        await replies_in(emulator, SUPPORT, said.ts, 1)
        await emulator.user_says(SUPPORT, "did you get it?", thread_ts=said.ts)
        assert (await replies_in(emulator, SUPPORT, said.ts, 2))[1] == "echo did you get it?"
    assert asked(fake_llm, "my letter") == [
        f"my letter\n\n[Attached file letter.docx ({DOCX}): it could not be read: "
        "the DOCX needs more than 128 MB to read]"
    ]


def readers_running() -> set[int]:
    """This process's children that are reader processes (from /proc: their parent and command line)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"read_here" in command:
            found.add(int(entry.name))
    return found


@pytest.mark.services
async def test_a_reader_is_killed_with_its_turn() -> None:
    """A read cancelled (a turn ended by shutdown or a lost lease) takes its reader process with it, rather than
    leaving it to run to its deadline."""
    task = asyncio.create_task(docx_text(documents.docx_of_xml(XML_BYTES), max_chars=100, limits=ReaderLimits()))
    for _ in range(500):
        if readers_running() or task.done():
            break
        await asyncio.sleep(0.01)
    assert readers_running() and not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert readers_running() == set()


@pytest.mark.services
async def test_a_reader_sends_back_little_more_than_the_text_kept() -> None:
    """A document of one 2 MB paragraph: the reader stops one character past the text kept, so the rest never crosses
    the pipe to be decoded on the event loop; the agent is told the file was cut."""
    one_paragraph = documents.docx("y" * 2_000_000)
    text = await docx_text(one_paragraph, max_chars=100)
    assert text == "y" * 101
    assert (
        clip(text, 100)
        == "y" * 100 + "\n[… the rest of the file was cut: the assistant reads its first 100 characters]"
    )
