"""The operator's tools as admins see them: `/support tools` (the audit trail of tool calls, over signed slash
commands into the real bot), the tool sources in `/support status`, and the tool metrics on /metrics."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.agent import Agent, Roster
from agents.db import models as m
from agents.identity import Author
from agents.knowledge.embedders import OpenAIEmbedder
from agents.knowledge.store import KnowledgeBase
from agents.loop import ToolRecord
from agents.messages import ToolCall
from agents.tools import Tool, ToolContext, schema_tool
from agents.toolsets import SourceStatus, Toolset
from bot.admin import views
from bot.admin.actions import AdminActions
from bot.admin.command import AdminCommands, Invocation, provider_probe
from bot.admin.parse import USAGE, Tools, UsageError, parse
from bot.admin.queries import AdminQueries
from bot.metrics import Metrics
from bot.playground.slack_emulator import SlackEmulator
from bot.slack.app import SlackDirectory, slack_client
from escalation.desk import CaseDesk
from escalation.policy import EscalationPolicy
from fakes.openai_server import FakeOpenAI
from harness.bot import STAFF_CHANNEL, bot_settings, serving
from harness.sample import default_roster

Sessions = async_sessionmaker[AsyncSession]
ADMIN = "U_ADMIN"
HOSTILE = "<!channel> *bold* _it_ `tick` <https://evil.example|driftwing.com> "
SECRET = "4111-1111-1111-1111"
"""In the model's arguments of a call: the audit trail must never show them."""


@pytest.fixture
async def admin_bot(database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator) -> Any:
    """`sessions` first: its tables are emptied before the bot starts using them."""
    emulator.add_user(ADMIN, "ada", "Ada Admin")
    async with serving(bot_settings(database_url, fake_llm, emulator, admin_user_ids=ADMIN), emulator) as bot:
        yield bot


async def support(emulator: SlackEmulator, text: str) -> str:
    """Run `/support <text>` as the admin, signed, through the real app; everything the admin is shown, as one
    string (the answer arrives on the response_url after an empty ack)."""
    before = len(emulator.response_log)
    ack = await emulator.slash_command("/support", text, user=ADMIN, channel=STAFF_CHANNEL)
    assert (ack.status, ack.body) == (200, "")
    answers = await emulator.wait_for(lambda: emulator.response_log[before:])
    assert len(answers) == 1 and answers[0].body["response_type"] == "ephemeral"
    return json.dumps(answers[0].body["blocks"], ensure_ascii=False)


async def tool_history(sessions: Sessions) -> None:
    """Twelve calls in the last day and one three days ago, from three customers: one identified with a hostile
    display name, one stored before identities were (its user id only), and one call with no message at all."""
    now = datetime.now(UTC)
    async with sessions() as s, s.begin():
        conversation = m.Conversation(key="slack:T0001:C_SUPPORT:1700000000.000100", active_agent="triage")
        s.add(conversation)
        await s.flush()

        def inbound(external_id: str, author: str, identity: Author | None) -> m.Inbound:
            return m.Inbound(
                conversation_id=conversation.id,
                external_id=external_id,
                author=author,
                identity=None if identity is None else identity.to_json(),
                text="where is my order?",
                processed_at=now,  # done: the bot's workers leave it alone
                outcome={"kind": "replied"},
            )

        alice = inbound("1", "U_ALICE", Author("slack", "T0001", "U_ALICE", "Alice Liddell", "alice@example.com"))
        mallory = inbound("2", "U_MALLORY", Author("slack", "T0001", "U_MALLORY", "Mallory <!here> *boss*"))
        bob = inbound("3", "U_BOB", None)
        s.add_all([alice, mallory, bob])
        await s.flush()

        def run(tool: str, source: str, asker: m.Inbound | None, ms: float, *, ok: bool = True, **kw: Any) -> m.ToolRun:
            return m.ToolRun(
                conversation_id=conversation.id,
                inbound_id=None if asker is None else asker.id,
                agent=kw.get("agent", "support"),
                call_id=f"call_{tool}_{ms}",
                tool=tool,
                arguments=json.dumps({"card": SECRET}),
                ok=ok,
                output=kw.get("output", "{}"),
                duration_ms=ms,
                source=source,
                created_at=kw.get("at", now),
            )

        s.add(run("old_tool", "python", bob, 5, at=now - timedelta(days=3)))
        s.add_all(run("lookup_order", "python", alice, ms) for ms in (100, 200, 300, 400, 500, 600, 700, 800, 900))
        s.add(run("ship_quote", "http", None, 2500, ok=False, output="HTTP 503 from the endpoint", agent="sales"))
        s.add(run("orders_status", "mcp:orders", bob, 50))
        s.add(run("orders_status", "mcp:orders", mallory, 30_000, ok=False, output=HOSTILE + "x" * 200))


