"""`/support` over HTTP: signed slash commands into the real bot, answers read back from the emulator's
response_url, every subcommand, the refusal, usage help, and the admin action log."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from bot.admin.parse import (
    CaseRef,
    ChangeConversation,
    Conversations,
    Help,
    KbSearch,
    Pause,
    Resume,
    Show,
    Stats,
    ThreadRef,
    UsageError,
    parse,
)
from bot.playground.slack_emulator import SlackEmulator
from fakes.openai_server import FakeOpenAI, cached, error, reply, slow, tool_call, tools
from harness.bot import bot_settings, serving
from harness.database import settle
from harness.scenarios import ADMIN, STAFF, SUPPORT, escalate, escalation_row, link, shown, support
from harness.slack import replies_in

Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
async def admin_bot(database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator) -> Any:
    """`sessions` first: its tables are emptied before the bot starts using them (else the two can deadlock)."""
    emulator.add_user(ADMIN, "ada", "Ada Admin")
    emulator.add_user("U_OWNER", "olga", "Olga Owner", is_admin=True)
    settings = bot_settings(database_url, fake_llm, emulator, admin_user_ids=ADMIN)
    async with serving(settings, emulator) as bot:
        yield bot


async def conversation(sessions: Sessions) -> m.Conversation:
    async with sessions() as s:
        row = await s.scalar(select(m.Conversation).order_by(m.Conversation.id.desc()))
    assert row is not None
    return row


async def admin_log(sessions: Sessions) -> list[tuple[str, str, str, bool, bool]]:
    async with sessions() as s:
        rows = await s.execute(
            select(
                m.AdminAction.user_id,
                m.AdminAction.command,
                m.AdminAction.arguments,
                m.AdminAction.allowed,
                m.AdminAction.ok,
            ).order_by(m.AdminAction.id)
        )
        return [tuple(r) for r in rows]  # type: ignore[misc]


async def to_sales(emulator: SlackEmulator, fake: FakeOpenAI, sessions: Sessions, text: str) -> str:
    """A customer's first message, which triage hands to sales; returns the thread."""
    fake.script(tools(tool_call("transfer_to_sales", {"reason": "wants a drone"})), reply("Which budget?"))
    said = await emulator.user_says(SUPPORT, text)
    await replies_in(emulator, SUPPORT, said.ts, 2)
    await settle(sessions)
    return said.ts


# -- parsing (no Slack, no database) --------------------------------------------------------------------------


def test_parse_commands_refs_and_usage_errors() -> None:
    assert parse("") == Help() and parse("help stats") == Help("stats")
    assert parse("conversations") == Conversations("recent") and parse("conversations human") == Conversations("human")
    assert parse("show <https://x.slack.com/archives/C1/p1700000000000100|the thread>") == (
        Show(ThreadRef("C1", "1700000000.000100"))
    )
    escaped = "show <https://x.slack.com/archives/C1/p1700000000000200?cid=C1&amp;thread_ts=1700000000.000100>"
    assert parse(escaped) == Show(ThreadRef("C1", "1700000000.000100"))  # &amp; is Slack's escaping of &
    assert parse("close <https://x.slack.com/archives/C1/p1700000000000200?thread_ts=1700000000.000100&cid=C1>") == (
        ChangeConversation("close", ThreadRef("C1", "1700000000.000100"))
    )
    assert parse("reset #42") == ChangeConversation("reset", CaseRef(42))
    assert parse("pause <#C0SUPPORT|support>") == Pause("C0SUPPORT") and parse("resume") == Resume(None)
    assert parse("kb search battery   life") == KbSearch("battery life") and parse("stats 30") == Stats(30)
    assert parse("kb search it's Bob's R&amp;D drone") == KbSearch("it's Bob's R&D drone")
    assert parse("pause C0123ABCD") == Pause("C0123ABCD") and parse("show #7") == Show(CaseRef(7))
    for bad, usage in [
        ("frobnicate", ""),
        ("show", "/support show <thread link>"),
        ("show nonsense", "/support show <thread link>"),
        ("pause general", "/support pause [#channel]"),
        ("pause GENERAL", "/support pause [#channel]"),
        ("stats 0", "/support stats [days]"),
        ("stats forever", "/support stats [days]"),
        ("kb", "/support kb search <query> | kb stats"),
        ("conversations closed", "/support conversations [open|human|recent]"),
    ]:
        error = parse(bad)
        assert isinstance(error, UsageError) and error.usage == usage, bad


