"""Files customers attach, over HTTP: uploaded into the Slack emulator, shared in a message, downloaded by the bot
from `url_private` with its token, read (PDF, DOCX, text) or described (images, files too big) for the model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI, reply
from harness import bot as harness
from harness import documents
from harness.http import serving
from harness.slack import replies_in

Sessions = async_sessionmaker[AsyncSession]
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


@pytest.fixture
async def bot_with(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> AsyncIterator[Any]:
    """Serve a bot with settings changed: `async with bot_with(model_accepts_images=True): ...`."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def serve(**overrides: Any) -> AsyncIterator[Any]:
        settings = harness.bot_settings(database_url, fake_llm, emulator, **overrides)
        async with harness.serving(settings, emulator) as bot:
            yield bot

    yield serve


async def test_an_image_alone_is_answered_and_the_agent_told_it_was_sent(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(reply("Thanks for the photo! What is the problem with the drone?"))
    photo = emulator.add_file("broken-arm.png", "image/png", PNG)
    said = await emulator.user_says("C_SUPPORT", "", files=[photo])
    assert await replies_in(emulator, "C_SUPPORT", said.ts, 1) == [
        "Thanks for the photo! What is the problem with the drone?"
    ]
    seen = fake_llm.requests[0].last_user
    assert seen.startswith("[Image sent: broken-arm.png (image/png)") and "cannot view images" in seen
    assert emulator.downloads == []  # an image the model cannot see is not fetched


async def test_with_model_accepts_images_the_model_gets_the_image(
    bot_with: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    async with bot_with(model_accepts_images=True):
        fake_llm.script(reply("I can see a cracked arm."), reply("Yes, it is covered."))
        photo = emulator.add_file("broken-arm.png", "image/png", PNG)
        said = await emulator.user_says("C_SUPPORT", "look at this", files=[photo])
        await replies_in(emulator, "C_SUPPORT", said.ts, 1)
        [message] = [msg for msg in fake_llm.requests[0].messages if msg["role"] == "user"]
        assert message["content"][0] == {
            "type": "text",
            "text": "look at this\n\n[Image sent: broken-arm.png (image/png)]",
        }
        assert message["content"][1]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")
        assert emulator.downloads == [(photo["id"], 200)]
        # The next turn sees the line about it, not the image again: image bytes are not kept.
        await emulator.user_says("C_SUPPORT", "is that covered?", thread_ts=said.ts)
        await replies_in(emulator, "C_SUPPORT", said.ts, 2)
        first, second = [msg for msg in fake_llm.requests[1].messages if msg["role"] == "user"]
        assert first["content"] == "look at this\n\n[Image sent: broken-arm.png (image/png)]"
        assert second["content"] == "is that covered?"
    async with sessions() as s:
        stored = (await s.scalars(select(m.Inbound.files).order_by(m.Inbound.id))).first()
    assert stored is not None and stored[0]["name"] == "broken-arm.png" and "data" not in stored[0]


async def test_a_pdfs_text_reaches_the_model(slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(reply("Your invoice DW-1006 shows 2 batteries."))
    invoice = emulator.add_file("invoice.pdf", "application/pdf", documents.pdf("Invoice DW-1006: 2 x Kestrel battery"))
    said = await emulator.user_says("C_SUPPORT", "what does my invoice say?", files=[invoice])
    await replies_in(emulator, "C_SUPPORT", said.ts, 1)
    assert fake_llm.requests[0].last_user == (
        "what does my invoice say?\n\n[Attached file invoice.pdf]\nInvoice DW-1006: 2 x Kestrel battery"
    )


async def test_a_docx_alone_is_read(slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(reply("Got your letter."))
    letter = emulator.add_file(
        "complaint.docx",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        documents.docx("Dear Driftwing,", "my Osprey arrived without propellers."),
    )
    said = await emulator.user_says("C_SUPPORT", "", files=[letter])
    await replies_in(emulator, "C_SUPPORT", said.ts, 1)
    assert fake_llm.requests[0].last_user == (
        "[Attached file complaint.docx]\nDear Driftwing,\nmy Osprey arrived without propellers."
    )


async def test_a_file_too_big_is_named_not_read(bot_with: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI) -> None:
    async with bot_with(max_file_bytes=1000):
        fake_llm.script(reply("That file is too large for me; could you paste the relevant part?"))
        log = emulator.add_file("flight-log.txt", "text/plain", b"x" * 5000)
        said = await emulator.user_says("C_SUPPORT", "", files=[log])
        await replies_in(emulator, "C_SUPPORT", said.ts, 1)
        assert fake_llm.requests[0].last_user == (
            "[Attached file flight-log.txt (text/plain): it could not be read: larger than 0.001 MB]"
        )
        assert emulator.downloads == []


async def test_url_private_wants_the_bot_token(emulator: SlackEmulator) -> None:
    """The emulator serves files as Slack does: without the bot's token, the sign-in page (HTML, status 200)."""
    import aiohttp

    note = emulator.add_file("note.txt", "text/plain", b"hello")
    async with aiohttp.ClientSession() as http:
        async with http.get(note["url_private"]) as anonymous:
            assert anonymous.content_type == "text/html"
        async with http.get(note["url_private"], headers={"Authorization": "Bearer xoxb-test"}) as bot:
            assert await bot.read() == b"hello"


async def test_the_bot_token_never_goes_to_a_url_that_is_not_slacks(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI
) -> None:
    """A file whose url_private names another server (a remote file's, which its app chose) is named to the agent,
    and not downloaded: the bot token would go with the request."""
    received: list[str] = []

    async def collect(request: web.Request) -> web.Response:
        received.append(request.headers.get("Authorization", ""))
        return web.Response(body=documents.pdf("secret"), content_type="application/pdf")

    app = web.Application()
    app.router.add_get("/{path:.*}", collect)
    async with serving(app, "localhost") as port:
        foreign = emulator.add_file("invoice.pdf", "application/pdf", documents.pdf("x")) | {
            "url_private": f"http://localhost:{port}/steal/invoice.pdf"
        }
        remote = emulator.add_file("notes.pdf", "application/pdf", documents.pdf("y")) | {"is_external": True}
        fake_llm.script(reply("I could not open those."))
        said = await emulator.user_says("C_SUPPORT", "see attached", files=[foreign, remote])
        await replies_in(emulator, "C_SUPPORT", said.ts, 1)
        assert received == []
        assert (
            "invoice.pdf" in fake_llm.requests[-1].last_user
            and "not stored in Slack" in fake_llm.requests[-1].last_user
        )


def test_a_docx_that_lies_about_its_unpacked_size_is_refused_without_inflating_it() -> None:
    """A 1 MB DOCX whose document inflates to 200 MB while its headers say 1,000 bytes: refused, having read no more
    than the reader's own limit (it once inflated all of it: 2 GB from a 1 MB file)."""
    import tracemalloc

    from agents.knowledge.readers import DOCX_UNPACKED_BYTES, Unreadable, docx_paragraphs

    bomb = documents.docx_bomb(200 << 20)
    assert len(bomb) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(Unreadable):
            docx_paragraphs(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * DOCX_UNPACKED_BYTES  # read in pieces, copied once; all of it would be 200 MB