# -- parsing (no Slack, no database) -----------------------------------------------------------------------------


def test_tools_parses_a_period_in_days() -> None:
    assert parse("tools") == Tools(1) and parse("tools 30") == Tools(30) and parse("TOOLS 7") == Tools(7)
    for bad in ("tools 0", "tools 366", "tools week", "tools 1 2"):
        error = parse(bad)
        assert isinstance(error, UsageError) and error.usage == "/support tools [days]", bad
    assert "tools" in USAGE
    assert "`/support tools [days]`" in json.dumps(views.help_reply().blocks)


# -- /support tools over HTTP ----------------------------------------------------------------------------------


async def test_tools_counts_times_and_lists_the_last_calls_with_who_asked(
    admin_bot: Any, emulator: SlackEmulator, sessions: Sessions
) -> None:
    await tool_history(sessions)
    text = await support(emulator, "tools")
    assert "Tool calls: last 1 day" in text
    assert "*12* call(s), 2 failed, 3 tool(s)" in text
    # Per tool and source, the most called first; percentiles interpolated (p95 of 100..900 ms is 860 ms).
    assert "`lookup_order` · python · 9 call(s), 0 failed · p50 500 ms, p95 860 ms" in text
    assert "`orders_status` · mcp:orders · 2 call(s), ⚠️ 1 failed" in text
    assert "`ship_quote` · http · 1 call(s), ⚠️ 1 failed · p50 2.5 s, p95 2.5 s" in text
    assert text.index("`lookup_order`") < text.index("`orders_status`")

    # The last 10 of the 12, the latest first, each with who asked, from the message's verified author.
    assert "*The last 10 call(s)*" in text
    assert text.count(" · asked by ") + text.count(" · asker unknown") == 10
    latest = text.split("*The last 10 call(s)*")[1]
    assert latest.index("`orders_status`") < latest.index("`ship_quote`") < latest.index("`lookup_order`")
    assert "*support* · asked by Alice Liddell `U_ALICE` · ✅ 900 ms" in text
    assert "`ship_quote` · http · *sales* · asker unknown · ⚠️ failed after 2.5 s: `HTTP 503 from the endpoint`" in text
    assert "asked by `U_BOB` · ✅ 50 ms" in text  # no identity stored: the user id the message was stored with
    assert "old_tool" not in text  # three days ago

    # Other people's text stays inert: the asker's name escaped, a failure's output escaped, in a code span (so its
    # *bold* formats nothing), cut at 80 characters; the model's arguments never appear.
    assert "<!" not in text and "|driftwing.com>" not in text
    assert "asked by Mallory &lt;!here&gt; *boss* `U_MALLORY`" in text
    failure = text.split("⚠️ failed after 30.0 s: ")[1].split("\\n")[0]
    assert failure.startswith("`&lt;!channel&gt; *bold* _it_ ˋtickˋ &lt;https://evil.example|driftwing.com&gt; x")
    assert failure.endswith(" " + "x" * (80 - len(HOSTILE)) + "…`")  # the first 80 characters, and a mark
    assert SECRET not in text and "card" not in text
    assert emulator.rejected == []  # Slack would have accepted the blocks

    week = await support(emulator, "tools 7")
    assert "Tool calls: last 7 days" in week and "*13* call(s)" in week and "`old_tool` · python · 1 call(s)" in week
    assert "between 1 and 365" in await support(emulator, "tools 0")
    async with sessions() as s:
        recorded = (await s.execute(select(m.AdminAction.command, m.AdminAction.ok).order_by(m.AdminAction.id))).all()
    assert [tuple(r) for r in recorded] == [("tools", True), ("tools", True), ("tools", False)]


