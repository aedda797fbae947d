"""Files relayed both ways between a customer's thread and the case's thread, over HTTP: downloaded by the bot,
uploaded again (files.getUploadURLExternal, the bytes, files.completeUploadExternal) and shared in the other
thread with the relayed words, through the outbox, once even when Slack's answer to the share is lost."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI
from harness import documents
from harness.database import settle
from harness.scenarios import STAFF, SUPPORT, escalate, relays_to_customer

Sessions = async_sessionmaker[AsyncSession]
MANUAL = b"Kestrel Mini 2 manual: hold the power button for 3 seconds."


async def test_a_customers_file_reaches_the_case_thread_with_their_words(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, case = await escalate(emulator, fake_llm, sessions)
    receipt = documents.pdf("Receipt DW-1006")
    pdf = emulator.add_file("receipt.pdf", "application/pdf", receipt)
    await emulator.user_says(SUPPORT, "here is my receipt", thread_ts=thread, files=[pdf])
    [(share, data)] = await emulator.wait_for(lambda: emulator.shared_files(STAFF, case.ts))
    assert share.text == "*Casey Customer* (customer): here is my receipt"
    assert data == receipt and share.files is not None and share.files[0]["name"] == "receipt.pdf"
    assert share.files[0]["id"] != pdf["id"]  # uploaded again: the customer's own file is not shared across
    await settle(sessions)
    assert [p.text for p in emulator.posts(STAFF, case.ts)].count(share.text) == 1  # not relayed as text too
    assert fake_llm.calls == 1  # a person has the conversation: the bot stays quiet
    # No turn, so nothing read: the file was fetched once, to relay it (a customer's hostile file costs a person's
    # conversation no reader process).
    assert emulator.downloads == [(pdf["id"], 200)]


async def test_a_colleagues_file_reaches_the_customer_and_a_file_alone_is_relayed(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, case = await escalate(emulator, fake_llm, sessions)
    manual = emulator.add_file("manual.txt", "text/plain", MANUAL, user="U_STAFF")
    await emulator.user_says(STAFF, "Here is the manual.", user="U_STAFF", thread_ts=case.ts, files=[manual])
    [(share, data)] = await emulator.wait_for(lambda: emulator.shared_files(SUPPORT, thread))
    assert (share.text, data) == ("*Sam Staff (Driftwing team)*:", MANUAL)
    assert relays_to_customer(emulator, thread) == ["Here is the manual."]  # the words, under the colleague's name

    # A message of a file alone, which used to be ignored as "no text".
    photo = emulator.add_file("label.png", "image/png", b"\x89PNG\r\n\x1a\n-label", user="U_STAFF")
    await emulator.user_says(STAFF, "", user="U_STAFF", thread_ts=case.ts, files=[photo])
    await emulator.wait_for(lambda: len(emulator.shared_files(SUPPORT, thread)) == 2)
    await settle(sessions)
    assert emulator.shared_files(SUPPORT, thread)[1][1] == b"\x89PNG\r\n\x1a\n-label"
    assert relays_to_customer(emulator, thread) == ["Here is the manual."]  # no empty text relay


async def test_a_lost_answer_to_the_share_does_not_share_the_file_twice(
    slack_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    """Slack shares the files, but its answer to files.completeUploadExternal is lost: the sender, which recorded
    the uploaded ids first, asks files.info where they are shared, finds the share and completes nothing again."""
    thread, case = await escalate(emulator, fake_llm, sessions)
    emulator.drop_next("files.completeUploadExternal")
    pdf = emulator.add_file("receipt.pdf", "application/pdf", documents.pdf("Receipt DW-1006"))
    await emulator.user_says(SUPPORT, "receipt attached", thread_ts=thread, files=[pdf])
    await emulator.wait_for(lambda: emulator.calls_to("files.info"))
    await settle(sessions)
    assert len(emulator.shared_files(STAFF, case.ts)) == 1
    assert [c.dropped for c in emulator.calls_to("files.completeUploadExternal")] == [True]
    assert len(emulator.calls_to("files.getUploadURLExternal")) == 1  # not uploaded again either
    async with sessions() as s:
        row = await s.scalar(select(m.Outbox).where(m.Outbox.kind == "files_to_staff"))
    assert (
        row is not None
        and row.outcome == "sent"
        and row.uploaded == [emulator.calls_to("files.info")[0].params["file"]]
    )