# -- over HTTP ---------------------------------------------------------------------------------------------


async def test_non_admins_are_refused_politely_logged_and_recorded(
    admin_bot: Any, emulator: SlackEmulator, sessions: Sessions, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="bot.admin.command"):
        body = await support(emulator, "pause", user="U_STAFF")
    assert "only for the people who run this bot" in shown(body) and "`U_STAFF`" in shown(body)
    assert any("refused for U_STAFF" in r.getMessage() for r in caplog.records)
    # A workspace admin is not an admin here unless ADMIN_WORKSPACE_ADMINS says so.
    assert "only for the people" in shown(await support(emulator, "status", user="U_OWNER"))
    async with sessions() as s:
        assert await s.scalar(select(m.Pause)) is None  # nothing was paused
    assert await admin_log(sessions) == [
        ("U_STAFF", "pause", "", False, False),
        ("U_OWNER", "status", "", False, False),
    ]


async def test_workspace_admins_may_when_configured(
    database_url: str, fake_llm: FakeOpenAI, emulator: SlackEmulator, sessions: Sessions
) -> None:
    emulator.add_user("U_OWNER", "olga", "Olga Owner", is_admin=True)
    settings = bot_settings(database_url, fake_llm, emulator, admin_workspace_admins=True)
    async with serving(settings, emulator):
        assert "/support agents" in shown(await support(emulator, "help", user="U_OWNER"))
        assert "only for the people" in shown(await support(emulator, "help", user="U_STAFF"))
    assert [c.params["user"] for c in emulator.calls_to("users.info")] == ["U_OWNER", "U_STAFF"]


async def test_help_unknown_and_malformed_get_usage(
    admin_bot: Any, emulator: SlackEmulator, sessions: Sessions
) -> None:
    listing = shown(await support(emulator, ""))
    for line in ("status", "agents", "conversations [open|human|recent]", "show <thread link>", "escalations"):
        assert f"/support {line}" in listing
    assert "I don't know the subcommand `frobnicate`" in shown(await support(emulator, "frobnicate now"))
    answer = shown(await support(emulator, "show yesterday"))
    assert "`yesterday` is not a Slack message link" in answer and "Usage: `/support show <thread link>`" in answer
    assert "between 1 and 365" in shown(await support(emulator, "stats 9999"))
    log = await admin_log(sessions)
    assert [(c, ok) for _, c, _, _, ok in log] == [
        ("help", True),
        ("frobnicate", False),
        ("show", False),
        ("stats", False),
    ]


async def test_status_answers_through_the_response_url_after_an_immediate_ack(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI
) -> None:
    fake_llm.models_delay = 1.0  # the provider check is slow: the ack must not wait for it
    ack = await emulator.slash_command("/support", "status", user=ADMIN, channel=STAFF)
    assert (ack.status, ack.body) == (200, "") and emulator.response_log == []
    answer = await emulator.wait_for(lambda: emulator.response_log)
    text = json.dumps(answer[0].body["blocks"], ensure_ascii=False)
    for expected in ("*Database*\\nok", "reachable", "fake-model", "0 message(s) waiting", "0 open", "0.1.0", "up "):
        assert expected in text, expected
    fake_llm.models_delay, fake_llm.models_status = 0, 503  # the provider is down
    text = shown(await support(emulator, "status"))
    assert "unreachable" in text and "customers get an apology and a colleague" in text


async def test_agents_shows_the_roster_and_handoffs(admin_bot: Any, emulator: SlackEmulator) -> None:
    text = shown(await support(emulator, "agents"))
    assert "*triage* (entry)" in text and "hands off to *sales*, *support*" in text
    assert "lookup_order" in text and "escalate_to_human" in text