async def test_tools_says_so_when_nothing_was_called(admin_bot: Any, emulator: SlackEmulator) -> None:
    assert "No tool calls in the period." in await support(emulator, "tools")


# -- /support status: one line per tool source ---------------------------------------------------------------------

SINCE = datetime(2025, 3, 1, 12, 3, tzinfo=UTC)
SOURCES = [
    SourceStatus("orders", "mcp", True, "4 tools", 4, SINCE),
    SourceStatus("crm", "mcp", False, "down since 12:03 UTC: connection refused; retrying every 5 s", 2, SINCE),
    SourceStatus("http", "http", False, "connect failed <!channel> *now*", 3, SINCE),
]


def commands(sessions: Sessions, emulator: SlackEmulator, tool_sources: Any) -> AdminCommands:
    """The command class as bot/compose.py wires it, with the tool sources given (the way the wiring will)."""
    queries = AdminQueries(sessions=sessions)
    desk = CaseDesk(sessions=sessions, policy=EscalationPolicy(staff_channel=STAFF_CHANNEL))
    return AdminCommands(
        members=SlackDirectory(slack_client(token="xoxb-test", base_url=emulator.api_url)),
        admin_ids=frozenset({ADMIN}),
        workspace_admins=False,
        queries=queries,
        actions=AdminActions(sessions=sessions, queries=queries, desk=desk, entry_agent="triage"),
        roster=default_roster(),
        knowledge=KnowledgeBase(sessions=sessions, embedder=OpenAIEmbedder(client=None, model="m", dimensions=8)),  # type: ignore[arg-type]
        probe=provider_probe(None, model="m"),
        version="9.9",
        tool_sources=tool_sources,
    )


async def status(sessions: Sessions, emulator: SlackEmulator, tool_sources: Any) -> str:
    reply = await commands(sessions, emulator, tool_sources).run(
        Invocation(ADMIN, STAFF_CHANNEL, "T0001", "x", "status")
    )
    return json.dumps(reply.blocks, ensure_ascii=False)


async def test_status_shows_each_tool_source_up_or_down(sessions: Sessions, emulator: SlackEmulator) -> None:
    text = await status(sessions, emulator, lambda: SOURCES)
    assert "*Tool sources*\\nMCP `orders`: ✅ 4 tools\\n" in text
    # The source's own words say since when and what it does about it; they are not said twice.
    assert "MCP `crm`: ⚠️ down since 12:03 UTC: connection refused; retrying every 5 s\\n" in text
    assert "HTTP `http`: ⚠️ down since 12:03 UTC: connect failed &lt;!channel&gt; *now*" in text
    assert "<!channel>" not in text
    assert "*Database*\\nok" in text  # the rest of status is as it was

    assert "Tool sources" not in await status(sessions, emulator, lambda: ())  # nothing plugged in: no field

    def broken() -> Sequence[SourceStatus]:
        raise RuntimeError("boom")

    assert "*Tool sources*\\n⚠️ unknown (RuntimeError)" in await status(sessions, emulator, broken)


