"""The operator's MCP servers as tool sources: their tools, called for the asker, through the official SDK.

An operator declares servers in the `mcpServers` shape MCP clients share (Claude Desktop, Cursor, VS Code), read by
`parse_mcp_servers` into `MCPServerConfig`s; each becomes an `MCPServer`, a `ToolSource` (agents.toolsets).

One supervisor task per server owns the connection, because the SDK's transports and sessions are anyio context
managers that must be entered and left in the same task: it connects (a stdio child process or Streamable HTTP),
lists the tools (every page), then waits until the connection dies, the server says its tools changed, or it is time
to list them again; when it fails it marks the server down, logs why, and tries again with backoff. A server that is
down never fails a turn or the bot's start: its tools stay listed and answer `ToolUnavailable`, whose message tells
the model what to tell the customer.

Who is asking travels outside the model's arguments, in the request's `_meta` under `ASKER_META`: only what the
platform vouched for (`agents.identity.asker_claims`), so an operator's server checks ownership against that and
never against an email the model was told by someone in the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from contextvars import Context as VarsContext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib import metadata
from types import TracebackType
from typing import Any, Final, Literal, Self, cast

import anyio
import httpx2
import mcp_types as types
from mcp import Client, MCPError, StdioServerParameters, stdio_client
from mcp.client import IncomingMessage, InputRequiredRoundsExceededError

# The SDK's own names for a transport's streams; `mcp` is pinned below 3, where they live here.
from mcp.client._transport import ReadStream, TransportStreams
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.message import SessionMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from agents.errors import ConfigError, ToolUnavailable
from agents.identity import asker_claims
from agents.tools import Tool, ToolArgumentsError, ToolContext, idempotency_key, schema_tool
from agents.toolsets import SourceStatus

log = logging.getLogger(__name__)

ASKER_META: Final = "io.helpdesk/asker"
IDEMPOTENCY_META: Final = "io.helpdesk/idempotency-key"
"""The same for a turn run again after a crash with the same arguments (`agents.tools.idempotency_key`): a server
that acts (a refund) does it once per key."""
"""The key of the request's `_meta` that carries `asker_claims(ctx.asker)` to the server."""
RESULT_CHARS: Final = 20_000
"""What of a tool's answer the model reads at most: a server that dumps a whole table must not fill the context."""
RETRY_FIRST_S: Final = 0.5
RETRY_MAX_S: Final = 30.0
"""Reconnecting backs off from the first to the last, doubling, and starts over after a connection that worked."""
RELIST_EVERY_S: Final = 60.0
"""How often a connected server's tools are listed again: the only news of a change from a server that cannot
notify, and a sign of life from an HTTP server that no call has reached lately."""
RELISTEN_AFTER_S: Final = 5.0
MAX_PAGES: Final = 100
"""Pages of a tool listing read at most: a server whose cursor never ends must not stall the supervisor."""
CLOSE_S: Final = 10.0
"""How long close() lets the SDK stop a stdio server (it closes stdin, waits, then kills the process group)."""


@dataclass(frozen=True)
class MCPServerConfig:
    """One MCP server of the operator's declaration: a command to run (stdio) or an address (Streamable HTTP)."""

    name: str
    """The server's key in `mcpServers`: how logs, /support status and the audit trail (`mcp:<name>`) name it."""
    command: str | None = None
    """stdio: the program to start; the bot runs it as a child process and restarts it when it exits."""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    """stdio: variables set for the child, over a minimal inherited set (PATH, HOME, ...: the SDK's choice), so the
    bot's own secrets are not handed to the operator's program."""
    cwd: str | None = None
    url: str | None = None
    """Streamable HTTP: the endpoint, e.g. https://mcp.example.com/mcp."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Streamable HTTP: sent with every request (an Authorization header, usually)."""
    timeout_s: float = 30.0
    """One call's answer (and one listing's) at most; then the call answers that the system is unavailable."""
    max_concurrency: int = 8
    """Calls in flight to this server at most; more wait their turn, so a busy hour cannot flood the server."""
    connect_timeout_s: float = 10.0
    """Starting or reaching the server and listing its tools, at most; start() waits no longer for the first try."""

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ConfigError(f'mcpServers.{self.name}: give either "command" (stdio) or "url" (Streamable HTTP)')

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"


