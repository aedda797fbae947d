"""A company's own helpdesk end to end over HTTP: a declaration in another domain than the sample (a bookkeeping
service), its tools on an MCP server over stdio, one over Streamable HTTP and a plain HTTP endpoint; signed Slack
events into the real bot, the fake LLM behind it, a real Postgres under it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from agents.http_tools import verify_request
from agents.knowledge.embedders import OpenAIEmbedder
from agents.knowledge.store import KnowledgeBase
from bot.declaration.build import build
from bot.declaration.parse import DeclarationError, load
from bot.playground.slack_emulator import SlackEmulator
from bot.runtime.startup import ensure_knowledge, ensure_sample_knowledge
from fakes.openai_server import EMBEDDING_DIM, FakeOpenAI, reply, tool_call, tools
from harness.bot import ROOT, bot_settings, free_port, serving
from harness.database import settle
from harness.mcp import http_server, start_http, stdio_command, stop
from harness.slack import replies_in

Sessions = async_sessionmaker[AsyncSession]
SECRET = "tools-secret-for-tests"
CHANNEL = "C_SUPPORT"

DECLARATION = """\
version: 1
brand: {{name: Ledgerline}}
entry: desk
test_customer: {{name: Casey Customer, email: casey@example.com}}
texts:
  escalation_message: "Someone from Ledgerline will join you here."
http:
  signing_secret: "${{LEDGERLINE_SECRET}}"
  allowed_hosts: ["127.0.0.1"]
tools:
  service_status:
    method: GET
    url: http://127.0.0.1:{status_port}/status/{{region}}
    description: Whether Ledgerline is up in a region.
    parameters: {{type: object, properties: {{region: {{type: string}}}}, required: [region]}}
mcpServers:
  books:
    command: {python}
    args: {args}
    env: {{PYTHONPATH: "{root}"}}
    timeout_s: 5
  books_http:
    url: http://127.0.0.1:{mcp_port}/mcp
    timeout_s: 5
agents:
  desk:
    title: the front desk
    description: Greets and routes.
    instructions: You are the front desk of {{brand}}.
    handoffs: [billing]
  billing:
    title: Billing
    description: Subscriptions and invoices.
    instructions: You are Billing at {{brand}}.
    handoffs: [desk]
    tools:
      - mcp:books/get_invoice
      - mcp:books/cancel_subscription
      - mcp:books_http/echo_identity
      - service_status
"""


@pytest.fixture
async def status_endpoint() -> AsyncIterator[tuple[int, list[dict[str, str] | None]]]:
    """The operator's HTTP endpoint: answers only requests whose signature holds, and keeps who asked."""
    seen: list[dict[str, str] | None] = []

    async def status(request: web.Request) -> web.Response:
        claims = verify_request(SECRET, request.method, request.path_qs, await request.read(), request.headers)
        seen.append(claims)
        if claims is None:
            return web.json_response({"error": "bad signature"}, status=401)
        return web.json_response({"region": request.match_info["region"], "status": "up", "for": claims.get("email")})

    app = web.Application()
    app.router.add_get("/status/{region}", status)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield port, seen
    await runner.cleanup()


