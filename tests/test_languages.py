"""The bot speaks the customer's language: its own words (notices, escalation, resolve, CSAT) and the agents' answers
follow what the customer writes, else their platform's locale, else the operator's language; the operator may
override any text in any language. Over HTTP: the Slack and Teams emulators, the fake model, the bot as it ships."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.language import Language, heard
from agents.offline import ASKS_FOR_PERSON
from agents.texts import CATALOG, TEMPLATES, WHEN, Text, Texts
from bot.compose import Bot
from bot.csat import ACTION_PREFIX
from bot.declaration.build import with_declaration
from bot.declaration.parse import DeclarationError, load
from bot.eval import CITED
from bot.playground.slack_emulator import SlackEmulator
from bot.settings import Settings
from fakes.openai_server import FakeOpenAI, RecordedRequest, reply, slow_words, tool_call, tools
from fakes.teams_api import StreamType, TeamsEmulator
from harness import teams as th
from harness.bot import bot_settings, serving
from harness.database import settle
from harness.scenarios import (
    STAFF,
    SUPPORT,
    csat_questions,
    rated_csat,
    resolve,
    serving_as_shipped,
    until,
)

Sessions = async_sessionmaker[AsyncSession]
ES, DE = Language.ES, Language.DE


def said(key: Text, language: Language, **values: str) -> str:
    return CATALOG[key][language].format(**values)


async def escalated_in(emulator: SlackEmulator, fake: FakeOpenAI, sessions: Sessions, words: str) -> tuple[str, str]:
    """The customer writes `words`; the front desk hands over to Sales, which asks for a person. The thread and the
    case's message."""
    fake.script(
        tools(tool_call("transfer_to_sales", {"reason": "wants a drone"})),
        tools(tool_call("escalate_to_human", {"reason": "customer asked for a person"})),
    )
    asked = await emulator.user_says(SUPPORT, words)
    case = await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts])
    await settle(sessions)
    return asked.ts, case[0].ts


def system(request: RecordedRequest) -> str:
    """Every system message the model was given (the language line follows the instructions)."""
    return "\n".join(str(m["content"]) for m in request.messages if m["role"] == "system")


async def language_of(sessions: Sessions) -> str | None:
    async with sessions() as s:
        return await s.scalar(select(m.Conversation.language))


async def test_a_spanish_customer_hears_the_bot_in_spanish_from_handoff_to_csat(
    shipped_bot: Bot, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, case_ts = await escalated_in(
        emulator, fake_llm, sessions, "Hola, quiero comprar un dron con cámara, pero prefiero hablar con una persona"
    )
    texts = [p.text for p in emulator.posts(SUPPORT, thread)]
    assert texts[:2] == [said(Text.HANDOFF_NOTICE, ES, agent="Sales"), said(Text.ESCALATION_MESSAGE, ES)]
    assert await language_of(sessions) == "es"
    # The agents were told, in one line, which language to answer in.
    agents = fake_llm.requests[:2]  # the front desk's call and Sales'; the case's summary is for staff
    assert all("The customer writes in Spanish: answer in Spanish." in system(r) for r in agents)

    case = next(p for p in emulator.posts(STAFF) if p.ts == case_ts)
    row = await resolve(emulator, sessions, case)
    texts = [p.text for p in emulator.posts(SUPPORT, thread)]
    assert texts[-2:] == [said(Text.RESOLVED_MESSAGE, ES), said(Text.CSAT_QUESTION, ES)]
    [question] = csat_questions(emulator, thread)
    assert question.blocks is not None and said(Text.CSAT_QUESTION, ES) in json.dumps(
        question.blocks, ensure_ascii=False
    )

    # The rating's comment form, in Spanish too.
    clicked = await emulator.click(
        f"{ACTION_PREFIX}5", str(row.id), message_ts=question.ts, channel=SUPPORT, user="U_CUSTOMER"
    )
    assert clicked.status == 200
    await until(lambda: rated_csat(sessions, row.id))
    [modal] = await emulator.wait_for(lambda: list(emulator.modals.values()))
    shown = modal.view
    assert (shown["title"]["text"], shown["submit"]["text"], shown["close"]["text"]) == (
        "Gracias por valorarnos", "Enviar", "Omitir"
    )  # fmt: skip
    assert shown["blocks"][0]["label"]["text"] == "¿Hay algo que podamos mejorar?"


async def test_a_german_customer_is_told_in_german_when_the_case_is_resolved(
    shipped_bot: Bot, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "customer asked for a person"})))
    asked = await emulator.user_says(SUPPORT, "Mein Akku lädt nicht mehr, ich möchte bitte mit einem Menschen sprechen")
    case = (await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts]))[0]
    await settle(sessions)
    assert [p.text for p in emulator.posts(SUPPORT, asked.ts)] == [said(Text.ESCALATION_MESSAGE, DE)]
    await resolve(emulator, sessions, case)
    texts = [p.text for p in emulator.posts(SUPPORT, asked.ts)]
    assert texts[-2:] == [said(Text.RESOLVED_MESSAGE, DE), said(Text.CSAT_QUESTION, DE)]