_STDIO_KEYS: Final = ("command", "args", "env", "cwd")
_HTTP_KEYS: Final = ("url", "headers")
_OWN_KEYS: Final = ("type", "timeout_s", "max_concurrency", "connect_timeout_s")
_TYPES: Final = {"stdio": "stdio", "http": "http", "streamable-http": "http"}
_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a server may be called: its name is part of key paths in messages ("mcpServers.orders.url") and of the audit
trail's "mcp:<name>", so no dots or spaces."""


def parse_mcp_servers(raw: Mapping[str, Any]) -> dict[str, MCPServerConfig]:
    """The servers of an `mcpServers` object (or of a whole file holding one, `{"mcpServers": {...}}`, as MCP clients
    write it), by name. Raises ConfigError with one sentence that names the key path and the fix: another part of the
    program turns it into an error located in the operator's file."""
    servers = raw.get("mcpServers") if set(raw) == {"mcpServers"} else raw
    if not isinstance(servers, Mapping):
        raise ConfigError(f"mcpServers: expected an object of servers by name, got {_kind(servers)}")
    return {str(name): _parse_server(str(name), entry) for name, entry in servers.items()}


def _parse_server(name: str, entry: Any) -> MCPServerConfig:
    at = f"mcpServers.{name}"
    if not _SERVER_NAME.fullmatch(name):
        raise ConfigError(f'{at}: name the server with letters, digits, "_" and "-" only (64 at most)')
    if not isinstance(entry, Mapping):
        raise ConfigError(
            f'{at}: expected an object with "command" (stdio) or "url" (Streamable HTTP), got {_kind(entry)}'
        )
    for key in entry:
        if key not in (*_STDIO_KEYS, *_HTTP_KEYS, *_OWN_KEYS):
            known = ", ".join((*_STDIO_KEYS, *_HTTP_KEYS, *_OWN_KEYS))
            raise ConfigError(f"{at}.{key}: unknown setting; remove it, or use one of {known}")
    if "command" in entry and "url" in entry:
        raise ConfigError(f'{at}: give either "command" (stdio) or "url" (Streamable HTTP), not both')
    if "command" not in entry and "url" not in entry:
        raise ConfigError(f'{at}: give "command" to run a stdio server, or "url" to reach a Streamable HTTP server')
    transport = "stdio" if "command" in entry else "http"
    if "type" in entry:
        declared = _TYPES.get(entry["type"]) if isinstance(entry["type"], str) else None
        if declared is None:
            raise ConfigError(
                f'{at}.type: use "stdio" or "http" ("streamable-http" also works); '
                f"{json.dumps(entry['type'])} is not a transport the bot speaks"
            )
        if declared != transport:
            needs, has = ("command", "url") if declared == "stdio" else ("url", "command")
            raise ConfigError(f'{at}.type: a {json.dumps(entry["type"])} server needs "{needs}", not "{has}"')
    for key in _HTTP_KEYS if transport == "stdio" else _STDIO_KEYS:
        if key in entry:
            owner = '"url" (Streamable HTTP)' if transport == "stdio" else '"command" (stdio)'
            raise ConfigError(f'{at}.{key}: only a server with {owner} takes "{key}"; remove it')
    timeout_s = _seconds(at, entry, "timeout_s", MCPServerConfig.timeout_s)
    connect_timeout_s = _seconds(at, entry, "connect_timeout_s", MCPServerConfig.connect_timeout_s)
    limit = entry.get("max_concurrency", 8)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"{at}.max_concurrency: give a whole number of calls in flight, at least 1, e.g. 8")
    if transport == "stdio":
        command = entry["command"]
        if not isinstance(command, str) or not command.strip():
            raise ConfigError(f'{at}.command: give the program to run as one string, and its arguments in "args"')
        args = entry.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConfigError(f'{at}.args: give a list of strings, e.g. ["-m", "orders_mcp"]')
        cwd = entry.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise ConfigError(f"{at}.cwd: give the folder to start the server in as a string")
        return MCPServerConfig(
            name,
            command=command,
            args=tuple(args),
            env=_strings(f"{at}.env", entry.get("env", {})),
            cwd=cwd,
            timeout_s=timeout_s,
            max_concurrency=limit,
            connect_timeout_s=connect_timeout_s,
        )
    url = entry["url"]
    if not isinstance(url, str) or not re.match(r"https?://[^/\s]+", url):
        raise ConfigError(
            f'{at}.url: give the http:// or https:// address of the server, e.g. "https://mcp.example.com/mcp"'
        )
    return MCPServerConfig(
        name,
        url=url,
        headers=_strings(f"{at}.headers", entry.get("headers", {})),
        timeout_s=timeout_s,
        max_concurrency=limit,
        connect_timeout_s=connect_timeout_s,
    )