async def source_up(bot: Any, source: str) -> float | None:
    """`helpdesk_tool_source_up` for `source`, as /metrics shows it to the operator's monitoring."""
    async with aiohttp.ClientSession() as http, http.get(f"{bot.monitoring_url}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("helpdesk_tool_source_up{") and f'source="{source}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


async def until(check: Any, within: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)


def results(fake_llm: FakeOpenAI, request: int) -> dict[str, str]:
    """The tool results the model was shown in one of its requests, by tool name."""
    messages = fake_llm.requests[request].messages
    names = {c["id"]: c["function"]["name"] for msg in messages for c in msg.get("tool_calls") or ()}
    return {names[msg["tool_call_id"]]: msg["content"] for msg in messages if msg["role"] == "tool"}


async def test_a_declared_helpdesk_with_mcp_and_http_tools(
    tmp_path: Path,
    database_url: str,
    sessions: Sessions,
    fake_llm: FakeOpenAI,
    emulator: SlackEmulator,
    status_endpoint: tuple[int, list[dict[str, str] | None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    status_port, seen = status_endpoint
    mcp_port = free_port()
    pid_file = tmp_path / "books.pid"
    python, *args = stdio_command(pid_file)
    path = tmp_path / "helpdesk.yaml"
    path.write_text(
        DECLARATION.format(status_port=status_port, mcp_port=mcp_port, python=python, args=json.dumps(args), root=ROOT)
    )
    monkeypatch.setenv("LEDGERLINE_SECRET", SECRET)
    emulator.add_user("U_CUSTOMER", "casey", "Casey Customer", email="casey@example.com")
    emulator.add_user("U_ADA", "ada", "Ada Park", email="ada@example.com")
    settings = bot_settings(database_url, fake_llm, emulator, helpdesk_file=path)
    async with http_server(mcp_port) as http_processes, serving(settings, emulator) as bot:
        # Routing, and the three kinds of tools called with the asker's identity outside the model's arguments.
        fake_llm.script(
            tools(tool_call("transfer_to_billing")),
            tools(
                tool_call("get_invoice", {"invoice_id": "INV-1002"}),
                tool_call("echo_identity"),
                tool_call("service_status", {"region": "eu/../admin"}),
            ),
            reply("Invoice INV-1002 is due on 2026-07-01."),
        )
        said = await emulator.user_says(CHANNEL, "is my invoice INV-1002 paid?")
        thread = said.ts
        assert await replies_in(emulator, CHANNEL, thread, 2) == [
            "_Connecting you with Billing…_",
            "Invoice INV-1002 is due on 2026-07-01.",
        ]
        assert "You are Billing at Ledgerline." in fake_llm.requests[1].system
        shown = results(fake_llm, 2)
        assert shown["get_invoice"] == "INV-1002: $49.00, due 2026-07-01."
        meta = json.loads(shown["echo_identity"])
        assert len(meta["io.helpdesk/idempotency-key"]) == 64  # the same if the turn is run again after a crash
        asker = meta["io.helpdesk/asker"]
        assert asker["email"] == "casey@example.com" and asker["user"] == "U_CUSTOMER" and asker["platform"] == "slack"
        assert json.loads(shown["service_status"]) == {
            "region": "eu/../admin",
            "status": "up",
            "for": "casey@example.com",
        }
        assert seen[-1] is not None and seen[-1]["user"] == "U_CUSTOMER"

        # Another customer's invoice, asked for by name in the thread: the server answers from the verified asker.
        fake_llm.script(tools(tool_call("get_invoice", {"invoice_id": "INV-2001"})), reply("I can't find that one."))
        await emulator.user_says(CHANNEL, "and Ada's invoice INV-2001? I'm ada@example.com", thread_ts=thread)
        await replies_in(emulator, CHANNEL, thread, 3)
        assert results(fake_llm, 4)["get_invoice"] == "No such invoice on your account."

        # An acting tool: asked first, confirmed only by the asker, in a later message.
        fake_llm.script(tools(tool_call("cancel_subscription", {"reason": "too pricey"})), reply("Shall I cancel?"))
        await emulator.user_says(CHANNEL, "cancel my subscription", thread_ts=thread)
        await replies_in(emulator, CHANNEL, thread, 4)
        assert results(fake_llm, 6)["cancel_subscription"].startswith("Not done yet")
        yes = {"reason": "too pricey", "confirmed": True}
        fake_llm.script(tools(tool_call("cancel_subscription", yes)), reply("Only Casey can confirm that."))
        await emulator.user_says(CHANNEL, "yes, do it", user="U_ADA", thread_ts=thread)
        await replies_in(emulator, CHANNEL, thread, 5)
        assert "has not confirmed" in results(fake_llm, 8)["cancel_subscription"]  # Ada's yes is not Casey's
        fake_llm.script(tools(tool_call("cancel_subscription", yes)), reply("Done: it ends with this period."))
        await emulator.user_says(CHANNEL, "yes please", thread_ts=thread)
        await replies_in(emulator, CHANNEL, thread, 6)
        assert results(fake_llm, 10)["cancel_subscription"].startswith("The Growth plan of Casey's Coffee Cart ends")

        # The HTTP server killed mid-conversation: the model is told, the customer answered, nothing lost.
        await stop(http_processes[0])
        fake_llm.script(tools(tool_call("echo_identity")), reply("Our billing system is down; shall I get a person?"))
        await emulator.user_says(CHANNEL, "who am I to you?", thread_ts=thread)
        assert (await replies_in(emulator, CHANNEL, thread, 7))[-1].startswith("Our billing system is down")
        assert "the books_http system is unavailable right now" in results(fake_llm, 12)["echo_identity"]
        await until(lambda: _is(source_up(bot, "mcp:books_http"), 0.0))
        http_processes.append(await start_http(mcp_port))
        await until(lambda: _is(source_up(bot, "mcp:books_http"), 1.0), within=40)
        fake_llm.script(tools(tool_call("echo_identity")), reply("You are Casey."))
        await emulator.user_says(CHANNEL, "and now?", thread_ts=thread)
        await replies_in(emulator, CHANNEL, thread, 8)
        assert "casey@example.com" in results(fake_llm, 14)["echo_identity"]

        # The stdio server killed: started again by the bot, and its tools work again.
        first = int(pid_file.read_text())
        os.kill(first, signal.SIGKILL)
        await until(lambda: _true(pid_file.exists() and pid_file.read_text().strip() not in ("", str(first))))
        await until(lambda: _is(source_up(bot, "mcp:books"), 1.0))
        fake_llm.script(tools(tool_call("get_invoice", {"invoice_id": "INV-1001"})), reply("INV-1001 is paid."))
        await emulator.user_says(CHANNEL, "and INV-1001?", thread_ts=thread)
        await replies_in(emulator, CHANNEL, thread, 9)
        assert results(fake_llm, 16)["get_invoice"] == "INV-1001: $49.00, paid."
        await settle(sessions)

    # One audit trail: every call, where it ran and whether it worked, tied to the message (and so its author).
    async with sessions() as s:
        runs = (await s.execute(select(m.ToolRun).order_by(m.ToolRun.id))).scalars().all()
        authors = {i.id: (i.identity or {}).get("user") for i in (await s.execute(select(m.Inbound))).scalars().all()}
    trail = [(r.tool, r.source, r.ok, authors[r.inbound_id] if r.inbound_id else None) for r in runs]
    assert ("get_invoice", "mcp:books", True, "U_CUSTOMER") in trail
    assert ("echo_identity", "mcp:books_http", False, "U_CUSTOMER") in trail
    assert ("service_status", "http", True, "U_CUSTOMER") in trail
    assert ("cancel_subscription", "mcp:books", True, "U_ADA") in trail  # answered, not performed
    assert [r.ok for r in runs if r.tool == "transfer_to_billing"] == [True]


async def _is(value: Any, expected: float) -> bool:
    return bool(await value == expected)


async def _true(value: bool) -> bool:
    return value


ALONE = """\
version: 1
brand: {{name: Ledgerline}}
entry: desk
mcpServers:
  books_http: {{url: "http://127.0.0.1:{port}/mcp", timeout_s: 5}}
agents:
  desk:
    title: the front desk
    description: Everything.
    instructions: You are the front desk of {{brand}}.
    tools: ["mcp:books_http"]
"""


async def test_an_mcp_server_down_at_start_is_reported_and_retried_while_the_bot_serves(
    tmp_path: Path, database_url: str, sessions: Sessions, fake_llm: FakeOpenAI, emulator: SlackEmulator
) -> None:
    port = free_port()
    path = tmp_path / "helpdesk.yaml"
    path.write_text(ALONE.format(port=port))
    emulator.add_user("U_CUSTOMER", "casey", "Casey Customer", email="casey@example.com")
    async with serving(bot_settings(database_url, fake_llm, emulator, helpdesk_file=path), emulator) as bot:
        assert await source_up(bot, "mcp:books_http") == 0.0
        fake_llm.script(reply("Hello! How can I help?"))
        said = await emulator.user_says(CHANNEL, "hello")
        assert await replies_in(emulator, CHANNEL, said.ts, 1) == ["Hello! How can I help?"]
        assert "echo_identity" not in fake_llm.requests[0].tool_names
        async with http_server(port):
            await until(lambda: _is(source_up(bot, "mcp:books_http"), 1.0), within=40)
            fake_llm.script(tools(tool_call("echo_identity")), reply("You are Casey."))
            await emulator.user_says(CHANNEL, "who am I?", thread_ts=said.ts)
            await replies_in(emulator, CHANNEL, said.ts, 2)
            assert "echo_identity" in fake_llm.requests[1].tool_names
            assert "casey@example.com" in results(fake_llm, 2)["echo_identity"]
        await settle(sessions)


@pytest.mark.services
async def test_what_a_server_lists_is_checked_at_start(tmp_path: Path) -> None:
    """An agent offered two tools of one name, or an acting tool the server does not list (a misspelling that would
    leave the real one acting without the customer's yes), stops the start once the server answers."""
    port = free_port()
    (tmp_path / "mine.py").write_text('async def echo_identity() -> str:\n    """Mine."""\n    return "mine"\n')
    clash = (
        ALONE.format(port=port)
        .replace("mcpServers:", 'tools:\n  echo_identity: {python: "mine:echo_identity"}\nmcpServers:')
        .replace('tools: ["mcp:books_http"]', 'tools: [echo_identity, "mcp:books_http"]')
    )
    misspelt = ALONE.format(port=port).replace("timeout_s: 5}", "timeout_s: 5, acting: [cancel_subscriptions]}")
    async with http_server(port):
        for text, expected in (
            (clash, "echo_identity of mcp:books_http has the name of a tool from tools:"),
            (misspelt, "mcpServers.books_http.acting[0]: books_http lists no tool 'cancel_subscriptions'"),
        ):
            path = tmp_path / "helpdesk.yaml"
            path.write_text(text)
            helpdesk = build(load(path))
            with pytest.raises(DeclarationError) as raised:
                await helpdesk.start()
            assert len(raised.value.problems) == 1 and expected in raised.value.problems[0], raised.value.problems


def support_from_docs(folder: Path) -> Path:
    """A declaration (`ALONE`'s, without its MCP server) whose support agent answers from `folder/docs`."""
    path = folder / "helpdesk.yaml"
    path.write_text(
        ALONE.format(port=1)
        .replace(
            'mcpServers:\n  books_http: {url: "http://127.0.0.1:1/mcp", timeout_s: 5}\n', "knowledge: {support: docs}\n"
        )
        .replace('tools: ["mcp:books_http"]', "knowledge: [support]")
    )
    return path


async def test_a_declared_collection_holding_other_documents_is_named_at_start(
    tmp_path: Path, sessions: Sessions, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: a company declares `support` from its own folder on a database where the sample's `support`
    was stored. Its agents would quote Driftwing's policies too, so the start says which documents and what to do."""
    client = openai.AsyncOpenAI(api_key="test", base_url=fake_llm.base_url, max_retries=0)
    kb = KnowledgeBase(
        sessions=sessions, embedder=OpenAIEmbedder(client=client, model="fake-embed", dimensions=EMBEDDING_DIM)
    )
    await ensure_sample_knowledge(kb)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "returns.md").write_text("# Returns\n\nReturn anything within 45 days.\n")
    path = support_from_docs(tmp_path)
    caplog.set_level(logging.WARNING)
    await ensure_knowledge(kb, build(load(path)))
    [said] = [r.getMessage() for r in caplog.records if "holds" in r.getMessage()]
    assert "knowledge collection support holds 7 document(s) that are not in" in said
    assert "support/battery-safety.md" in said and "kb delete --collection support" in said
    await kb.close()
    await client.close()


async def test_a_declared_folder_with_no_documents_yet_is_named_and_the_bot_starts(
    tmp_path: Path, sessions: Sessions, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    client = openai.AsyncOpenAI(api_key="test", base_url=fake_llm.base_url, max_retries=0)
    kb = KnowledgeBase(
        sessions=sessions, embedder=OpenAIEmbedder(client=client, model="fake-embed", dimensions=EMBEDDING_DIM)
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "README.md").write_text("# What goes here\n\nOur manuals, once written.\n")
    path = support_from_docs(tmp_path)
    caplog.set_level(logging.WARNING)
    await ensure_knowledge(kb, build(load(path)))  # no refusal: documents may come later
    assert any("collection support: " in r.getMessage() and "no documents" in r.getMessage() for r in caplog.records)
    assert await kb.stats() == []
    await kb.close()
    await client.close()
