"""The optional CSAT comment, over HTTP: a rating click opens a modal (views.open with the click's trigger_id, as
the emulator checks it: once, within 3 seconds); its view_submission stores the comment on the customer's row."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.texts import Text, Texts
from bot.compose import Bot
from bot.csat import ACTION_PREFIX, COMMENT_BLOCK, COMMENT_INPUT
from bot.playground.slack_emulator import Modal, SlackEmulator
from fakes.openai_server import FakeOpenAI
from harness.scenarios import (
    SUPPORT,
    csat_questions,
    csat_row,
    escalate,
    link,
    rated_csat,
    resolve,
    shown,
    support,
    until,
)

Sessions = async_sessionmaker[AsyncSession]
COMMENT = "Sam was great <!channel> but *slow*; see <https://evil.example|my bank> & <@U_STAFF>"
SHOWN = "Sam was great &lt;!channel&gt; but *slow*; see my bank (<https://evil.example>) &amp; &lt;@U_STAFF&gt;"


async def rated(
    emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions, rating: int = 4
) -> tuple[str, m.Escalation]:
    """A case escalated, resolved, and rated `rating` by its customer (stored)."""
    thread, case = await escalate(emulator, fake_llm, sessions)
    row = await resolve(emulator, sessions, case)
    await click(emulator, csat_questions(emulator, thread)[0].ts, row.id, rating)
    await until(lambda: rated_csat(sessions, row.id))
    return thread, row


async def click(emulator: SlackEmulator, question: str, case: int, rating: int, user: str = "U_CUSTOMER") -> None:
    answer = await emulator.click(
        f"{ACTION_PREFIX}{rating}", str(case), message_ts=question, channel=SUPPORT, user=user
    )
    assert answer.status == 200


async def opened(emulator: SlackEmulator, count: int = 1) -> Modal:
    """The latest of `count` modals the bot opened."""
    modals = await emulator.wait_for(lambda: len(emulator.modals) >= count and list(emulator.modals.values()))
    return modals[-1]


def written(text: str | None) -> dict[str, dict[str, str | None]]:
    return {COMMENT_BLOCK: {COMMENT_INPUT: text}}


async def test_a_rating_opens_the_comment_modal_and_the_comment_is_stored_and_shown_escaped(
    shipped_bot: Bot, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, row = await rated(emulator, fake_llm, sessions)
    modal = await opened(emulator)
    [call] = emulator.calls_to("views.open")
    click_payload = emulator.deliveries[-1].payload
    assert call.params["trigger_id"] == click_payload["trigger_id"] and call.error is None
    assert modal.user == "U_CUSTOMER" and modal.view["private_metadata"] == str(row.id)
    assert modal.view["title"]["text"] == "Thanks for rating us"
    [block] = modal.view["blocks"]
    assert block["optional"] is True and block["element"]["multiline"] is True
    assert block["label"]["text"] == "Anything we could do better?"
    assert [r for r in emulator.response_log if r.user == "U_CUSTOMER"] == []  # the modal is the thanks

    submitted = await emulator.submit_view(modal.id, written(COMMENT))
    assert (submitted.status, submitted.body) == (200, "")  # an empty ack closes the modal
    stored = await csat_row(sessions, row.id)
    assert stored is not None and (stored.rating, stored.comment) == (4, COMMENT)

    audit = shown(await support(emulator, f"show {link(SUPPORT, thread)}"))
    assert f"case #{row.id}: rated 4/5\\n>{SHOWN}" in audit
    stats = shown(await support(emulator, "stats"))
    assert f"*Latest CSAT comments*\\n4/5 from <@U_CUSTOMER> on case #{row.id}\\n>{SHOWN}" in stats
    assert "<!channel>" not in audit + stats and "<@U_STAFF>" not in audit + stats.replace("<@U_STAFF> 4.0", "")


async def test_only_the_customer_who_rated_may_comment(
    shipped_bot: Bot, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, row = await rated(emulator, fake_llm, sessions)
    modal = await opened(emulator)
    # A colleague's click on the rating buttons is refused, and opens no modal for them.
    await click(emulator, csat_questions(emulator, thread)[0].ts, row.id, 1, user="U_STAFF")
    await emulator.wait_for(lambda: [r for r in emulator.response_log if r.user == "U_STAFF"])
    assert list(emulator.modals) == [modal.id]

    forged = await emulator.submit_view(modal.id, written("five stars, honestly"), user="U_STAFF")
    assert forged.status == 200
    assert forged.json() == {
        "response_action": "errors",
        "errors": {COMMENT_BLOCK: Texts().get(Text.CSAT_COMMENT_NOT_YOURS)},
    }
    stored = await csat_row(sessions, row.id)
    assert stored is not None and (stored.rating, stored.comment) == (4, None)


async def test_an_empty_submission_changes_nothing(
    shipped_bot: Bot, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, row = await rated(emulator, fake_llm, sessions)
    first = await opened(emulator)
    assert (await emulator.submit_view(first.id, written("Quick and kind."))).status == 200
    # The customer changes their rating; the new modal is closed without a word, and then with blanks only.
    await click(emulator, csat_questions(emulator, thread)[0].ts, row.id, 5)
    second = await opened(emulator, 2)
    for empty in (None, "  \n "):
        submitted = await emulator.submit_view(second.id, written(empty))
        assert (submitted.status, submitted.body) == (200, "")
    stored = await csat_row(sessions, row.id)
    assert stored is not None and (stored.rating, stored.comment) == (5, "Quick and kind.")


async def test_a_modal_slack_will_not_open_keeps_the_rating_and_thanks_in_the_thread(
    shipped_bot: Bot, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    emulator.trigger_lifetime_s = 0  # every trigger_id has expired by the time the bot exchanges it
    _, row = await rated(emulator, fake_llm, sessions, rating=2)
    thanks = await emulator.wait_for(lambda: [r for r in emulator.response_log if r.user == "U_CUSTOMER"])
    assert [r.body["text"] for r in thanks] == ["Thank you for your rating!"]
    assert [c.error for c in emulator.calls_to("views.open")] == ["expired_trigger_id"] and emulator.modals == {}
    stored = await csat_row(sessions, row.id)
    assert stored is not None and (stored.rating, stored.comment) == (2, None)
