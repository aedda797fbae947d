"""Operators' MCP servers as tool sources: the SDK's real client against the Tallyhouse fake (`fakes.mcp_server`), over
stdio and Streamable HTTP, as child processes the tests start, kill and start again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp.client.stdio import PROCESS_TERMINATION_TIMEOUT

from agents.errors import ConfigError, ToolUnavailable
from agents.identity import Author, asker_claims
from agents.mcp_servers import ASKER_META, RESULT_CHARS, MCPServer, MCPServerConfig, parse_mcp_servers, result_text
from agents.tools import ToolArgumentsError, ToolContext
from bot.playground.waiting import poll
from fakes.mcp_server import NO_SUCH_INVOICE
from harness.bot import free_port
from harness.mcp import start_http

SERVICE_FIXTURES = frozenset({"tallyhouse", "processes"})  # servers, as processes (tests/conftest.py)
ROOT = Path(__file__).resolve().parent.parent
CASEY = Author("slack", "T1", "U1", "Casey", "casey@example.com")
ADA = Author("slack", "T1", "U2", "Ada", "ada@example.com")
TOOLS = {"get_subscription", "get_invoice", "cancel_subscription", "echo_identity", "slow", "open_beta"}


def context(asker: Author | None = CASEY) -> ToolContext:
    return ToolContext(conversation_id=1, inbound_id=1, agent="billing", state={}, asker=asker)


async def call(
    server: MCPServer, name: str, arguments: dict[str, Any] | None = None, asker: Author | None = CASEY
) -> str:
    tool = next(t for t in server.tools() if t.name == name)
    result = await tool.invoke(context(asker), json.dumps(arguments or {}))
    assert isinstance(result, str)
    return result


def stdio_config(pid_file: Path, **options: Any) -> MCPServerConfig:
    args = ("-m", "fakes.mcp_server", "--transport", "stdio", "--pid-file", str(pid_file))
    return MCPServerConfig("tallyhouse", command=sys.executable, args=args, cwd=str(ROOT), **options)


def http_config(port: int, **options: Any) -> MCPServerConfig:
    return MCPServerConfig("tallyhouse", url=f"http://127.0.0.1:{port}/mcp", **options)


def pid_of(pid_file: Path) -> int | None:
    text = pid_file.read_text() if pid_file.exists() else ""
    return int(text) if text.strip() else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child that nobody reaped yet is a zombie: gone for every purpose here.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return True


class Processes:
    """The fake servers a test started (HTTP ones directly, stdio ones through the bot's supervisor, known by their
    pid files): killed at the end whatever happened, and reported if any outlived the bot's close()."""

    def __init__(self) -> None:
        self.http: list[asyncio.subprocess.Process] = []
        self.pids: set[int] = set()

    async def serve_http(self, port: int) -> asyncio.subprocess.Process:
        process = await start_http(port)
        self.http.append(process)
        return process

    def remember(self, pid_file: Path) -> int:
        pid = int(pid_file.read_text())
        self.pids.add(pid)
        return pid

    async def finish(self) -> list[int]:
        for process in self.http:
            if process.returncode is None:
                process.kill()
            await process.wait()
        survivors = [pid for pid in self.pids if alive(pid)]
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        return survivors


@pytest.fixture
async def processes() -> AsyncIterator[Processes]:
    started = Processes()
    yield started
    assert await started.finish() == [], "stdio servers outlived the bot's close()"