def _seconds(at: str, entry: Mapping[str, Any], key: str, default: float) -> float:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(f"{at}.{key}: give a number of seconds above 0, e.g. {default:g}")
    return float(value)


def _strings(at: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ConfigError(f'{at}: give an object of names to string values, e.g. {{"API_KEY": "..."}}')
    for key, item in value.items():
        if not isinstance(item, str):
            raise ConfigError(f"{at}.{key}: give a string value (in quotes, e.g. {json.dumps(str(item))})")
    return {str(k): v for k, v in value.items()}


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, int | float) else type(value).__name__
    )


def result_text(server: str, result: types.CallToolResult) -> str:
    """What the model reads of a tool's answer: its texts; structured content as JSON when there is no text; other
    content named in a word ("[image]"); cut at RESULT_CHARS. An `isError` answer is still the server's answer (an
    unknown customer, a refused action): the model reads it, marked as an error."""
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    parts = [block.text if isinstance(block, types.TextContent) else f"[{block.type}]" for block in result.content]
    if not texts and result.structured_content is not None:
        parts.insert(0, json.dumps(result.structured_content, ensure_ascii=False, default=str))
    text = "\n".join(parts) or "(no content)"
    if len(text) > RESULT_CHARS:
        text = (
            f"{text[:RESULT_CHARS]}\n[cut: the answer had {len(text)} characters; these are the first {RESULT_CHARS}]"
        )
    return f"Error from {server}: {text}" if result.is_error else text