def test_status_shows_the_tool_sources_when_the_database_is_down() -> None:
    reply = views.status_reply(
        "OSError: refused", llm="ok", knowledge="unknown", version="1", uptime_s=5, started=SINCE, sources=SOURCES
    )
    text = json.dumps(reply.blocks, ensure_ascii=False)
    assert "⚠️ down: OSError" in text and "MCP `orders`: ✅ 4 tools" in text and "MCP `crm`: ⚠️ down since" in text


# -- metrics ---------------------------------------------------------------------------------------------------


def record(source: str, ok: bool, ms: float) -> ToolRecord:
    output = "{}" if ok else "unavailable"
    return ToolRecord("support", ToolCall("c1", "lookup", '{"card": "x"}'), ok, output, ms, source=source)


async def test_metrics_count_tool_calls_by_source_and_outcome_and_show_sources_up() -> None:
    metrics = Metrics()
    metrics.tool_call(record("mcp:orders", True, 120))
    metrics.count_tool_calls(
        [record("mcp:orders", False, 3000), record("python", True, 4), record("mcp:orders", True, 80)]
    )
    value = metrics.registry.get_sample_value
    assert value("helpdesk_tool_calls_total", {"source": "mcp:orders", "outcome": "ok"}) == 2
    assert value("helpdesk_tool_calls_total", {"source": "mcp:orders", "outcome": "failed"}) == 1
    assert value("helpdesk_tool_calls_total", {"source": "python", "outcome": "ok"}) == 1
    assert value("helpdesk_tool_call_seconds_count", {"source": "mcp:orders"}) == 3
    assert value("helpdesk_tool_call_seconds_sum", {"source": "mcp:orders"}) == pytest.approx(3.2)
    assert value("helpdesk_tool_call_seconds_bucket", {"source": "mcp:orders", "le": "0.1"}) == 1

    statuses = list(SOURCES)
    asked = 0

    def now() -> list[SourceStatus]:
        nonlocal asked
        asked += 1
        return statuses

    metrics.watch_sources(now)
    assert asked == 0  # registering asks the sources nothing
    text = (await metrics.render()).decode()
    assert 'helpdesk_tool_source_up{kind="mcp",source="mcp:orders"} 1.0' in text
    assert 'helpdesk_tool_source_up{kind="mcp",source="mcp:crm"} 0.0' in text
    assert 'helpdesk_tool_source_up{kind="http",source="http"} 0.0' in text  # labelled as its calls are
    # Read at each scrape: a server that comes back shows at once.
    statuses[1] = SourceStatus("crm", "mcp", True, "2 tools", 2, SINCE)
    assert 'helpdesk_tool_source_up{kind="mcp",source="mcp:crm"} 1.0' in (await metrics.render()).decode()

    def broken() -> list[SourceStatus]:
        raise RuntimeError("boom")

    metrics.watch_sources(broken)  # replaces the first
    text = (await metrics.render()).decode()
    assert "helpdesk_tool_source_up{" not in text and 'helpdesk_tool_calls_total{outcome="ok",source="python"}' in text


def test_agents_lists_each_agents_tools_as_they_are_now_with_where_they_run() -> None:
    async def nothing(ctx: ToolContext, arguments: dict[str, Any]) -> str:
        return ""

    listed = (
        schema_tool(name="get_invoice", description="d", parameters=None, fn=nothing, source="mcp:books"),
        schema_tool(name="refund", description="d", parameters=None, fn=nothing, source="mcp:books", acts=True),
    )

    class Books:
        name = "books"
        version = 1

        def tools(self) -> tuple[Tool, ...]:
            return listed

    roster = Roster.of([Agent("billing", "Billing", "Bills.", "i", toolsets=(Toolset(Books()),))], entry="billing")  # type: ignore[arg-type]
    text = views.agents_reply(roster).text
    assert "`get_invoice` (`mcp:books`)" in text and "`refund` (`mcp:books`) (asks first)" in text
    assert "escalate_to_human`," not in text