@pytest.fixture(scope="module", params=["stdio", "http"])
async def tallyhouse(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[MCPServer]:
    """One connected server per transport, shared by the tests that do not break it."""
    started = Processes()
    options: dict[str, Any] = {"timeout_s": 1.0, "max_concurrency": 2}
    if request.param == "stdio":
        pid_file = tmp_path_factory.mktemp("stdio") / "pid"
        config = stdio_config(pid_file, **options)
    else:
        port = free_port()
        await started.serve_http(port)
        config = http_config(port, **options)
    server = MCPServer(config, acting=frozenset({"open_beta"}))
    await server.start()
    if request.param == "stdio":
        started.remember(pid_file)
    yield server
    await server.close()
    assert await started.finish() == []


async def test_lists_the_tools_and_marks_those_that_act(tallyhouse: MCPServer) -> None:
    status = tallyhouse.status()
    assert status.up and status.kind == "mcp" and status.tools == len(TOOLS)
    # The server's "reports.export" is a name providers refuse: left out, said in the status and the log.
    assert status.detail == "6 tools (1 skipped, see the log)"
    tools = {t.name: t for t in tallyhouse.tools()}
    assert set(tools) == TOOLS
    assert {t.source for t in tools.values()} == {"mcp:tallyhouse"}
    assert tallyhouse.version >= 1
    # destructiveHint from the server, or the operator's own list.
    assert {name for name, t in tools.items() if t.acts} == {"cancel_subscription", "open_beta"}
    invoice = tools["get_invoice"].schema()["function"]
    assert invoice["parameters"] == {
        "type": "object",
        "properties": {"invoice_id": {"type": "string", "description": "The invoice number, like INV-1001"}},
        "required": ["invoice_id"],
    }


async def test_the_asker_travels_in_meta_never_in_the_arguments(tallyhouse: MCPServer) -> None:
    seen = json.loads(await call(tallyhouse, "echo_identity"))
    assert seen[ASKER_META] == asker_claims(CASEY)
    echo = next(t for t in tallyhouse.tools() if t.name == "echo_identity")
    assert echo.parameters["properties"] == {}
    # The same (empty) arguments answer for whoever the platform vouched for.
    assert "Casey's Coffee Cart" in await call(tallyhouse, "get_subscription")
    assert "Ada's Analytics" in await call(tallyhouse, "get_subscription", asker=ADA)


async def test_an_invoice_of_another_account_is_refused(tallyhouse: MCPServer) -> None:
    assert await call(tallyhouse, "get_invoice", {"invoice_id": "INV-1002"}) == "INV-1002: $49.00, due 2026-07-01."
    assert await call(tallyhouse, "get_invoice", {"invoice_id": "INV-2001"}) == NO_SUCH_INVOICE
    # An email in the arguments (the model repeating someone in the thread) changes nothing.
    impersonating = {"invoice_id": "INV-2001", "email": "ada@example.com"}
    assert await call(tallyhouse, "get_invoice", impersonating) == NO_SUCH_INVOICE
    assert await call(tallyhouse, "get_invoice", {"invoice_id": "INV-2001"}, asker=ADA) == "INV-2001: $19.00, paid."


async def test_a_servers_error_answer_is_read_by_the_model(tallyhouse: MCPServer) -> None:
    answer = await call(tallyhouse, "get_subscription", asker=None)
    assert answer.startswith("Error from tallyhouse: ")
    assert "did not say who is asking" in answer


async def test_bad_arguments_go_back_to_the_model(tallyhouse: MCPServer) -> None:
    with pytest.raises(ToolArgumentsError, match="invoice_id"):
        await call(tallyhouse, "get_invoice", {})
    # The server's pattern, which the model is not shown, is still checked before the call.
    with pytest.raises(ToolArgumentsError, match="does not match"):
        await call(tallyhouse, "get_invoice", {"invoice_id": "1002"})


async def test_a_call_that_takes_too_long_says_the_system_is_unavailable(tallyhouse: MCPServer) -> None:
    started = time.monotonic()
    with pytest.raises(ToolUnavailable, match=r"tallyhouse system is unavailable right now \(no answer within 1 s\)"):
        await call(tallyhouse, "slow", {"seconds": 8})
    assert time.monotonic() - started < 8
    assert await call(tallyhouse, "slow", {"seconds": 0}) == "slept 0 s"


async def test_calls_in_flight_are_bounded_per_server(tallyhouse: MCPServer) -> None:
    async def calls(n: int) -> float:
        started = time.monotonic()
        answers = await asyncio.gather(*(call(tallyhouse, "slow", {"seconds": 0.3}) for _ in range(n)))
        assert answers == ["slept 0.3 s"] * n
        return time.monotonic() - started

    one, two, four = await calls(1), await calls(2), await calls(4)
    assert two < 1.5 * one, "two calls run side by side (max_concurrency=2)"
    assert four > 1.6 * two, "four calls take two rounds"


async def test_a_killed_stdio_server_is_started_again(processes: Processes, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    server = MCPServer(stdio_config(pid_file, timeout_s=10.0))
    await server.start()
    try:
        first = processes.remember(pid_file)
        assert "Casey's Coffee Cart" in await call(server, "get_subscription")

        # A tool-list change while connected is seen, and the version moves.
        listed = server.version
        await call(server, "open_beta")
        await poll(lambda: "list_invoices" in {t.name for t in server.tools()}, 10, lambda: str(server.status()))
        assert server.version > listed
        assert await call(server, "list_invoices") == "INV-1001: $49.00, paid\nINV-1002: $49.00, due 2026-07-01"

        os.kill(first, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(ToolUnavailable, match=r"tallyhouse system is unavailable right now .*offer a colleague"):
            await call(server, "get_subscription")
        assert time.monotonic() - started < 5, "said at once, not after the call's timeout"
        # Arguments are still checked first: the model hears what to fix, not that the system is down.
        with pytest.raises(ToolArgumentsError):
            await call(server, "get_invoice", {})

        changed = server.version
        await poll(lambda: server.status().up and pid_of(pid_file) != first, 15, lambda: str(server.status()))
        processes.remember(pid_file)
        assert not alive(first)
        assert "Casey's Coffee Cart" in await call(server, "get_subscription")
        # Listed again on reconnecting: the new process has no beta open.
        assert "list_invoices" not in {t.name for t in server.tools()}
        assert server.version > changed
    finally:
        started = time.monotonic()
        await server.close()
    # The server exited when its stdin closed, before the SDK's grace period would have had it killed.
    assert time.monotonic() - started < PROCESS_TERMINATION_TIMEOUT
    assert not alive(processes.remember(pid_file)), "close() stops the server process"
    assert server.status().detail == f"down since {server.status().since:%H:%M} UTC: closed"


async def test_a_killed_http_server_is_reached_again_when_it_is_back(processes: Processes) -> None:
    port = free_port()
    process = await processes.serve_http(port)
    server = MCPServer(http_config(port, timeout_s=10.0))
    await server.start()
    try:
        assert "Casey's Coffee Cart" in await call(server, "get_subscription")
        process.kill()
        await process.wait()
        started = time.monotonic()
        with pytest.raises(ToolUnavailable, match="tallyhouse system is unavailable right now"):
            await call(server, "get_subscription")
        assert time.monotonic() - started < 5, "said at once, not after the call's timeout"
        # Down, and (once the connection that ended is taken down, a moment later) saying why and what it does.
        await poll(lambda: "retrying every" in server.status().detail, 10, lambda: str(server.status()))
        assert not server.status().up

        await processes.serve_http(port)
        await poll(lambda: server.status().up, 15, lambda: str(server.status()))
        assert "Casey's Coffee Cart" in await call(server, "get_subscription")
        assert server.status().detail.startswith("6 tools")
    finally:
        await server.close()


async def test_a_server_unreachable_at_start_does_not_hold_the_bot(
    processes: Processes, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    server = MCPServer(http_config(port))
    with caplog.at_level(logging.WARNING, logger="agents.mcp_servers"):
        await server.start()
    try:
        status = server.status()
        assert not status.up and status.tools == 0 and server.tools() == ()
        assert "connection refused; retrying every" in status.detail
        assert "MCP server tallyhouse is down (connection refused)" in caplog.text

        await processes.serve_http(port)
        await poll(lambda: server.status().up, 15, lambda: str(server.status()))
        assert {t.name for t in server.tools()} == TOOLS
        assert "Casey's Coffee Cart" in await call(server, "get_subscription")
    finally:
        await server.close()


@pytest.mark.services
async def test_a_server_that_never_answers_is_given_up_on_after_the_connect_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the bot gives up and hangs up
        writer.close()

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server = MCPServer(http_config(port, connect_timeout_s=0.3))
    try:
        await server.start()
        assert "no answer within 0.3 s" in server.status().detail
    finally:
        await server.close()
        listener.close()
        await listener.wait_closed()


@pytest.mark.services
async def test_a_command_that_cannot_start_is_reported() -> None:
    server = MCPServer(MCPServerConfig("ledger", command="/nonexistent/ledger-mcp"))
    try:
        await server.start()
        status = server.status()
        assert not status.up
        assert "cannot start the server: /nonexistent/ledger-mcp: No such file or directory" in status.detail
    finally:
        await server.close()


def test_what_the_model_reads_of_a_result() -> None:
    def result(*content: types.ContentBlock, structured: Any = None, error: bool = False) -> types.CallToolResult:
        return types.CallToolResult(content=list(content), structured_content=structured, is_error=error)

    text = types.TextContent(type="text", text="Plan: Growth")
    image = types.ImageContent(type="image", data="AAAA", mime_type="image/png")
    assert result_text("tallyhouse", result(text, image)) == "Plan: Growth\n[image]"
    assert result_text("tallyhouse", result(structured={"plan": "Growth"})) == '{"plan": "Growth"}'
    assert result_text("tallyhouse", result(text, structured={"plan": "Growth"})) == "Plan: Growth"
    assert result_text("tallyhouse", result()) == "(no content)"
    refused = result(types.TextContent(type="text", text="account closed"), error=True)
    assert result_text("tallyhouse", refused) == "Error from tallyhouse: account closed"
    long = result_text("tallyhouse", result(types.TextContent(type="text", text="x" * 50_000)))
    assert long.startswith("x" * RESULT_CHARS + "\n[cut: the answer had 50000 characters")


def test_parse_mcp_servers_reads_the_shape_mcp_clients_share() -> None:
    servers = parse_mcp_servers(
        {
            "mcpServers": {
                "orders": {"command": "npx", "args": ["-y", "orders-mcp"], "env": {"API_KEY": "k"}},
                "billing": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"Authorization": "t"}},
                "crm": {"type": "streamable-http", "url": "http://crm:8000/mcp", "timeout_s": 5, "max_concurrency": 2},
                "local": {"type": "stdio", "command": "python", "cwd": "/srv"},
            }
        }
    )
    assert servers["orders"] == MCPServerConfig(
        "orders", command="npx", args=("-y", "orders-mcp"), env={"API_KEY": "k"}
    )
    assert servers["billing"].url == "https://mcp.example.com/mcp" and servers["billing"].transport == "http"
    assert servers["billing"].headers == {"Authorization": "t"}
    assert (servers["crm"].timeout_s, servers["crm"].max_concurrency) == (5.0, 2)
    assert servers["local"].transport == "stdio" and servers["local"].cwd == "/srv"
    # The inner object alone works too.
    assert parse_mcp_servers({"orders": {"command": "orders-mcp"}})["orders"].command == "orders-mcp"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"command": "x", "url": "http://h/mcp"},
            'mcpServers.orders: give either "command" (stdio) or "url" (Streamable HTTP), not both',
        ),
        ({"args": ["x"]}, 'mcpServers.orders: give "command" to run a stdio server, or "url"'),
        (
            {"type": "stdio", "url": "http://h/mcp"},
            'mcpServers.orders.type: a "stdio" server needs "command", not "url"',
        ),
        ({"type": "sse", "url": "http://h/sse"}, 'mcpServers.orders.type: use "stdio" or "http"'),
        ({"command": "x", "args": "-y orders"}, "mcpServers.orders.args: give a list of strings"),
        (
            {"command": "x", "env": {"PORT": 8080}},
            'mcpServers.orders.env.PORT: give a string value (in quotes, e.g. "8080")',
        ),
        ({"command": "x", "headers": {"A": "b"}}, 'mcpServers.orders.headers: only a server with "url"'),
        ({"url": "mcp.example.com"}, "mcpServers.orders.url: give the http:// or https:// address"),
        ({"command": "x", "autoApprove": []}, "mcpServers.orders.autoApprove: unknown setting; remove it"),
        ({"command": "x", "timeout_s": 0}, "mcpServers.orders.timeout_s: give a number of seconds above 0"),
        ({"command": "x", "max_concurrency": True}, "mcpServers.orders.max_concurrency: give a whole number"),
        (["npx", "orders-mcp"], 'mcpServers.orders: expected an object with "command"'),
    ],
)
def test_parse_mcp_servers_says_what_to_fix(entry: Any, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_mcp_servers({"orders": entry})
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_parse_mcp_servers_refuses_names_the_audit_trail_cannot_hold() -> None:
    for name in ("my orders", "orders.v2"):
        with pytest.raises(ConfigError, match=rf"mcpServers\.{name}: name the server with letters"):
            parse_mcp_servers({name: {"command": "x"}})


async def test_an_acting_name_the_server_does_not_list_makes_every_tool_ask_first(
    processes: Processes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Fail closed: `cancel_subscriptions` may be a misspelling of `cancel_subscription`, which must not act unasked."""
    server = MCPServer(stdio_config(tmp_path / "pid"), acting=frozenset({"cancel_subscriptions"}))
    with caplog.at_level(logging.ERROR, logger="agents.mcp_servers"):
        await server.start()
    try:
        processes.remember(tmp_path / "pid")
        assert server.tools() and all(t.acts for t in server.tools())
        assert "lists no tool cancel_subscriptions" in caplog.text
    finally:
        await server.close()


async def test_a_call_that_cannot_get_a_slot_in_time_is_told_the_server_is_busy(processes: Processes) -> None:
    port = free_port()
    await processes.serve_http(port)
    server = MCPServer(http_config(port, timeout_s=1.0, max_concurrency=1))
    await server.start()
    try:
        # One slot, each call holding it up to 1 s: the third in line cannot start within its 1 s.
        outcomes = await asyncio.gather(
            *(call(server, "slow", {"seconds": 1.5}) for _ in range(3)), return_exceptions=True
        )
        said = sorted(str(o) for o in outcomes)
        assert all(isinstance(o, ToolUnavailable) for o in outcomes), said
        assert any("busy: 1 calls already in flight" in s for s in said), said
        assert any("no answer within 1 s" in s for s in said), said
    finally:
        await server.close()