async def test_the_operators_spanish_words_win_over_the_bots(
    database_url: str, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    own = "Un compañero de Driftwing te escribe enseguida."
    async with serving_as_shipped(
        database_url, fake_llm, emulator, texts_by_language={"es": {"escalation_message": own}}
    ):
        thread, _ = await escalated_in(emulator, fake_llm, sessions, "necesito hablar con una persona, por favor")
    assert [p.text for p in emulator.posts(SUPPORT, thread)] == [said(Text.HANDOFF_NOTICE, ES, agent="Sales"), own]


async def test_a_short_message_from_a_slack_user_is_answered_in_their_locale_and_keeps_it(
    database_url: str, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    """Nothing to tell from "ok": the locale users.info gives (asked for the writer anyway) decides; a later short
    message keeps what was decided."""
    emulator.users["U_CUSTOMER"] = replace(emulator.users["U_CUSTOMER"], locale="fr-FR")
    async with serving(bot_settings(database_url, fake_llm, emulator), emulator):
        fake_llm.script(reply("D'accord."))
        first = await emulator.user_says(SUPPORT, "ok")
        await emulator.wait_for(lambda: emulator.posts(SUPPORT, first.ts))
        await settle(sessions)
        assert await language_of(sessions) == "fr"
        assert "The customer writes in French: answer in French." in system(fake_llm.requests[-1])


async def test_a_teams_customer_with_a_german_client_gets_german_for_a_short_ok(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator, teams: TeamsEmulator
) -> None:
    teams.users[th.CUSTOMER] = replace(teams.user(th.CUSTOMER), locale="de-DE")
    settings = bot_settings(database_url, fake_llm, emulator, **th.teams_settings(teams))
    async with serving(settings, emulator) as bot:
        teams.messaging_url = f"{bot.url}/api/messages"
        fake_llm.script(tools(tool_call("escalate_to_human", {"reason": "customer asked for a person"})))
        sent = await th.personal(teams, "ok")
        assert sent.status == 200
        posts = await teams.wait_for(lambda: teams.posts(sent.conversation_id), timeout=15)
        await settle(sessions)
    assert posts[0].text == said(Text.ESCALATION_MESSAGE, DE)
    assert "The customer writes in German: answer in German." in system(fake_llm.requests[0])
    assert await language_of(sessions) == "de"


# --- The words around an answer and the progress lines ----------------------------------------------------------


async def test_a_spanish_answer_carries_its_sources_line_and_button_labels_in_spanish(
    database_url: str, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    """Rendered by the outbox when it is sent: in the language of the conversation the row belongs to."""
    settings = bot_settings(database_url, fake_llm, emulator, handoff_notice="", kb_min_similarity=0.3)
    async with serving(settings, emulator):
        fake_llm.script(
            tools(tool_call("transfer_to_support", {"reason": "una pregunta de garantía"})),
            tools(tool_call("search_knowledge", {"query": "how long is the standard warranty period?"})),
            reply("La garantía estándar de todos los drones Driftwing es de 12 meses desde la entrega [1]."),
        )
        asked = await emulator.user_says(SUPPORT, "Hola, ¿cuánto dura la garantía estándar de los drones?")
        [answer] = await emulator.wait_for(lambda: emulator.posts(SUPPORT, asked.ts))
        await settle(sessions)
    assert await language_of(sessions) == "es"
    [line] = [e["text"] for b in answer.blocks or [] if b["type"] == "context" for e in b["elements"]]
    assert line.startswith("Fuentes: Warranty and Driftwing Care")
    [buttons] = [e for b in answer.blocks or [] if b["type"] == "context_actions" for e in b["elements"]]
    labels = (buttons["positive_button"]["accessibility_label"], buttons["negative_button"]["accessibility_label"])
    assert labels == (said(Text.FEEDBACK_HELPED, ES), said(Text.FEEDBACK_NOT_HELPED, ES))


async def test_a_german_customer_sees_slacks_ai_status_in_german(
    slack_bot: Bot, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(tools(tool_call("transfer_to_support")), reply("Sie wird morgen verschickt."))
    asked = await emulator.user_says(SUPPORT, "Hallo, wo ist meine Bestellung DW-1006? Sie ist noch nicht angekommen.")
    await emulator.wait_for(lambda: emulator.posts(SUPPORT, asked.ts))
    await settle(sessions)
    assert await language_of(sessions) == "de"
    calls = [c.params for c in emulator.calls_to("assistant.threads.setStatus") if not c.failed]
    assert [c["status"] for c in calls] == ["denkt nach…", "fragt Support…", "prüft deine Bestellung…"]
    assert calls[0]["loading_messages"] == ["Lese deine Nachricht…", "Denke darüber nach…"]
    assert calls[1]["loading_messages"] == ["Ich verbinde dich mit Support…"]


async def test_a_spanish_teams_customer_sees_the_stream_start_in_spanish(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator, teams: TeamsEmulator
) -> None:
    settings = bot_settings(database_url, fake_llm, emulator, **th.teams_settings(teams))
    async with serving(settings, emulator) as bot:
        teams.messaging_url = f"{bot.url}/api/messages"
        fake_llm.script(slow_words("Tu pedido sale de nuestro almacén en dos días laborables.", 0.3, 0.1))
        sent = await th.personal(teams, "Hola, ¿cuándo se envía mi pedido? Lo necesito para el viernes.")
        await teams.wait_for(lambda: teams.posts(sent.conversation_id) or None, timeout=20)
        await settle(sessions)
    assert await language_of(sessions) == "es"
    [started, *_] = teams.shown_in(sent.conversation_id)
    assert (started.kind, started.text) == (StreamType.INFORMATIVE, "Escribiendo una respuesta…")


def test_the_eval_counts_the_offline_modes_citation_in_every_language() -> None:
    for language in Language:
        assert CITED.search(Texts().get(Text.OFFLINE_SOURCE, language).format(source="Warranty")), language


# --- The catalog and the declaration ---------------------------------------------------------------------------


def test_every_text_is_in_every_language_with_the_same_placeholders() -> None:
    for key in Text:
        assert set(CATALOG[key]) == set(Language), key
        for language, words in CATALOG[key].items():
            assert words.format(**dict.fromkeys(TEMPLATES.get(key, ()), "X")), (key, language)
            names = {name for name in TEMPLATES.get(key, ())}
            assert all("{" + name + "}" in words for name in names), (key, language)
    assert {language for window in WHEN.values() for language in window} == set(Language)
    assert Texts().limited("day", DE).endswith("Schreib morgen wieder, dann mache ich dort weiter.")


DECLARED = """\
version: 1
brand: {{name: Lumen}}
entry: desk
language: {language}
texts:
{texts}
agents:
  desk: {{title: the desk, description: Greets., instructions: Be kind.}}
"""


def declared(tmp_path: Path, texts: str, language: str = "es") -> Path:
    path = tmp_path / "helpdesk.yaml"
    path.write_text(DECLARED.format(language=language, texts=texts))
    return path


def test_the_declaration_sets_the_language_its_words_and_other_languages(tmp_path: Path) -> None:
    texts = (
        '  escalation_message: "Un compañero de Lumen se une."\n'
        '  de:\n    escalation_message: "Jemand von Lumen kommt."'
    )
    settings = with_declaration(Settings(_env_file=None), load(declared(tmp_path, texts)))  # type: ignore[call-arg]
    spoken = settings.texts
    assert spoken.default == ES
    assert spoken.get(Text.ESCALATION_MESSAGE) == "Un compañero de Lumen se une."
    assert spoken.get(Text.ESCALATION_MESSAGE, DE) == "Jemand von Lumen kommt."
    assert spoken.get(Text.ESCALATION_MESSAGE, Language.EN) == said(Text.ESCALATION_MESSAGE, Language.EN)
    assert spoken.get(Text.RESOLVED_MESSAGE) == said(Text.RESOLVED_MESSAGE, ES)
    # A variable set for the default language wins over the file.
    chosen = Settings(_env_file=None, escalation_message="Del entorno")  # type: ignore[call-arg]
    assert with_declaration(chosen, load(declared(tmp_path, texts))).texts.get(Text.ESCALATION_MESSAGE) == "Del entorno"


@pytest.mark.parametrize(
    ("texts", "problem"),
    [
        ('  deu:\n    escalation_message: "x"', "texts.deu: unknown language (did you mean 'de'?)"),
        (
            '  de:\n    escalation_mesage: "x"',
            "texts.de.escalation_mesage: unknown text (did you mean 'escalation_message'?)",
        ),
        (
            '  de:\n    handoff_notice: "Zu {agnet}"',
            "texts.de.handoff_notice: unknown placeholder {agnet}; it may use {agent}",
        ),
        ('  de: "Hallo"', "texts.de: the texts in German are a block"),
    ],
)
def test_a_language_block_is_checked_like_the_texts(tmp_path: Path, texts: str, problem: str) -> None:
    with pytest.raises(DeclarationError) as raised:
        load(declared(tmp_path, texts))
    assert any(problem in p for p in raised.value.problems), raised.value.problems


def test_an_empty_text_in_the_operators_language_is_said_in_no_language() -> None:
    """HANDOFF_NOTICE empty ("empty: none") turns the notice off for every customer, not only the operator's."""
    texts = Texts(Language.EN, {Language.EN: {Text.HANDOFF_NOTICE: ""}, DE: {Text.HANDOFF_NOTICE: "Zu {agent}"}})
    assert texts.get(Text.HANDOFF_NOTICE) == texts.get(Text.HANDOFF_NOTICE, ES) == ""
    assert texts.get(Text.HANDOFF_NOTICE, DE) == "Zu {agent}"
    assert texts.get(Text.RESOLVED_MESSAGE, ES) == said(Text.RESOLVED_MESSAGE, ES)


def test_a_too_long_button_in_another_language_stops_the_bot_at_start_up() -> None:
    too_long = {"de": {"csat_comment_skip": "Diesen Schritt bitte überspringen"}}
    with pytest.raises(ValueError, match=r"de\.csat_comment_skip: at most 24 characters"):
        Settings(_env_file=None, texts_by_language=too_long)  # type: ignore[call-arg,arg-type]


@pytest.mark.parametrize(
    ("written", "known", "expected"),
    [
        ("como cambio la bateria", Language.EN, ES),  # a locale's guess, corrected
        ("Mein Login funktioniert nicht", Language.EN, DE),
        ("thank you", ES, ES),  # a few words of English keep a Spanish conversation Spanish
        ("please", DE, DE),
        ("firmware 2.1 update", DE, DE),
        ("please", None, Language.EN),  # nothing known yet: what little there is decides
        # A first sentence without accents, between Spanish and Portuguese, is still Spanish; two words are not told.
        ("hola, como cambio la bateria de mi dron? no carga", None, ES),
        ("refund pls", None, None),
        # What the customer pastes or quotes is not how they speak.
        ("```Traceback (most recent call last): File main.py, line 3, in module```\nno me funciona esto", ES, ES),
        ("&gt; Your order has shipped and will arrive tomorrow, thank you\nqué significa esto", None, ES),
        ("see `ERROR: payment declined by the issuing bank, please try again later`", DE, DE),
        ("<https://shop.example.com/help|the help page about returns and refunds> no carga", ES, ES),
    ],
)
def test_the_conversations_language_follows_the_customers_prose_and_does_not_flap(
    written: str, known: Language | None, expected: Language | None
) -> None:
    assert heard(written, known) == expected


@pytest.mark.parametrize(
    ("written", "asks"),
    [
        ("quiero hablar con una persona", True),
        ("Ich möchte mit einem Menschen sprechen", True),
        ("je veux parler à quelqu'un", True),
        ("posso falar com um atendente?", True),
        ("como cambio la bateria", False),
        ("Akku lädt nicht mehr", False),
        ("mein Mitarbeiterausweis", False),
    ],
)
def test_a_request_for_a_person_is_heard_in_each_language(written: str, asks: bool) -> None:
    # The router leaves such a message to the agents (who escalate), and the offline mode escalates it.
    assert bool(ASKS_FOR_PERSON.search(written)) is asks
