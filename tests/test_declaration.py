"""The operator's declaration: read, checked with errors that name the file, the line, the place and the fix, built
into the roster, tools and texts that run, and the starter `bot init` writes."""

from __future__ import annotations

import asyncio
import json
import logging
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agents.confirm import PENDING, WINDOW, confirming
from agents.identity import Author
from agents.tools import Tool, ToolContext, function_tool, schema_tool
from bot.cli import main
from bot.declaration.build import SAMPLE, build, declared, find, with_declaration
from bot.declaration.parse import DeclarationError, load
from bot.declaration.scaffold import files
from bot.settings import Settings

GOOD = """\
version: 1
brand: {name: Lumen Energy}
entry: desk
instructions: "Be brief. Writer: {writer}."
texts:
  escalation_message: "A Lumen colleague will be with you."
  handoff_notice: "_Passing you to {agent}_"
knowledge:
  tariffs: docs/tariffs
tools:
  meter_reading: {python: "lumen_tools:meter_reading", acts: true}
agents:
  desk:
    title: the front desk
    description: Greets and routes.
    instructions: "You are the front desk of {brand}. Known name: {customer_name}."
    handoffs: [billing]
    tools: [record_customer_name]
  billing:
    title: Billing
    description: Bills, tariffs and meter readings.
    instructions: "You are Billing at {brand}. Plan: {context[plan]}."
    handoffs: [desk]
    tools: [meter_reading]
    knowledge: [tariffs]
    prefetch:
      - {pattern: '(?i)\\bMR-\\d{3}\\b', tool: meter_reading, argument: reading, upper: true}
"""

TOOLS = '''\
from agents.tools import ToolContext


async def meter_reading(ctx: ToolContext, reading: str) -> str:
    """Submit a meter reading for the asker's account."""
    return f"recorded {reading} for {ctx.asker.email if ctx.asker else None}"
'''


def write(tmp_path: Path, text: str, *, tools: str | None = TOOLS) -> Path:
    path = tmp_path / "helpdesk.yaml"
    path.write_text(text, encoding="utf-8")
    (tmp_path / "docs" / "tariffs").mkdir(parents=True, exist_ok=True)
    if tools is not None:
        (tmp_path / "lumen_tools.py").write_text(tools, encoding="utf-8")
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(DeclarationError) as raised:
        build(load(write(tmp_path, text)))
    return list(raised.value.problems)


def test_a_good_declaration_builds_the_agents_it_names(tmp_path: Path) -> None:
    helpdesk = build(load(write(tmp_path, GOOD)))
    roster = helpdesk.roster()
    assert roster.entry == "desk" and list(roster.agents) == ["desk", "billing"]
    billing = roster["billing"]
    assert [t.name for t in roster.tools_of("billing")] == ["meter_reading", "transfer_to_desk", "escalate_to_human"]
    # Declared as acting: the model is shown the confirmation argument.
    meter = roster.tools_of("billing")[0]
    assert meter.acts and "confirmed" in meter.parameters["properties"]
    rendered = billing.render_instructions({"plan": "Green 12", "writer": "Ana"})
    assert rendered.startswith("You are Billing at Lumen Energy. Plan: Green 12.") and "Writer: Ana." in rendered
    # A value nobody stored leaves its placeholder empty, never a KeyError in a turn.
    assert roster["desk"].render_instructions({}).startswith("You are the front desk of Lumen Energy. Known name: .")
    assert billing.prefetch is not None
    assert [p.arguments for p in billing.prefetch("my reading mr-123 and MR-123")] == [{"reading": "MR-123"}]
    assert [c.name for c in helpdesk.collections] == ["tariffs"]
    assert helpdesk.collections[0].folder == tmp_path / "docs" / "tariffs"


def test_texts_and_brand_apply_where_the_environment_set_none(tmp_path: Path) -> None:
    declaration = load(write(tmp_path, GOOD))
    settings = with_declaration(Settings(_env_file=None), declaration)  # type: ignore[call-arg]
    assert settings.escalation_message == "A Lumen colleague will be with you."
    assert settings.handoff_notice == "_Passing you to {agent}_"
    assert settings.staff_name_suffix == " (Lumen Energy team)"
    assert settings.teams_bot_name == "Lumen Energy Helpdesk"
    chosen = Settings(_env_file=None, escalation_message="From the environment", staff_name_suffix="")  # type: ignore[call-arg]
    settings = with_declaration(chosen, declaration)
    assert settings.escalation_message == "From the environment" and settings.staff_name_suffix == ""