async def test_conversations_show_and_escalations(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    first = await to_sales(emulator, fake_llm, sessions, "I'd like to buy a drone for filming")
    listed = shown(await support(emulator, "conversations"))
    assert f"<#{SUPPORT}>" in listed and "with the bot" in listed and "*sales*" in listed and "1 msg" in listed
    assert "None." in shown(await support(emulator, "conversations human"))

    detail = shown(await support(emulator, f"show {link(SUPPORT, first)}"))
    assert "I'd like to buy a drone for filming" in detail and "Which budget?" in detail
    assert "triage → sales (wants a drone)" in detail and "called transfer_to_sales" in detail

    assert "nobody is waiting" in shown(await support(emulator, "escalations"))
    thread, case = await escalate(emulator, fake_llm, sessions)
    row = await escalation_row(sessions)
    cases = shown(await support(emulator, "escalations"))
    assert f"*#{row.id}* open" in cases and "unclaimed" in cases and "customer asked for a person" in cases
    assert "waiting for a person" in shown(await support(emulator, "conversations human"))
    assert "waiting for a person" in shown(await support(emulator, "conversations open"))
    assert "customer asked for a person" in shown(await support(emulator, f"show #{row.id}"))
    # A link to a reply inside the thread, or to the case message, finds the same conversation.
    reply_ts = emulator.posts(SUPPORT, thread)[-1].ts
    assert "can I talk to an actual human being?" in shown(
        await support(emulator, f"show {link(SUPPORT, reply_ts, thread)}")
    )
    assert "customer asked for a person" in shown(await support(emulator, f"show {link(STAFF, case.ts)}"))
    assert "no conversation for that link" in shown(await support(emulator, f"show {link(SUPPORT, '1.000001')}"))


async def test_show_and_escalations_keep_customers_and_models_text_inert(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    hostile = "<!channel> <@U0ADMIN> <https://evil.example|driftwing.com>"
    fake_llm.script(
        tools(tool_call("transfer_to_sales", {"reason": f"wants {hostile}"})),
        tools(tool_call("escalate_to_human", {"reason": f"asked {hostile}"})),
    )
    said = await emulator.user_says(SUPPORT, f"a person please {hostile}")
    await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts])
    await settle(sessions)
    for command in (f"show {link(SUPPORT, said.ts)}", "escalations"):
        answer = shown(await support(emulator, command))
        assert "<!" not in answer and "<@U0ADMIN>" not in answer and "|driftwing.com>" not in answer
        assert "&lt;!channel&gt;" in answer and "driftwing.com (<https://evil.example>)" in answer
    assert emulator.rejected == []