@dataclass
class _Link:
    """What calls and the transport tell the supervisor about one connection: that it died (and why), or that the
    server's tools may have changed."""

    dropped: Callable[[str], None]
    """Marks the server down at once, before the SDK's teardown (which may wait for a stdio process to exit)."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    worked: bool = False
    """It got as far as listing the tools: the next try starts again from the first delay."""
    lost: str | None = None
    stale: bool = False

    def drop(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            self.dropped(reason)
        self.wake.set()

    def relist(self) -> None:
        self.stale = True
        self.wake.set()


@dataclass(frozen=True)
class _Live:
    client: Client
    link: _Link


class MCPServer:
    """One operator MCP server as a `ToolSource`: start() connects in the background, tools() offers its tools as
    `agents.tools.Tool`s (`source="mcp:<name>"`), and calls go to the server with the asker in `_meta`.

    `acting`: names of its tools that change something for the asker (they wait for the asker's yes,
    `agents.confirm`), beside those the server itself marks `destructiveHint`.
    """

    def __init__(self, config: MCPServerConfig, *, acting: frozenset[str] = frozenset()) -> None:
        self.name = config.name
        self._config = config
        self._acting = acting
        self._limit = asyncio.Semaphore(config.max_concurrency)
        self._tools: tuple[Tool, ...] = ()
        self._listing: str | None = None
        self._skipped = 0
        self._version = 0
        self._live: _Live | None = None
        self._reason: str | None = None
        self._since: datetime | None = None
        self._retry_s = RETRY_FIRST_S
        self._task: asyncio.Task[None] | None = None
        self._stop = anyio.CancelScope()
        """Stops the supervisor: an anyio scope, because the SDK shields its stdio shutdown from anyio's
        cancellation only (a plain task.cancel() could leave the server process running)."""
        self._tried = asyncio.Event()
        try:
            version = metadata.version("helpdesk-bot")
        except metadata.PackageNotFoundError:
            version = "dev"
        self._client_info = types.Implementation(name="helpdesk-bot", version=version)

    @property
    def version(self) -> int:
        return self._version

    def tools(self) -> tuple[Tool, ...]:
        return self._tools

    def status(self) -> SourceStatus:
        count = len(self._tools)
        if self._live is not None:
            skipped = f" ({self._skipped} skipped, see the log)" if self._skipped else ""
            return SourceStatus(self.name, "mcp", True, f"{count} tools{skipped}", count, self._since)
        if self._reason is None:
            # Before the first try ends; or for a moment while a connection that ended is taken down.
            detail = "reconnecting" if self._tried.is_set() else "connecting"
            return SourceStatus(self.name, "mcp", False, detail, count, self._since)
        when = f" since {self._since:%H:%M} UTC" if self._since else ""
        retry = f"; retrying every {self._retry_s:g} s" if self._task is not None else ""
        return SourceStatus(self.name, "mcp", False, f"down{when}: {self._reason}{retry}", count, self._since)

    async def start(self) -> None:
        """Start the supervisor and wait for its first try (connect_timeout_s at most). Never raises for a server that
        cannot be reached: it is reported down and the supervisor keeps trying while the bot serves."""
        if self._task is not None:
            return
        self._stop, self._tried = anyio.CancelScope(), asyncio.Event()
        self._task = asyncio.create_task(self._supervise(), name=f"mcp:{self.name}")
        with contextlib.suppress(TimeoutError):
            # The supervisor bounds its own try; this only makes sure start() cannot wait longer.
            async with asyncio.timeout(self._config.connect_timeout_s + 1):
                await self._tried.wait()

    async def close(self) -> None:
        """Stop the supervisor: the SDK leaves its session and stops a stdio server (stdin closed, then the process
        group killed), inside the SDK's own bounded, shielded shutdown."""
        task, self._task = self._task, None
        if task is None:
            return
        self._tried.set()  # a start() still waiting returns
        self._stop.cancel()
        done, _ = await asyncio.wait([task], timeout=CLOSE_S)
        if not done:
            task.cancel()
            await asyncio.wait([task])
        self._live = None
        self._reason, self._since = "closed", datetime.now(UTC)

    async def _supervise(self) -> None:
        with self._stop:
            while True:
                link = _Link(self._dropped)
                try:
                    reason = await self._connection(link)
                except Exception as exc:  # whatever the transport or the server did, the bot keeps serving
                    reason = describe(exc, command=self._config.command)
                    log.debug("MCP server %s: connection failed", self.name, exc_info=True)
                # From the first delay after a connection that worked (and on the first try), doubling while it fails.
                if not link.worked and self._tried.is_set():
                    self._retry_s = min(self._retry_s * 2, RETRY_MAX_S)
                if link.lost is None:  # else the connection's own news marked it down already
                    self._down(reason)
                await anyio.sleep(self._retry_s)

    async def _connection(self, link: _Link) -> str:
        """One connection's life: connect, list, then serve until it dies. Returns (or raises) why it ended."""

        async def on_message(message: IncomingMessage) -> None:
            # Servers before the 2026 protocol send this unasked; later ones through `listen` (below).
            if isinstance(message, types.ToolListChangedNotification):
                link.relist()

        config = self._config
        with anyio.CancelScope(deadline=anyio.current_time() + config.connect_timeout_s) as connecting:
            transport = self._transport(lambda: link.drop("the server closed the connection"))
            async with Client(
                transport, cache=None, message_handler=on_message, client_info=self._client_info
            ) as client:
                await self._list(client)
                connecting.deadline = math.inf
                self._live = _Live(client, link)
                link.worked = True
                self._up()
                try:
                    async with anyio.create_task_group() as tasks:
                        if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                            tasks.start_soon(self._listen, client, link)
                        reason = await self._serve(client, link)
                        tasks.cancel_scope.cancel()
                    return reason
                finally:
                    self._live = None
        raise TimeoutError(f"no answer within {config.connect_timeout_s:g} s")

    async def _serve(self, client: Client, link: _Link) -> str:
        while True:
            with anyio.move_on_after(RELIST_EVERY_S):
                await link.wake.wait()
            link.wake.clear()
            if link.lost is not None:
                return link.lost
            link.stale = False
            await self._list(client)

    async def _listen(self, client: Client, link: _Link) -> None:
        """Tool-list changes from a 2026-protocol server, which sends them only on a `subscriptions/listen` stream.
        A stream that drops may mean the server went away: the supervisor lists the tools at once, which tells."""
        while True:
            try:
                async with client.listen(tools_list_changed=True) as changes:
                    async for _ in changes:
                        link.relist()
            except SubscriptionLost:
                link.relist()
            except (ListenNotSupportedError, MCPError) as exc:
                log.debug("MCP server %s does not say when its tools change (%s)", self.name, exc)
                return
            except Exception:  # a server's odd stream must not end the connection; listing again still works
                log.debug("MCP server %s: listening for tool changes failed", self.name, exc_info=True)
                return
            await anyio.sleep(RELISTEN_AFTER_S)

    @asynccontextmanager
    async def _transport(self, ended: Callable[[], None]) -> AsyncIterator[TransportStreams]:
        config = self._config
        async with AsyncExitStack() as stack:
            if config.command is not None:
                params = StdioServerParameters(
                    command=config.command, args=list(config.args), env=dict(config.env) or None, cwd=config.cwd
                )
                read, write = await stack.enter_async_context(stdio_client(params))
            else:
                assert config.url is not None  # MCPServerConfig holds a command or a URL
                http = await stack.enter_async_context(
                    # The SDK's defaults: a response stream may stay open for long; calls are bounded per call.
                    httpx2.AsyncClient(headers=dict(config.headers), timeout=httpx2.Timeout(30.0, read=300.0))
                )
                read, write = await stack.enter_async_context(streamable_http_client(config.url, http_client=http))
            yield _Watched(read, ended), write

    async def _list(self, client: Client) -> None:
        specs: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            with anyio.fail_after(self._config.timeout_s):
                page = await client.list_tools(cursor=cursor)
            specs.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        else:
            log.warning("MCP server %s: its tool listing did not end after %d pages; using those", self.name, MAX_PAGES)
        self._install(specs)

    def _install(self, specs: list[types.Tool]) -> None:
        listing = json.dumps(
            [s.model_dump(mode="json", by_alias=True, exclude_none=True) for s in specs], sort_keys=True
        )
        if listing == self._listing:
            return
        tools: dict[str, Tool] = {}
        skipped = 0
        unlisted = self._acting - {spec.name for spec in specs}
        if unlisted:
            # Fail closed: a name in `acting` the server does not list may be a misspelling of one it does, which would
            # then act without the customer's yes. Every tool of the server asks first until the names agree.
            log.error(
                "MCP server %s lists no tool %s (named in its acting:); all its tools ask the customer first",
                self.name,
                ", ".join(sorted(unlisted)),
            )
        for spec in specs:
            tool = self._tool(spec)
            if tool is not None and unlisted and not tool.acts:
                tool = replace(tool, acts=True)
            if tool is None or tool.name in tools:
                skipped += 1
                if tool is not None:
                    log.warning("MCP server %s lists the tool %s twice; the first is kept", self.name, tool.name)
                continue
            tools[tool.name] = tool
        self._listing, self._tools, self._skipped = listing, tuple(tools.values()), skipped
        self._version += 1
        log.info("MCP server %s offers %d tools: %s", self.name, len(tools), ", ".join(tools) or "none")

    def _tool(self, spec: types.Tool) -> Tool | None:
        annotations = spec.annotations
        destructive = annotations is not None and annotations.destructive_hint is True
        description = spec.description or spec.title or (annotations.title if annotations else None) or ""
        try:
            return schema_tool(
                name=spec.name,
                description=description,
                parameters=spec.input_schema,
                fn=self._caller(spec.name),
                source=f"mcp:{self.name}",
                acts=destructive or spec.name in self._acting,
                timeout_s=self._config.timeout_s,
            )
        except (ConfigError, TypeError, ValueError, KeyError) as exc:  # one odd tool never costs the others
            log.warning("MCP server %s: tool %r left out: %s", self.name, spec.name, exc)
            return None

    def _caller(self, tool: str) -> Callable[[ToolContext, dict[str, Any]], Awaitable[str]]:
        async def call(ctx: ToolContext, arguments: dict[str, Any]) -> str:
            return await self._call(tool, ctx, arguments)

        return call

    async def _call(self, tool: str, ctx: ToolContext, arguments: dict[str, Any]) -> str:
        timeout_s = self._config.timeout_s
        try:
            # Waiting for a free slot counts too: a call that cannot even start in time is told so, not left queued.
            async with asyncio.timeout(timeout_s):
                await self._limit.acquire()
        except TimeoutError:
            raise self._unavailable(f"busy: {self._config.max_concurrency} calls already in flight") from None
        try:
            return await self._call_now(tool, ctx, arguments, timeout_s)
        finally:
            self._limit.release()

    async def _call_now(self, tool: str, ctx: ToolContext, arguments: dict[str, Any], timeout_s: float) -> str:
        live = self._live
        if live is None:
            raise self._unavailable(self._reason or "not connected yet")
        # The SDK types `_meta` as a TypedDict open to any key (PEP 728), which mypy does not read yet.
        key = ctx.idempotency_key or idempotency_key(ctx.conversation_id, ctx.inbound_id, tool, arguments)
        meta = cast(types.RequestParamsMeta, {ASKER_META: asker_claims(ctx.asker), IDEMPOTENCY_META: key})
        try:
            async with asyncio.timeout(timeout_s):
                result = await live.client.call_tool(tool, arguments, meta=meta)
        except TimeoutError:
            raise self._unavailable(f"no answer within {timeout_s:g} s") from None
        except MCPError as exc:
            raise self._refused(tool, exc, live.link) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            live.link.drop("the connection dropped")
            raise self._unavailable("the connection dropped") from None
        except (ValidationError, RuntimeError, InputRequiredRoundsExceededError) as exc:
            # A result the SDK cannot read (against its own output schema, or asking for input the bot cannot
            # give): the server's fault, and not something the model can fix.
            raise self._unavailable(f"its answer could not be read: {_short(str(exc))}") from None
        return result_text(self.name, result)

    def _refused(self, tool: str, exc: MCPError, link: _Link) -> Exception:
        if exc.code == types.CONNECTION_CLOSED or exc.message == "Session terminated":
            # A Streamable HTTP server that restarted forgets its sessions: the same as a dropped connection.
            link.drop("the connection dropped")
            return self._unavailable("the connection dropped")
        if exc.code == types.INVALID_PARAMS:
            return ToolArgumentsError(f"{self.name} refused the arguments: {_short(exc.message)}")
        if exc.code == types.METHOD_NOT_FOUND:
            link.relist()
            return self._unavailable(f"it no longer offers {tool}")
        return self._unavailable(f"it answered with an error: {_short(exc.message)}")

    def _unavailable(self, reason: str) -> ToolUnavailable:
        return ToolUnavailable(
            f"the {self.name} system is unavailable right now ({reason}); tell the customer you cannot check this at "
            "the moment, and offer a colleague"
        )

    def _up(self) -> None:
        if self._reason is not None:
            log.info("MCP server %s is back with %d tools", self.name, len(self._tools))
        self._reason, self._since, self._retry_s = None, datetime.now(UTC), RETRY_FIRST_S
        self._tried.set()

    def _dropped(self, reason: str) -> None:
        self._live = None
        if self._task is not None:  # not the streams that close() itself ends
            self._down(reason)

    def _down(self, reason: str) -> None:
        if reason != self._reason:
            log.warning("MCP server %s is down (%s); trying again in %g s", self.name, reason, self._retry_s)
        else:
            log.debug("MCP server %s is still down (%s)", self.name, reason)
        if self._reason is None:
            self._since = datetime.now(UTC)
        self._reason = reason
        self._tried.set()