def test_the_file_is_found_by_setting_then_beside_then_the_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert find(Settings(_env_file=None)) == SAMPLE  # type: ignore[call-arg]
    write(tmp_path, GOOD)
    assert find(Settings(_env_file=None)) == Path("helpdesk.yaml")  # type: ignore[call-arg]
    other = tmp_path / "elsewhere.yaml"
    assert find(Settings(_env_file=None, helpdesk_file=other)) == other  # type: ignore[call-arg]
    with pytest.raises(DeclarationError, match="no such file; write a starter with `python -m bot init`"):
        declared(Settings(_env_file=None, helpdesk_file=other))  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("handoffs: [desk]", "handoffs: [desk, biling]"),
            "helpdesk.yaml:23:22: agents.billing.handoffs[1]: unknown agent 'biling' (did you mean 'billing'?); "
            "the agents are: billing, desk",
        ),
        (
            ("tools: [meter_reading]", "tools: [meter_readings]"),
            "helpdesk.yaml:24:13: agents.billing.tools[0]: unknown tool 'meter_readings' (did you mean "
            "'meter_reading'?); declare it under tools: (python: or url:)",
        ),
        (
            ("Plan: {context[plan]}.", "Plan: {plan}."),
            "agents.billing.instructions: unknown placeholder {plan}; it may use {brand}, {context}, "
            "{customer_name}, {writer}",
        ),
        (
            ('handoff_notice: "_Passing you to {agent}_"', 'handoff_notice: "_Passing you to {agnet}_"'),
            "texts.handoff_notice: unknown placeholder {agnet}; it may use {agent}",
        ),
        (("entry: desk", "entry: front"), "helpdesk.yaml:3:8: entry: unknown agent 'front'"),
        (("    title: Billing", "    titel: Billing"), "agents.billing.titel: unknown key (did you mean 'title'?)"),
        (
            ("tools: [meter_reading]", "tools: [mcp:orders]"),
            "agents.billing.tools[0]: unknown MCP server 'orders'; the servers under mcpServers: none is declared",
        ),
        (
            ("knowledge: [tariffs]", "knowledge: [tarifs]"),
            "agents.billing.knowledge[0]: unknown collection 'tarifs' (did you mean 'tariffs'?)",
        ),
        (
            ("upper: true}", "upper: true, tool: meter}"),
            "helpdesk.yaml:27:92: agents.billing.prefetch[0].tool: written twice",
        ),
        (("handoffs: [desk]", "handoffs: [desk"), "not valid YAML"),
        (("title: Billing", "title: &t Billing\n    model: *t"), "helpdesk.yaml:21:12: aliases (*t) are not read"),
        (("Plan: {context[plan]}.", "Plan: {context[plan]:d}."), "{context[plan]:d} is not a plain placeholder"),
        (("Known name: {customer_name}.", "Known name: {customer_name!r}."), "{customer_name!r} is not a plain"),
        (("tools: [meter_reading]", "tools: [meter_reading, mcp:books/]"), "write mcp:books for all of"),
        (("will be with you.", "will call you on ${PHONE}."), "texts.escalation_message: ${...} is read from the"),
        (
            ('{python: "lumen_tools:meter_reading", acts: true}', '{url: "https://api.lumen.example/r", method: GET}'),
            "tools: HTTP tools tell your endpoints who is asking in signed headers: set http.signing_secret",
        ),
        (("tariffs: docs/tariffs", "tariffs: docs/tarifs"), "helpdesk.yaml:9:12: knowledge.tariffs:"),
    ],
)
def test_each_bad_declaration_stops_the_start_with_one_clear_error(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    assert change[0] in GOOD
    found = problems(tmp_path, GOOD.replace(change[0], change[1], 1))
    assert len(found) == 1 and expected in found[0], found
    assert found[0].startswith(str(tmp_path / "helpdesk.yaml"))


def test_malformed_tool_sources_are_located_too(tmp_path: Path) -> None:
    servers = GOOD + textwrap.dedent(
        """\
        mcpServers:
          orders: {command: python, url: "http://127.0.0.1:9/mcp"}
        """
    )
    [found] = problems(tmp_path, servers)
    assert "helpdesk.yaml:29:3: mcpServers.orders" in found and "command" in found and "url" in found
    [found] = problems(tmp_path, GOOD.replace('"lumen_tools:meter_reading"', '"lumen_tools:nothing_here"'))
    assert "tools.meter_reading.python: lumen_tools has no 'nothing_here'" in found
    [found] = problems(tmp_path, GOOD.replace('"lumen_tools:meter_reading"', '"lumen tools"'))
    assert 'tools.meter_reading.python: write "module:function"' in found
    http = (
        GOOD.replace(
            '{python: "lumen_tools:meter_reading", acts: true}',
            '{url: "https://api.lumen.example/readings/{meter}", method: FETCH}',
        )
        + "http: {signing_secret: s3cret}\n"
    )
    [found] = problems(tmp_path, http)
    assert "tools.meter_reading.method" in found and "FETCH" in found
    secret = GOOD + 'http: {signing_secret: "${LUMEN_SECRET_FOR_TESTS}"}\n'
    [found] = problems(tmp_path, secret)
    assert "http.signing_secret: ${LUMEN_SECRET_FOR_TESTS} is not set" in found


def test_the_sample_declares_the_driftwing_shop_and_its_knowledge() -> None:
    helpdesk = build(load(SAMPLE))
    assert helpdesk.sample and helpdesk.declaration.spec.brand.name == "Driftwing Drones"
    assert {c.name for c in helpdesk.collections} == {"catalogue", "support"}
    assert all(c.folder.is_dir() for c in helpdesk.collections)


def test_no_driftwing_in_a_declared_helpdesk(tmp_path: Path) -> None:
    """Once an operator gives a file, nothing of the sample runs: not its agents, tools, knowledge or texts."""
    settings, declaration = declared(Settings(_env_file=None, helpdesk_file=write(tmp_path, GOOD)))  # type: ignore[call-arg]
    helpdesk = build(declaration)
    words = " ".join(
        [
            *(a.render_instructions({}) for a in helpdesk.roster().agents.values()),
            *(
                str(getattr(settings, name))
                for name in Settings.model_fields
                if name.endswith(("_message", "_greeting"))
            ),
            str(settings.staff_name_suffix),
            settings.teams_bot_name,
            *(c.name for c in helpdesk.collections),
        ]
    )
    assert "driftwing" not in words.lower() and "drone" not in words.lower()


ANA, BOB = Author("slack", "T1", "U_ANA", "Ana", "ana@x.test"), Author("slack", "T1", "U_BOB", "Bob", None)


def cancel_plan(done: list[str]) -> Tool:
    """An acting tool behind its confirmation, noting each plan it cancels in `done`."""

    @function_tool(acts=True)
    async def cancel(ctx: ToolContext, plan: str) -> str:
        """Cancel the asker's plan."""
        done.append(plan)
        return f"cancelled {plan}"

    tool: Tool = confirming(cancel)
    return tool


async def test_an_acting_tool_waits_for_the_askers_yes_in_a_later_message() -> None:
    done: list[str] = []
    tool, ana, bob = cancel_plan(done), ANA, BOB
    state: dict[str, object] = {}

    def ctx(inbound: int, asker: Author | None) -> ToolContext:
        return ToolContext(1, inbound, "billing", state, asker=asker)

    asked = await tool.invoke(ctx(1, ana), '{"plan": "green"}')
    assert isinstance(asked, str) and asked.startswith("Not done yet") and not done
    # The model cannot confirm in the same message it asked in.
    again = await tool.invoke(ctx(1, ana), '{"plan": "green", "confirmed": true}')
    assert isinstance(again, str) and "has not confirmed" in again and not done
    # A bystander's yes is a question of their own: it confirms nothing of Ana's.
    assert "has not confirmed" in str(await tool.invoke(ctx(2, bob), '{"plan": "green", "confirmed": true}'))
    assert not done
    # Ana's yes runs what she was asked about: the model's arguments on the yes do not change the action.
    assert await tool.invoke(ctx(3, ana), '{"plan": "blue", "confirmed": true}') == "cancelled green"
    # Once: the same yes again in that message does nothing, and later it is a new question.
    assert "Already done" in str(await tool.invoke(ctx(3, ana), '{"plan": "green", "confirmed": true}'))
    assert "Already done" in str(await tool.invoke(ctx(3, ana), '{"plan": "green"}'))
    assert "Not done" in str(await tool.invoke(ctx(4, ana), '{"plan": "green", "confirmed": true}'))
    assert done == ["green"] and PENDING in state
    # A question left unanswered past its window is asked again, never acted on.
    await tool.invoke(ctx(6, ana), '{"plan": "red"}')
    for question in state[PENDING].values():  # type: ignore[attr-defined]
        question["asked_at"] = (datetime.now(UTC) - WINDOW - timedelta(seconds=1)).isoformat()
    assert "Not done" in str(await tool.invoke(ctx(7, ana), '{"plan": "red", "confirmed": true}'))
    assert done == ["green"]
    # Nobody verified: nothing acts.
    assert "nobody verified" in str(await tool.invoke(ctx(5, None), '{"plan": "green", "confirmed": true}'))


def test_init_writes_a_starter_that_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", str(tmp_path), "--name", "Northwind Bikes"]) == 0
    assert set(files("x")) <= {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    declaration = load(tmp_path / "helpdesk.yaml")
    assert declaration.spec.brand.name == "Northwind Bikes"
    helpdesk = build(declaration)
    assert [t.name for t in helpdesk.roster().tools_of("support")][:1] == ["order_status"]
    # Never over an operator's files.
    assert main(["init", str(tmp_path)]) == 1
    assert "already exist" in capsys.readouterr().out


def test_check_reports_a_bad_file_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, GOOD.replace("entry: desk", "entry: nobody"))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "nothing was started" in err and f"{path}:3:8: entry: unknown agent 'nobody'" in err
    assert main(["check", str(write(tmp_path, GOOD))]) == 0
    out = capsys.readouterr().out
    assert "Lumen Energy, 2 agents, entry desk" in out and "meter_reading" in out


OPENAPI = """\
openapi: 3.0.3
info: {title: Lumen meters, version: "1"}
servers: [{url: "https://api.lumen.example/v1"}]
paths:
  /meters/{meter}:
    get:
      operationId: getMeter
      summary: One meter of the asker's account.
      parameters: [{name: meter, in: path, required: true, schema: {type: string}}]
  /meters/{meter}/close:
    post:
      operationId: closeMeter
      summary: Close a meter.
      parameters: [{name: meter, in: path, required: true, schema: {type: string}}]
"""


def test_operations_picked_from_an_openapi_document_are_http_tools(tmp_path: Path) -> None:
    (tmp_path / "meters.yaml").write_text(OPENAPI)
    text = GOOD.replace("    tools: [meter_reading]", "    tools: [meter_reading, getMeter, closeMeter]").replace(
        "agents:\n",
        "http: {unsigned: true}\n"
        "openapi:\n  - {document: meters.yaml, operations: [getMeter, closeMeter], acting: [closeMeter]}\nagents:\n",
        1,
    )
    tools = {t.name: t for t in build(load(write(tmp_path, text))).roster().tools_of("billing")}
    assert tools["getMeter"].source == "http" and not tools["getMeter"].acts
    assert tools["closeMeter"].acts and "confirmed" in tools["closeMeter"].parameters["properties"]
    [found] = problems(
        tmp_path, text.replace("operations: [getMeter, closeMeter]", "operations: [getMeter, closeMeter, getMeters]")
    )
    assert "openapi[0]" in found and "getMeters" in found


async def test_a_tools_own_confirmed_argument_does_not_skip_the_askers_yes() -> None:
    """An operator's refund endpoint that takes `confirmed` itself gets it true only after the asker said yes."""
    calls: list[dict[str, object]] = []

    async def refund(ctx: ToolContext, arguments: dict[str, object]) -> str:
        calls.append(arguments)
        return "refunded"

    schema = {
        "type": "object",
        "properties": {"invoice": {"type": "string"}, "confirmed": {"type": "boolean"}},
        "required": ["invoice", "confirmed"],
    }
    tool = confirming(
        schema_tool(name="refund", description="Refund.", parameters=schema, fn=refund, source="http", acts=True)
    )
    ana = Author("slack", "T1", "U_ANA", "Ana", "ana@x.test")
    state: dict[str, object] = {}
    first = await tool.invoke(ToolContext(1, 1, "billing", state, asker=ana), '{"invoice": "I-1", "confirmed": true}')
    assert "Not done" in str(first) and calls == []
    done = await tool.invoke(ToolContext(1, 2, "billing", state, asker=ana), '{"invoice": "I-1", "confirmed": true}')
    assert done == "refunded" and calls == [{"invoice": "I-1", "confirmed": True}]


def test_a_prefetch_pattern_that_backtracks_without_end_plans_nothing_instead_of_stalling(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = GOOD.replace("pattern: '(?i)\\bMR-\\d{3}\\b'", "pattern: '(a|aa)+b'")
    billing = build(load(write(tmp_path, text))).roster()["billing"]
    assert billing.prefetch is not None
    # Without its time limit this search would run for hours; with it, nothing is planned and the reason is logged.
    with caplog.at_level(logging.WARNING, logger="bot.declaration.build"):
        assert billing.prefetch("a" * 60) == []
    assert "took too long on a message" in caplog.text


async def test_a_questions_askers_yes_survives_a_repeated_ask_and_a_bystander_cannot_take_it() -> None:
    done: list[str] = []
    tool, ana, bob = cancel_plan(done), ANA, BOB
    state: dict[str, object] = {}

    def ctx(inbound: int, asker: Author) -> ToolContext:
        return ToolContext(1, inbound, "billing", state, asker=asker)

    await tool.invoke(ctx(1, ana), '{"plan": "green"}')
    # A bystander asking for the same action has a question of their own; Ana's stands.
    assert "Not done yet" in str(await tool.invoke(ctx(2, bob), '{"plan": "green"}'))
    # Ana's yes: the model (or a look-up) calls again unconfirmed first, then confirmed, in that same message.
    assert "Not done" in str(await tool.invoke(ctx(3, ana), '{"plan": "green"}'))
    assert await tool.invoke(ctx(3, ana), '{"plan": "green", "confirmed": true}') == "cancelled green"
    assert done == ["green"]


async def test_a_confirmed_action_runs_once_and_a_retry_keeps_its_key() -> None:
    keys: list[str | None] = []
    fail = [True]

    @function_tool(acts=True)
    async def refund(ctx: ToolContext, invoice: str, amount: float) -> str:
        """Refund an invoice."""
        keys.append(ctx.idempotency_key)
        await asyncio.sleep(0)  # a real call awaits: a second call in the same answer runs meanwhile
        if fail[0]:
            fail[0] = False
            raise TimeoutError("no answer")
        return f"refunded {invoice} {amount}"

    tool = confirming(refund)
    ana = Author("slack", "T1", "U_ANA", "Ana", "ana@x.test")
    state: dict[str, object] = {}

    def ctx(inbound: int) -> ToolContext:
        return ToolContext(7, inbound, "billing", state, asker=ana)

    await tool.invoke(ctx(1), '{"invoice": "I-1", "amount": 10}')
    # The yes fails (the system timed out, maybe after acting): the question stands for a retry with the same key.
    with pytest.raises(TimeoutError):
        await tool.invoke(ctx(2), '{"invoice": "I-1", "amount": 10.0, "confirmed": true}')
    # Two confirmed calls in one answer: one runs.
    both = await asyncio.gather(
        tool.invoke(ctx(3), '{"invoice": "I-1", "amount": 10, "confirmed": true}'),
        tool.invoke(ctx(3), '{"invoice": "I-1", "amount": 10, "confirmed": true}'),
    )
    assert sorted(str(b)[:8] for b in both) == ["Already ", "refunded"]
    assert len(keys) == 2 and keys[0] == keys[1] is not None


async def test_stored_questions_that_cannot_be_read_are_asked_again_and_kept_few() -> None:
    @function_tool(acts=True)
    async def close(ctx: ToolContext, account: str) -> str:
        """Close an account."""
        return "closed"

    tool = confirming(close)
    ana = Author("slack", "T1", "U_ANA", "Ana", "ana@x.test")
    for damaged in ("zz", {"x": {"tool": "t", "asker": "a", "asked_at": "2026-01-01T00:00:00", "arguments": {}}}):
        state: dict[str, object] = {PENDING: damaged}
        assert "Not done yet" in str(await tool.invoke(ToolContext(1, 1, "a", state, asker=ana), '{"account": "A"}'))
    for n in range(30):
        await tool.invoke(ToolContext(1, n, "a", state, asker=ana), json.dumps({"account": f"A{n}"}))
    assert len(state[PENDING]) == 20  # type: ignore[arg-type]