async def test_handback_and_close_by_link(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, case = await escalate(emulator, fake_llm, sessions)
    answer = shown(await support(emulator, f"handback {link(SUPPORT, thread)}"))
    assert "handed back to the bot" in answer
    await settle(sessions)
    assert emulator.posts(SUPPORT, thread)[-1].text.startswith("You're back with our assistant")
    row = await escalation_row(sessions)
    assert (row.status, row.closed_by) == ("handed_back", ADMIN)
    assert "Handed back to the bot by <@U_ADMIN>" in json.dumps(emulator.message(STAFF, case.ts).blocks)  # type: ignore[union-attr]
    assert "already with the bot" in shown(await support(emulator, f"handback {link(SUPPORT, thread)}"))

    assert "Conversation closed" in shown(await support(emulator, f"close {link(SUPPORT, thread)}"))
    await settle(sessions)
    assert (await conversation(sessions)).mode == "closed"
    assert emulator.posts(SUPPORT, thread)[-1].text.startswith("This conversation is now closed")
    assert "already closed" in shown(await support(emulator, f"close #{row.id}"))


async def test_close_resolves_an_open_case(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    await escalate(emulator, fake_llm, sessions)
    row = await escalation_row(sessions)
    assert f"Case #{row.id} resolved" in shown(await support(emulator, f"close #{row.id}"))
    assert ((await escalation_row(sessions)).status, (await conversation(sessions)).mode) == ("resolved", "closed")


async def test_reset_returns_to_triage_with_the_context_cleared(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread = await to_sales(emulator, fake_llm, sessions, "my secret budget is 900 euros, which drone?")
    assert (await conversation(sessions)).active_agent == "sales"

    answer = shown(await support(emulator, f"reset {link(SUPPORT, thread)}"))
    assert "back to triage, context cleared" in answer
    row = await conversation(sessions)
    assert (row.mode, row.active_agent, row.context, row.history_from is not None) == ("bot", "triage", {}, True)

    fake_llm.script(reply("Hello again! How can I help?"))
    await emulator.user_says(SUPPORT, "hi", thread_ts=thread)
    await emulator.wait_for(lambda: emulator.posts(SUPPORT, thread)[-1].text == "Hello again! How can I help?")
    request = fake_llm.requests[-1]
    assert "front desk" in request.system  # triage's prompt
    assert not any("900 euros" in str(msg.get("content")) for msg in request.messages)
    assert "Reset by an admin" in shown(await support(emulator, f"show {link(SUPPORT, thread)}"))


async def test_pause_hands_customers_to_people_and_resume_brings_the_bot_back(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    assert "Paused in <#C_SUPPORT>" in shown(await support(emulator, f"pause <#{SUPPORT}|support>"))
    assert "already paused in <#C_SUPPORT>" in shown(await support(emulator, f"pause <#{SUPPORT}>"))
    assert "*Paused*\\n<#C_SUPPORT> (by <@U_ADMIN>)" in shown(await support(emulator, "status"))

    said = await emulator.user_says(SUPPORT, "my order never arrived")
    answer = await replies_in(emulator, SUPPORT, said.ts, 1)
    assert answer == ["Our assistant is paused here for now, so I've passed your message to a colleague, who will "
                      "reply here."]  # fmt: skip
    case = await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF) if not p.thread_ts])
    assert "my order never arrived" in json.dumps(case[0].blocks)
    assert fake_llm.calls == 0  # no agent ran
    row = await escalation_row(sessions)
    assert (row.trigger, row.status) == ("paused", "open")

    # Elsewhere the bot still answers, also in a channel whose id the pause's pattern must not match.
    emulator.add_channel("CXSUPPORT", "sales-questions")
    fake_llm.script(reply("Hi there!"))
    other = await emulator.user_says("CXSUPPORT", "hello")
    assert await replies_in(emulator, "CXSUPPORT", other.ts, 1) == ["Hi there!"]

    assert "Resumed in <#C_SUPPORT>" in shown(await support(emulator, f"resume <#{SUPPORT}>"))
    assert "was not paused in <#C_SUPPORT>" in shown(await support(emulator, f"resume <#{SUPPORT}>"))
    # The open case stays with the team: the customer's follow-up goes to staff, not to an agent.
    await emulator.user_says(SUPPORT, "any news?", thread_ts=said.ts)
    await emulator.wait_for(lambda: [p for p in emulator.posts(STAFF, case[0].ts) if "any news?" in p.text])
    # A new thread gets the bot again.
    fake_llm.script(reply("Happy to help!"))
    fresh = await emulator.user_says(SUPPORT, "question about batteries")
    assert await replies_in(emulator, SUPPORT, fresh.ts, 1) == ["Happy to help!"]

    # Everywhere, then resume everywhere.
    assert "Paused everywhere" in shown(await support(emulator, "pause"))
    paused = await emulator.user_says("CXSUPPORT", "anyone there?")
    assert (await replies_in(emulator, "CXSUPPORT", paused.ts, 1))[0].startswith("Our assistant is paused here")
    assert fake_llm.calls == 2  # the two answers above; none while paused
    assert "Resumed everywhere" in shown(await support(emulator, "resume"))
    async with sessions() as s:
        assert await s.scalar(select(m.Pause)) is None


async def test_kb_search_and_stats(admin_bot: Any, emulator: SlackEmulator) -> None:
    stats = shown(await support(emulator, "kb stats"))
    assert "*catalogue*: " in stats and "*support*: 7 document(s)" in stats
    hits = shown(await support(emulator, "kb search return policy refund"))
    assert "Top 5 for _return policy refund_" in hits and "support/" in hits and "score" in hits


async def test_stats_counts_the_period(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    await to_sales(emulator, fake_llm, sessions, "I want a drone")
    thread, case = await escalate(emulator, fake_llm, sessions)
    await emulator.user_says(STAFF, "Hi, Sam here", user="U_STAFF", thread_ts=case.ts)  # claims it
    await emulator.wait_for(lambda: [p for p in emulator.posts(SUPPORT, thread) if p.username])
    await settle(sessions)
    text = shown(await support(emulator, "stats 7"))
    assert "Last 7 days" in text and "2 active, 2 new" in text
    assert "2 from customers, 1 from staff" in text and "triage → sales: 1" in text
    assert "1 (50% of conversations)" in text and "agent: 1" in text
    assert "to claim " in text and "to claim n/a" not in text and "first human reply n/a" not in text
    assert "3 call(s), 0 failed" in text and "prompt" in text
    assert "Last 1 day" in shown(await support(emulator, "stats 1"))


async def test_stats_show_the_tokens_the_providers_cache_served(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(cached(None, reply("Hello!")))  # a provider that does not say (Ollama, vLLM)
    said = await emulator.user_says(SUPPORT, "hi")
    await replies_in(emulator, SUPPORT, said.ts, 1)
    await settle(sessions)
    assert "(cache not reported)" in shown(await support(emulator, "stats 1"))
    fake_llm.script(cached(384, reply("Anything else?")))
    await emulator.user_says(SUPPORT, "thanks", thread_ts=said.ts)
    await replies_in(emulator, SUPPORT, said.ts, 2)
    await settle(sessions)
    assert "(384 cached)" in shown(await support(emulator, "stats 1"))


async def test_every_admin_command_is_recorded(admin_bot: Any, emulator: SlackEmulator, sessions: Sessions) -> None:
    for text in ("agents", "kb stats", "escalations", f"pause <#{SUPPORT}>", f"pause <#{SUPPORT}>"):
        await support(emulator, text)
    assert await admin_log(sessions) == [
        (ADMIN, "agents", "", True, True),
        (ADMIN, "kb", "stats", True, True),
        (ADMIN, "escalations", "", True, True),
        (ADMIN, "pause", f"<#{SUPPORT}>", True, True),
        (ADMIN, "pause", f"<#{SUPPORT}>", True, False),  # already paused
    ]
    async with sessions() as s:
        recorded = await s.scalar(select(m.AdminAction).order_by(m.AdminAction.id.desc()))
    assert recorded is not None and "already paused" in recorded.result


async def test_close_waits_for_a_running_turn_and_resolves_the_case_it_opened(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.script(slow(1.0, tools(tool_call("escalate_to_human", {"reason": "wants a person"}))))
    said = await emulator.user_says(SUPPORT, "a person please")
    await emulator.wait_for(lambda: fake_llm.requests)  # the turn is running, and about to escalate
    answer = shown(await support(emulator, f"close {link(SUPPORT, said.ts)}"))
    assert "resolved" in answer
    await settle(sessions)
    row = await escalation_row(sessions)
    assert (row.status, row.closed_by, (await conversation(sessions)).mode) == ("resolved", ADMIN, "closed")
    texts = [p.text for p in emulator.posts(SUPPORT, said.ts)]
    assert texts[0].startswith("I've asked a colleague") and texts[-1].startswith("This conversation is now closed")


async def test_reset_of_a_case_with_a_person_resolves_it_and_tells_the_customer(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    thread, case = await escalate(emulator, fake_llm, sessions)
    row = await escalation_row(sessions)
    assert "context cleared" in shown(await support(emulator, f"reset #{row.id}"))
    await settle(sessions)
    assert ((await escalation_row(sessions)).status, (await conversation(sessions)).mode) == ("resolved", "bot")
    assert emulator.posts(SUPPORT, thread)[-1].text.startswith("You're back with our assistant")
    assert "Resolved by <@U_ADMIN>" in json.dumps(emulator.message(STAFF, case.ts).blocks)  # type: ignore[union-attr]


async def test_long_answers_stay_within_block_kit_limits(
    admin_bot: Any, emulator: SlackEmulator, sessions: Sessions
) -> None:
    async with sessions() as s, s.begin():
        for i in range(40):
            conversation_row = m.Conversation(
                key=f"slack:T0001:{SUPPORT}:17000000{i:02d}.000100", active_agent="triage"
            )
            s.add(conversation_row)
            await s.flush()
            reason = "the customer explains at length why nothing works " * 4
            s.add(m.Escalation(conversation_id=conversation_row.id, reason=reason, trigger="agent", agent="triage"))
            s.add(m.Pause(scope=f"slack:%:C{i:08d}:%", label=f"<#C{i:08d}>", paused_by=ADMIN * 5))
    cases = await support(emulator, "escalations")
    text = shown(cases)
    assert "Open escalations: 40" in text and "Showing the oldest 25 of 40" in text
    assert len(cases["blocks"]) > 3  # split over several sections, none cut mid-line
    sections = [b["text"]["text"] for b in cases["blocks"] if b["type"] == "section"]
    assert all(text.endswith("|thread>") for text in sections)  # each ends with a whole case's last line
    status = await support(emulator, "status")
    assert "…" in shown(status)  # the pauses field, clipped
    assert emulator.rejected == []  # the emulator refuses what Slack would, and refused nothing


async def test_status_still_answers_when_the_database_is_down(sessions: Sessions, emulator: SlackEmulator) -> None:
    """`status` against a database nobody listens on: it says so instead of failing (the record of the command
    goes to the working database, as the action log would)."""
    from agents.db.engine import make_engine, make_sessions
    from agents.knowledge.embedders import OpenAIEmbedder
    from agents.knowledge.store import KnowledgeBase
    from bot.admin.actions import AdminActions
    from bot.admin.command import AdminCommands, Invocation, provider_probe
    from bot.admin.queries import AdminQueries
    from bot.slack.app import SlackDirectory, slack_client
    from escalation.desk import CaseDesk
    from escalation.policy import EscalationPolicy
    from harness.sample import default_roster

    dead_engine = make_engine("postgresql+asyncpg://nobody@127.0.0.1:9/nothing")
    dead = AdminQueries(sessions=make_sessions(dead_engine))
    desk = CaseDesk(sessions=sessions, policy=EscalationPolicy(staff_channel=STAFF))
    commands = AdminCommands(
        members=SlackDirectory(slack_client(token="xoxb-test", base_url=emulator.api_url)),
        admin_ids=frozenset({ADMIN}),
        workspace_admins=False,
        queries=dead,
        actions=AdminActions(sessions=sessions, queries=dead, desk=desk, entry_agent="triage"),
        roster=default_roster(),
        knowledge=KnowledgeBase(sessions=dead.sessions, embedder=OpenAIEmbedder(client=None, model="m", dimensions=8)),  # type: ignore[arg-type]
        probe=provider_probe(None, model="m"),
        version="9.9",
    )
    try:
        reply = await commands.run(Invocation(ADMIN, STAFF, "T0001", "driftwing", "status"))
    finally:
        await dead_engine.dispose()
    text = json.dumps(reply.blocks, ensure_ascii=False)
    assert "⚠️ down: " in text and "offline mode" in text and "9.9" in text
    assert "*Knowledge*\\nunknown (" in text
    assert await admin_log(sessions) == [(ADMIN, "status", "", True, False)]


async def test_a_provider_outage_ends_in_an_apology_and_a_colleague_and_shows_in_status_and_stats(
    admin_bot: Any, emulator: SlackEmulator, fake_llm: FakeOpenAI, sessions: Sessions
) -> None:
    fake_llm.rule = lambda request: error(503, "overloaded")  # every chat completion fails
    said = await emulator.user_says(SUPPORT, "what is the warranty on the harrier?")
    first = (await replies_in(emulator, SUPPORT, said.ts, 1))[0]
    assert first.startswith("I'm sorry, I'm having trouble")  # the apology
    await settle(sessions)
    assert await emulator.wait_for(lambda: emulator.posts(STAFF))  # the case reached the staff channel
    async with sessions() as s:
        calls = (await s.execute(select(m.LLMCall.model, m.LLMCall.ok).order_by(m.LLMCall.id))).all()
    assert calls == [("fake-model", False)]  # one failed call, nothing offline standing in
    assert "1 call(s), 1 failed" in shown(await support(emulator, "status"))
    assert "1 call(s), 1 failed" in shown(await support(emulator, "stats"))


async def test_with_llm_outage_offline_the_stand_in_answers_and_it_shows_in_status_and_stats(
    database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    emulator.add_user(ADMIN, "ada", "Ada Admin")
    settings = bot_settings(database_url, fake_llm, emulator, admin_user_ids=ADMIN, llm_outage="offline")
    async with serving(settings, emulator):
        fake_llm.rule = lambda request: error(503, "overloaded")  # every chat completion fails
        said = await emulator.user_says(SUPPORT, "what is the warranty on the harrier?")
        first = (await replies_in(emulator, SUPPORT, said.ts, 1))[0]
        assert not first.startswith("I'm sorry, I'm having trouble")  # the offline stand-in answered, no apology
        await settle(sessions)
        async with sessions() as s:
            calls = (await s.execute(select(m.LLMCall.model, m.LLMCall.ok).order_by(m.LLMCall.id))).all()
        # Each model call: the provider's failure, then the offline answer standing in for it.
        assert calls[0::2] == [("fake-model", False)] * (len(calls) // 2)
        assert calls[1::2] == [("offline", True)] * (len(calls) // 2) and calls
        offline = len(calls) // 2
        status = shown(await support(emulator, "status"))
        assert f"{offline} call(s), {offline} failed; {offline} answered offline" in status
        stats = shown(await support(emulator, "stats"))
        assert f"{offline} call(s), {offline} failed" in stats and f"{offline} answered offline" in stats
