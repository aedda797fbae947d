"""Redaction before the model (issue 29): what the provider receives holds placeholders for the card numbers, IBANs,
emails and phone numbers the customer wrote; the bot's tools, its answers and the transcript hold the real values.
The recognisers alone (true and false positives), the model seam against the fake provider, and the whole bot over
HTTP (the Slack emulator, the real openai client, the fake provider recording every request)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.model import ModelResponse, OpenAIChatModel, TextSink, Usage
from agents.redaction import DEFAULT_KINDS, Kind, RedactingModel, Redactor, Veil, parse_kinds
from bot.playground.slack_emulator import SlackEmulator
from bot.settings import Settings
from fakes.openai_server import FakeOpenAI, RecordedRequest, reply, slow_words, tool_call, tools
from harness.bot import bot_settings, serving
from harness.database import settle

Sessions = async_sessionmaker[AsyncSession]
CARD = "4242 4242 4242 4242"
IBAN = "DE89 3704 0044 0532 0130 00"
EVERYTHING = Redactor(frozenset(Kind), region="DE")


def redacted(text: str, redactor: Redactor = EVERYTHING) -> str:
    return redactor.redact(text)


# --- The recognisers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "shown"),
    [
        ("refund order 100234, card 4242 4242 4242 4242", "refund order 100234, card [card-1]"),
        ("card 4242-4242-4242-4242 please", "card [card-1] please"),
        ("4242424242424242", "[card-1]"),
        ("order 100234 4242 4242 4242 4242", "order 100234 [card-1]"),  # one run, two numbers
        ("amex 3782 822463 10005", "amex [card-1]"),
        ("Meine IBAN ist DE89 3704 0044 0532 0130 00 bitte", "Meine IBAN ist [iban-1] bitte"),
        ("iban es9121000418450200051332.", "iban [iban-1]."),
        ("write to Ana.Lopez@example.es today", "write to [email-1] today"),
        ("call +49 30 1234567 or 0171 1234567", "call [phone-1] or [phone-2]"),
    ],
)
def test_personal_data_becomes_placeholders(written: str, shown: str) -> None:
    assert redacted(written) == shown


@pytest.mark.parametrize(
    "written",
    [
        "refund order 100234 please",
        "order DW-1007, ticket 12345678",
        "am 15.03.2024 um 10:30, or on 2024-03-15",
        "it cost €1,234.56 (1.234,56 € in Germany), $349.00 at most",
        "4242 4242 4242 4241",  # one digit off: fails Luhn's check
        "DE89 3704 0044 0532 0130 01",  # a wrong checksum
        "version 3.12.4, 2048 MB, 1920x1080",
        "sku 978-3-16-148410-0",
    ],
)
def test_ids_dates_prices_and_near_misses_pass_untouched(written: str) -> None:
    assert redacted(written) == written


def test_phone_numbers_need_the_region_or_a_country_code() -> None:
    international = Redactor(frozenset({Kind.PHONE}))
    assert international.redact("ruf 030 12345678 an") == "ruf 030 12345678 an"
    assert international.redact("ruf +49 30 12345678 an") == "ruf [phone-1] an"
    assert Redactor(frozenset({Kind.PHONE}), region="DE").redact("ruf 030 12345678 an") == "ruf [phone-1] an"


def test_only_the_kinds_asked_for_are_redacted() -> None:
    default = Redactor(DEFAULT_KINDS)
    said = f"card {CARD}, iban {IBAN}, mail a@b.example, phone +49 30 1234567"
    assert default.redact(said) == "card [card-1], iban [iban-1], mail a@b.example, phone +49 30 1234567"
    assert parse_kinds("none") == frozenset()
    assert parse_kinds(" Card , email ") == {Kind.CARD, Kind.EMAIL}
    with pytest.raises(ValueError, match="cards"):
        parse_kinds("cards")


def test_the_setting() -> None:
    assert Settings(_env_file=None).redactor == Redactor(DEFAULT_KINDS)  # type: ignore[call-arg]
    assert Settings(_env_file=None, redact="none").redactor is None  # type: ignore[call-arg]
    chosen = Settings(_env_file=None, redact="email,phone", redact_phone_region="de").redactor  # type: ignore[call-arg]
    assert chosen == Redactor(frozenset({Kind.EMAIL, Kind.PHONE}), region="DE")
    with pytest.raises(ValueError, match="names"):
        Settings(_env_file=None, redact="names")  # type: ignore[call-arg]


def test_a_value_is_one_placeholder_however_it_is_written_and_comes_back_as_first_written() -> None:
    veil = Veil(EVERYTHING)
    sent = veil.messages(
        [
            {"role": "system", "content": 'Known about this conversation: {"email": "ana@example.es"}'},
            {"role": "user", "content": f"card {CARD}, and my other card 5555 5555 5555 4444"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "pay", "arguments": '{"card": "4242424242424242"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "charged 4242-4242-4242-4242 for ANA@example.es"},
        ]
    )
    assert sent[0]["content"] == 'Known about this conversation: {"email": "[email-1]"}'
    assert sent[1]["content"] == "card [card-1], and my other card [card-2]"
    assert sent[2]["tool_calls"][0]["function"]["arguments"] == '{"card": "[card-1]"}'
    assert sent[3]["content"] == "charged [card-1] for [email-1]"
    assert (
        veil.restore("[card-2], not [card-1]; [card-9] is nobody's")
        == f"5555 5555 5555 4444, not {CARD}; [card-9] is nobody's"
    )


class Streaming:
    """A provider that streams the given pieces and answers with their whole, recording what it was sent: the
    split of a placeholder across pieces, which a real provider's tokens do and the fake's words do not."""

    def __init__(self, *pieces: str) -> None:
        self.pieces = pieces
        self.sent: list[dict[str, Any]] = []

    async def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_text: TextSink | None = None,
    ) -> ModelResponse:
        self.sent = messages
        for piece in self.pieces:
            if on_text is not None:
                await on_text(piece)
        return ModelResponse("".join(self.pieces), (), Usage(), 0.0)


async def test_a_placeholder_split_across_streamed_pieces_is_held_until_it_closes() -> None:
    provider = Streaming("Your card [ca", "rd-", "1", "] and [", "email-1] are noted [sic]", " [car")
    shown: list[str] = []

    async def show(piece: str) -> None:
        shown.append(piece)

    model = RedactingModel(provider, EVERYTHING)
    said = [{"role": "user", "content": f"card {CARD}, mail ana@example.es"}]
    answer = await model.complete(model="m", messages=said, tools=[], on_text=show)
    whole = f"Your card {CARD} and ana@example.es are noted [sic] [car"
    assert answer.content == whole
    assert "".join(shown) == whole
    assert not any("[ca" in piece or "email-" in piece for piece in shown[:-1])
    assert provider.sent == [{"role": "user", "content": "card [card-1], mail [email-1]"}]
    assert said == [{"role": "user", "content": f"card {CARD}, mail ana@example.es"}]  # the caller's, untouched


async def test_the_provider_gets_placeholders_and_the_tool_call_the_real_values(
    fake_llm: FakeOpenAI, model: OpenAIChatModel
) -> None:
    fake_llm.script(tools(tool_call("charge", {"card": "[card-1]", "note": 'say "hi" to [email-1]'})))
    redacting = RedactingModel(model, EVERYTHING)
    said = [{"role": "user", "content": f"charge {CARD}; Ana <ana@example.es>"}]
    answer = await redacting.complete(model="fake-model", messages=said, tools=[])
    assert fake_llm.requests[-1].last_user == "charge [card-1]; Ana <[email-1]>"
    [call] = answer.tool_calls
    assert json.loads(call.arguments) == {"card": CARD, "note": 'say "hi" to ana@example.es'}


# --- The bot, over HTTP ------------------------------------------------------------------------------------------


def squeezed(request: RecordedRequest) -> str:
    """A request's body without spaces, dashes or JSON's escapes of them: a number in any spacing shows whole."""
    return re.sub(r"[\s\-]|\\u00a0", "", json.dumps(request.body, ensure_ascii=False)).upper()


def sent_anywhere(fake: FakeOpenAI, value: str) -> bool:
    wanted = re.sub(r"[\s\-]", "", value).upper()
    return any(wanted in squeezed(r) for r in [*fake.requests, *fake.embedding_requests])


async def rows_holding(sessions: Sessions, table: str, value: str) -> int:
    async with sessions() as s:
        row = await s.execute(
            text(f"SELECT count(*) FROM {table} t WHERE to_jsonb(t)::text LIKE :v"), {"v": f"%{value}%"}
        )
        return int(row.scalar_one())


async def test_the_provider_never_receives_the_card_while_the_refund_tool_gets_the_order(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    fake_llm.script(
        tools(tool_call("transfer_to_support", {"reason": "a refund"})),
        tools(tool_call("issue_refund", {"order_id": "100234"})),
        reply("I can't find order 100234 on your account. Please never send [card-1] here again."),
    )
    async with serving(bot_settings(database_url, fake_llm, emulator), emulator):
        said = await emulator.user_says("C_SUPPORT", f"refund order 100234, card {CARD}")
        await settle(sessions, timeout_s=20)
    assert len(fake_llm.requests) == 3 and fake_llm.embedding_requests  # the search's query went out too
    assert not sent_anywhere(fake_llm, CARD)
    assert "refund order 100234, card [card-1]" in fake_llm.requests[0].last_user
    async with sessions() as s:
        run = await s.scalar(select(m.ToolRun).where(m.ToolRun.tool == "issue_refund"))
    assert run is not None and json.loads(run.arguments) == {"order_id": "100234"}
    assert "No order '100234'" in (run.output or "")
    *_notice, answer = [p.text for p in emulator.posts("C_SUPPORT", said.ts)]
    assert answer == f"I can't find order 100234 on your account. Please never send {CARD} here again."
    assert await rows_holding(sessions, "messages", CARD) == 2  # the transcript is the customer's own thread
    assert await rows_holding(sessions, "llm_calls", "4242") == 0  # no more than the provider saw


async def test_a_tool_called_with_a_placeholder_gets_the_value_and_the_stream_never_shows_one(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    answer = "Thanks. " + " ".join(["The", "card", "[card-1]", "is", "on", "file", "for", "[email-1]"] * 3) + "."
    fake_llm.script(
        tools(tool_call("record_customer_name", {"name": "Ana [email-1]"})),
        slow_words(answer, first_s=0.1, each_s=0.05),
    )
    settings = bot_settings(database_url, fake_llm, emulator, redact="card,iban,email")
    async with serving(settings, emulator):
        said = await emulator.user_says("C_SUPPORT", f"I'm Ana, ana@example.es, card {CARD}")
        await settle(sessions, timeout_s=20)
    assert not sent_anywhere(fake_llm, CARD) and not sent_anywhere(fake_llm, "ana@example.es")
    async with sessions() as s:
        run = await s.scalar(select(m.ToolRun).where(m.ToolRun.tool == "record_customer_name"))
    assert run is not None and json.loads(run.arguments) == {"name": "Ana ana@example.es"}
    restored = answer.replace("[card-1]", CARD).replace("[email-1]", "ana@example.es")
    assert [p.text for p in emulator.posts("C_SUPPORT", said.ts)] == [restored]
    previews = [shown for stream in emulator.streams("C_SUPPORT") for shown in stream.texts]
    assert previews and all("[card" not in p and "[email" not in p for p in previews)


async def test_an_iban_in_german_text_reaches_the_provider_as_a_placeholder(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    fake_llm.script(reply("Danke, die Erstattung geht auf [iban-1]."))
    async with serving(bot_settings(database_url, fake_llm, emulator), emulator):
        said = await emulator.user_says(
            "C_SUPPORT", f"Hallo, bitte überweist das Geld für Bestellung 100234 auf meine IBAN {IBAN}, danke!"
        )
        await settle(sessions, timeout_s=20)
    assert not sent_anywhere(fake_llm, IBAN)
    assert "Bestellung 100234 auf meine IBAN [iban-1], danke!" in fake_llm.requests[0].last_user
    assert [p.text for p in emulator.posts("C_SUPPORT", said.ts)] == [f"Danke, die Erstattung geht auf {IBAN}."]


async def test_what_redact_leaves_out_passes_as_written(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    written = f"card {CARD}, iban {IBAN}"
    for setting, card_sent, iban_sent in (("iban", True, False), ("none", True, True)):
        fake_llm.reset()
        fake_llm.script(reply("Noted."))
        async with serving(bot_settings(database_url, fake_llm, emulator, redact=setting), emulator):
            await emulator.user_says("C_SUPPORT", written)
            await settle(sessions, timeout_s=20)
        assert (sent_anywhere(fake_llm, CARD), sent_anywhere(fake_llm, IBAN)) == (card_sent, iban_sent), setting