class _Watched:
    """A transport's read stream that says when it ends (a stdio server that exited): without it a dead connection
    would be noticed only by the next call, and a crashed stdio server restarted only then."""

    def __init__(self, inner: ReadStream[SessionMessage | Exception], ended: Callable[[], None]) -> None:
        self._inner = inner
        self._ended = ended

    @property
    def last_context(self) -> VarsContext | None:
        # The SDK restores the sender's context variables from this when the inner stream keeps them.
        context: VarsContext | None = getattr(self._inner, "last_context", None)
        return context

    async def receive(self) -> SessionMessage | Exception:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._ended()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def describe(exc: BaseException, *, command: str | None = None) -> str:
    """Why a connection failed, in a few words for a log line and /support status (`command`: the stdio server's)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    match exc:
        case TimeoutError() | httpx2.TimeoutException():
            return str(exc) if isinstance(exc, TimeoutError) and str(exc) else "no answer in time"
        case FileNotFoundError() | PermissionError():
            # uvloop's spawn names no file where asyncio's names the program: then it is the configured command.
            program = exc.filename or command
            where = f"{program}: " if program else ""
            return f"cannot start the server: {where}{exc.strerror or exc}"
        case _ if any(isinstance(cause, ConnectionRefusedError) for cause in _causes(exc)):
            return "connection refused"
        case httpx2.ConnectError() | OSError():
            return f"cannot connect ({_short(str(exc), 100)})"
        case httpx2.TransportError() | anyio.ClosedResourceError() | anyio.BrokenResourceError():
            return "the connection dropped"
        case MCPError() if exc.code == types.CONNECTION_CLOSED:
            return "the connection dropped"
        case MCPError():
            return _short(exc.message)
    return _short(f"{type(exc).__name__}: {exc}")


def _causes(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 10:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
