"""HTTP tools against a real aiohttp server on 127.0.0.1 (allowed as the operator would allow their own host): identity
signed by the bot and checked on the server with `verify_request`, the URL built from the arguments, the answer read
within its cap, failures told to the model, private addresses refused before any connection, OpenAPI operations as
tools, and the declaration's errors in the operator's words."""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import hmac
import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from agents.errors import ConfigError, ToolUnavailable
from agents.http_tools import (
    ASKER_HEADER,
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    HTTPToolConfig,
    HTTPTools,
    _refusal,
    encode_asker,
    openapi_tools,
    parse_http_tool,
    verify_request,
)
from agents.identity import Author, asker_claims
from agents.tools import Tool, ToolArgumentsError, ToolContext, idempotency_key
from agents.toolsets import ToolSource
from harness.http import serving

SERVICE_FIXTURES = frozenset({"server"})  # an HTTP server (tests/conftest.py)
SECRET = "test-signing-secret-0123456789"
LEAK = "SECRET-KEY-42"
"""An API key or token in a URL: it must not reach the model, the logs or /support status."""
ANN = Author("slack", "T1", "U1", "Ann", "ann@example.com")
LOCAL = frozenset({"127.0.0.1"})
ORDER_ARGS = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "full": {"type": "boolean"}, "email": {"type": "string"}},
}


@dataclass
class Seen:
    method: str
    raw_path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Server:
    url: str
    port: int
    seen: list[Seen]
    release: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    """An operator's system: answers by path, and echoes what it received with the asker it verified."""
    seen: list[Seen] = []
    release = asyncio.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(Seen(request.method, request.raw_path, dict(request.headers), body))
        match request.path:
            case "/fail":
                return web.Response(status=503, text="down for maintenance")
            case "/missing":
                return web.Response(status=404, text="no such order")
            case "/missing-json":
                return web.json_response({"error": "no such order", "id": "A1"}, status=404, dumps=_pretty)
            case "/redirect":
                raise web.HTTPFound("/orders/1")
            case "/redirect-login":
                raise web.HTTPFound(f"https://ann:{LEAK}@login.example/sso?token={LEAK}#{LEAK}")
            case "/big":
                return web.Response(text="x" * 200_000)
            case "/slow":
                await release.wait()
                return web.Response(text="late")
            case "/gone":
                return web.Response(status=204)
            case "/cookie":
                response = web.Response(text="set")
                response.set_cookie("session", "ann-secret")
                return response
        claims = verify_request(SECRET, request.method, request.raw_path, body, request.headers)
        echoed = {
            "method": request.method,
            "query": dict(request.query),
            "body": json.loads(body) if body else None,
            "claims": claims,
        }
        return web.json_response(echoed, dumps=_pretty)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    async with serving(app, shutdown_timeout=0.5) as port:
        yield Server(f"http://127.0.0.1:{port}", port, seen, release)
        release.set()


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2)


class FakeDNS(AbstractResolver):
    """Names resolved to the addresses a test gives: what a hostile or rebinding DNS server would answer."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                "proto": 0,
                "flags": 0,
            }
            for address in self.names[host].split(",")  # several: what a rebinding DNS server answers
        ]

    async def close(self) -> None:
        pass


@asynccontextmanager
async def running(
    *configs: HTTPToolConfig,
    allowed: frozenset[str] = LOCAL,
    secret: str | None = SECRET,
    dns: AbstractResolver | None = None,
) -> AsyncIterator[tuple[HTTPTools, dict[str, Tool]]]:
    source = HTTPTools(list(configs), signing_secret=secret, allowed_hosts=allowed, resolver=dns)
    await source.start()
    try:
        yield source, {t.name: t for t in source.tools()}
    finally:
        await source.close()


def tool(name: str, url: str, method: str = "GET", **kwargs: Any) -> HTTPToolConfig:
    kwargs.setdefault("parameters", ORDER_ARGS)
    return HTTPToolConfig(name=name, description=f"{name} for tests", method=method, url=url, **kwargs)


def ctx(asker: Author | None = ANN, inbound: int = 1) -> ToolContext:
    return ToolContext(conversation_id=1, inbound_id=inbound, agent="support", state={}, asker=asker)


async def call(t: Tool, arguments: dict[str, Any], asker: Author | None = ANN, inbound: int = 1) -> str:
    answer = await t.invoke(ctx(asker, inbound), json.dumps(arguments))
    assert isinstance(answer, str)
    return answer


# ---------------------------------------------------------------------------------------------------------------------
# Requests and identity


async def test_get_sends_arguments_in_the_query_and_the_asker_signed(server: Server) -> None:
    async with running(tool("get_order", server.url + "/orders/{id}")) as (source, tools):
        answer = await call(tools["get_order"], {"id": "A/1 b", "full": True, "email": "mallory@example.com"})
        assert source.status().detail == "1 tool"
    # The server's pretty JSON comes back compact: whitespace is prompt tokens.
    assert "\n" not in answer and ", " not in answer
    echoed = json.loads(answer)
    assert echoed["method"] == "GET" and echoed["body"] is None
    assert echoed["query"] == {"full": "true", "email": "mallory@example.com"}
    # Identity is the header's, verified with the secret: the email in the arguments is just a query argument.
    assert echoed["claims"] == asker_claims(ANN)
    assert echoed["claims"]["email"] == "ann@example.com"
    seen = server.seen[-1]
    assert seen.raw_path == "/orders/A%2F1%20b?full=true&email=mallory%40example.com"
    assert seen.headers["User-Agent"] == "helpdesk-bot"


async def test_post_sends_a_json_body_and_the_signature_covers_it(server: Server) -> None:
    refund = tool(
        "refund",
        server.url + "/orders/{id}/refund",
        "POST",
        parameters={
            "type": "object",
            "properties": {"id": {"type": "string"}, "amount": {"type": "number"}, "email": {"type": "string"}},
            "required": ["amount"],
        },
        acts=True,
    )
    async with running(refund) as (_, tools):
        assert tools["refund"].acts and tools["refund"].source == "http"
        answer = await call(tools["refund"], {"id": "A1", "amount": 12.5, "email": "mallory@example.com"})
    echoed = json.loads(answer)
    assert echoed["body"] == {"amount": 12.5, "email": "mallory@example.com"}
    assert echoed["query"] == {}
    assert echoed["claims"] == asker_claims(ANN)

    seen = server.seen[-1]
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.headers[SIGNATURE_HEADER].startswith("v1=")
    timestamp = int(seen.headers[TIMESTAMP_HEADER])

    def verify(**change: Any) -> dict[str, str] | None:
        args: dict[str, Any] = {
            "secret": SECRET,
            "method": seen.method,
            "path_and_query": seen.raw_path,
            "body": seen.body,
            "headers": seen.headers,
            "now": timestamp + 1,
        }
        return verify_request(**{**args, **change})

    assert verify() == asker_claims(ANN)
    assert verify(body=seen.body.replace(b"12.5", b"1250")) is None
    assert verify(now=timestamp + 301) is None  # a replay five minutes on
    assert verify(now=timestamp - 301) is None
    assert verify(path_and_query="/orders/B2/refund") is None
    assert verify(method="PUT") is None
    assert verify(secret="another secret") is None
    # Somebody else's claims in the asker header: the signature covers the header, so a captured request cannot
    # be replayed for another person.
    bob = encode_asker({"platform": "slack", "workspace": "T1", "user": "U2", "key": "slack:T1:U2"})
    assert verify(headers={**seen.headers, ASKER_HEADER: bob}) is None
    assert verify(headers={k: v for k, v in seen.headers.items() if k != SIGNATURE_HEADER}) is None
    # Header names in any case, as frameworks hand them over.
    assert verify(headers={k.lower(): v for k, v in seen.headers.items()}) == asker_claims(ANN)


REFUND_ARGS = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["amount"],
}


async def test_the_idempotency_key_is_the_same_for_a_rerun_and_signed(server: Server) -> None:
    refund = tool("refund", server.url + "/orders/{id}/refund", "POST", parameters=REFUND_ARGS, acts=True)
    async with running(refund) as (_, tools):
        await call(tools["refund"], {"id": "A1", "amount": 12.5})
        await call(tools["refund"], {"amount": 12.5, "id": "A1"})  # the turn run again after a crash
        await call(tools["refund"], {"id": "A1", "amount": 12.5}, inbound=2)  # the customer asks again
        await call(tools["refund"], {"id": "A1", "amount": 13})
    first, rerun, again, other = (s.headers[IDEMPOTENCY_HEADER] for s in server.seen)
    expected = hashlib.sha256(b'1:1:refund:{"amount":12.5,"id":"A1"}').hexdigest()
    assert first == rerun == expected == idempotency_key(1, 1, "refund", {"id": "A1", "amount": 12.5})
    assert len({first, again, other}) == 3
    assert idempotency_key(1, None, "refund", {}) == hashlib.sha256(b"1:None:refund:{}").hexdigest()
    assert idempotency_key(1, 1, "cancel", {"id": "A1", "amount": 12.5}) != first

    seen = server.seen[0]
    timestamp, asker = seen.headers[TIMESTAMP_HEADER], seen.headers[ASKER_HEADER]
    # The signed string, exactly: v1:<timestamp>:<METHOD>:<path and query>:<asker>:<idempotency key>:<body>
    base = f"v1:{timestamp}:POST:{seen.raw_path}:{asker}:{first}:".encode() + seen.body
    assert seen.headers[SIGNATURE_HEADER] == "v1=" + hmac.new(SECRET.encode(), base, hashlib.sha256).hexdigest()

    def verify(headers: dict[str, str]) -> dict[str, str] | None:
        return verify_request(SECRET, seen.method, seen.raw_path, seen.body, headers, now=int(timestamp))

    assert verify(seen.headers) == asker_claims(ANN)
    # A captured refund replayed under a fresh key, to be done twice: the key is inside the signature.
    assert verify({**seen.headers, IDEMPOTENCY_HEADER: again}) is None
    assert verify({k: v for k, v in seen.headers.items() if k != IDEMPOTENCY_HEADER}) is None


async def test_arguments_the_schema_does_not_declare_never_reach_the_endpoint(server: Server) -> None:
    get = tool("get_order", server.url + "/orders/{id}", parameters={"type": "object", "properties": ID["properties"]})
    refund = tool("refund", server.url + "/orders/{id}/refund", "POST", parameters=REFUND_ARGS)
    async with running(get, refund) as (_, tools):
        echoed = json.loads(await call(tools["get_order"], {"id": "A1", "email": "mallory@example.com"}))
        assert echoed["query"] == {} and server.seen[-1].raw_path == "/orders/A1"
        echoed = json.loads(await call(tools["refund"], {"id": "A1", "amount": 5, "email": "mallory@example.com"}))
        assert echoed["body"] == {"amount": 5} and echoed["query"] == {}
    assert not any(b"mallory" in s.body or "mallory" in s.raw_path for s in server.seen)


async def test_no_signing_secret_is_warned_about_at_start_up(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="agents.http_tools")
    async with running(tool("get_order", server.url + "/orders/{id}")):
        pass
    assert caplog.messages == []
    async with running(tool("get_order", server.url + "/orders/{id}"), secret=None):
        pass
    assert caplog.messages == [
        "HTTP tools send the asker unsigned (http.unsigned: true): anyone who can reach your endpoints can claim to "
        "be anyone"
    ]


async def test_configured_headers_cannot_replace_the_identity_headers(server: Server) -> None:
    forged = encode_asker({"platform": "slack", "workspace": "T1", "user": "U9", "key": "slack:T1:U9"})
    config = tool("get_order", server.url + "/orders/{id}", headers={"X-Api-Key": "k1", ASKER_HEADER: forged})
    async with running(config) as (_, tools):
        echoed = json.loads(await call(tools["get_order"], {"id": "A1"}))
    assert echoed["claims"] == asker_claims(ANN)
    assert server.seen[-1].headers["X-Api-Key"] == "k1"


async def test_nobody_known_is_an_empty_claim_and_no_secret_sends_no_signature(server: Server) -> None:
    async with running(tool("get_order", server.url + "/orders/{id}")) as (_, tools):
        echoed = json.loads(await call(tools["get_order"], {"id": "A1"}, asker=None))
    assert echoed["claims"] == {}
    async with running(tool("get_order", server.url + "/orders/{id}"), secret=None) as (_, tools):
        echoed = json.loads(await call(tools["get_order"], {"id": "A1"}))
    assert echoed["claims"] is None  # unsigned: the server cannot trust it
    assert SIGNATURE_HEADER not in server.seen[-1].headers
    assert json.loads(_unb64(server.seen[-1].headers[ASKER_HEADER])) == asker_claims(ANN)
    with pytest.raises(ConfigError, match="signing secret is empty"):
        HTTPTools([], signing_secret="")


def _unb64(value: str) -> bytes:
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))


async def test_a_path_argument_stays_inside_its_segment(server: Server) -> None:
    async with running(tool("get_order", server.url + "/orders/{id}/items")) as (_, tools):
        await call(tools["get_order"], {"id": "../../admin?x=1#y"})
        assert server.seen[-1].raw_path == "/orders/..%2F..%2Fadmin%3Fx%3D1%23y/items"
        for dots in ("..", ".", ""):
            with pytest.raises(ToolArgumentsError, match="id"):
                await call(tools["get_order"], {"id": dots})
        with pytest.raises(ToolArgumentsError, match="id"):
            await call(tools["get_order"], {})  # the path's argument is required even when the schema forgot it
    assert len(server.seen) == 1


async def test_delete_sends_its_arguments_in_the_query_and_an_empty_answer_says_done(server: Server) -> None:
    async with running(tool("cancel", server.url + "/gone", "DELETE")) as (_, tools):
        assert await call(tools["cancel"], {"id": "A1", "email": "ann@example.com"}) == "HTTP 204 No Content"
    seen = server.seen[-1]
    assert (seen.method, seen.raw_path, seen.body) == ("DELETE", "/gone?id=A1&email=ann%40example.com", b"")
    assert verify_request(SECRET, seen.method, seen.raw_path, seen.body, seen.headers) == asker_claims(ANN)


async def test_no_cookie_is_kept_between_calls(server: Server) -> None:
    async with running(tool("cookie", server.url + "/cookie"), tool("get_order", server.url + "/orders/{id}")) as (
        _,
        tools,
    ):
        await call(tools["cookie"], {})
        await call(tools["get_order"], {"id": "A1"})
    assert "Cookie" not in server.seen[-1].headers


# ---------------------------------------------------------------------------------------------------------------------
# Answers and failures


async def test_the_answer_is_cut_at_its_cap(server: Server) -> None:
    async with running(tool("big", server.url + "/big", max_response_bytes=1000)) as (_, tools):
        answer = await call(tools["big"], {})
    assert answer.startswith("x" * 1000) and not answer.startswith("x" * 1001)
    assert "[cut: the answer is longer than 1000 bytes" in answer


async def test_5xx_is_unavailable_and_shows_in_status(server: Server) -> None:
    async with running(tool("orders", server.url + "/fail"), tool("other", server.url + "/x")) as (source, tools):
        assert source.status().up and source.status().detail == "2 tools"
        with pytest.raises(ToolUnavailable) as caught:
            await call(tools["orders"], {})
        assert str(caught.value) == (
            "the orders system is unavailable right now (HTTP 503); tell the customer you cannot check this now and "
            "offer a colleague"
        )
        status = source.status()
        assert status.up and status.tools == 2 and status.kind == "http"
        assert status.detail.startswith("2 tools; last failure ") and status.detail.endswith(" UTC orders: HTTP 503")
    assert not source.status().up and "not started" in source.status().detail


async def test_4xx_is_the_systems_answer_for_the_model(server: Server) -> None:
    async with running(tool("a", server.url + "/missing"), tool("b", server.url + "/missing-json")) as (source, tools):
        assert await call(tools["a"], {}) == "Error: HTTP 404: no such order"
        assert await call(tools["b"], {}) == 'Error: HTTP 404: {"error":"no such order","id":"A1"}'
        assert "last failure" not in source.status().detail  # "no such order" is an answer, not a failure


async def test_redirects_are_not_followed(server: Server) -> None:
    async with running(tool("orders", server.url + "/redirect", acts=True)) as (source, tools):
        with pytest.raises(ToolUnavailable, match=r"HTTP 302, a redirect, which the bot does not follow.*cannot do"):
            await call(tools["orders"], {})
        assert "redirect to /orders/1" in source.status().detail
    assert [s.raw_path for s in server.seen] == ["/redirect"]


async def test_a_slow_system_times_out(server: Server) -> None:
    async with running(tool("orders", server.url + "/slow", timeout_s=0.2)) as (_, tools):
        with pytest.raises(ToolUnavailable, match=r"unavailable right now \(no answer within 0.2 s\)"):
            await call(tools["orders"], {})


@pytest.mark.services
async def test_a_closed_port_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        async with running(tool("orders", f"http://127.0.0.1:{port}/x")) as (_, tools):
            with pytest.raises(ToolUnavailable, match="connection failed"):
                await call(tools["orders"], {})


@asynccontextmanager
async def garbage_server() -> AsyncIterator[int]:
    """A system that answers with something that is not HTTP, echoing the request line (its query included)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        writer.write(b"garbage " + line + b"\r\n\r\n")
        await writer.drain()
        writer.close()

    listening = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield listening.sockets[0].getsockname()[1]
    finally:
        listening.close()
        await listening.wait_closed()


async def test_a_secret_in_the_url_reaches_no_message_status_or_log(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    shown: list[str] = []
    async with garbage_server() as port:
        configs = (
            tool("garbled", f"http://127.0.0.1:{port}/x?api_key={LEAK}"),
            tool("down", f"{server.url}/fail?api_key={LEAK}"),
            tool("moved", f"{server.url}/redirect-login?api_key={LEAK}"),
        )
        async with running(*configs) as (source, tools):
            for name in ("garbled", "down", "moved"):
                with pytest.raises(ToolUnavailable) as caught:
                    await call(tools[name], {"id": "A1"})
                shown += [str(caught.value), source.status().detail]
    assert "(ClientResponseError: the answer is not valid HTTP)" in shown[0]
    assert "HTTP 503" in shown[2]
    assert shown[5].endswith("moved: HTTP 302 redirect to https://login.example/sso")
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("agents")]  # not the fake server's log
    assert len(logged) == 3
    for text in [*shown, *logged]:
        assert LEAK not in text and "api_key" not in text, text
    assert f"api_key={LEAK}" in server.seen[-1].raw_path  # the key did go to the operator's system


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"ftp://s3cr3t-token@shop.example/x?api_key={LEAK}#{LEAK}", '"ftp://shop.example/x" is not an http://'),
        (f"https://ann:{LEAK}@shop.example/x?api_key={LEAK}", "put credentials in headers, not in the URL"),
        (f"https://shop.example:99999/x?api_key={LEAK}", '"https://shop.example:99999/x" has a bad host or port'),
        (f"https://[::1/x?api_key={LEAK}", '"(a URL that cannot be read)" is not a URL'),
        (f"shop.example/x?api_key={LEAK}", '"shop.example/x" is not an http://'),
    ],
)
def test_a_bad_url_is_refused_without_its_userinfo_query_or_fragment(url: str, shown: str) -> None:
    messages = []
    with pytest.raises(ConfigError) as caught:
        parse_http_tool("orders", {**GOOD, "url": url, "parameters": ID})
    messages.append(str(caught.value))
    with pytest.raises(ConfigError) as caught:
        HTTPTools([tool("orders", url)], signing_secret=None)
    messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert messages[0].startswith(f"tools.orders.url: {shown}"), messages[0]
    for base in (url, None):
        document = shop_document(url) if base is None else shop_document()
        with pytest.raises(ConfigError) as caught:
            openapi_tools(document, ["getOrder"], base_url=base, where="w")
        messages.append(str(caught.value))
    for message in messages:
        assert LEAK not in message and "s3cr3t" not in message and "ann:" not in message, message


# ---------------------------------------------------------------------------------------------------------------------
# Addresses


async def test_a_name_resolving_to_loopback_is_refused_unless_allowed(server: Server) -> None:
    dns = FakeDNS({"shop.test": "127.0.0.1"})
    config = tool("orders", f"http://shop.test:{server.port}/orders/{{id}}")
    async with running(config, allowed=frozenset(), dns=dns) as (source, tools):
        with pytest.raises(ToolUnavailable) as caught:
            await call(tools["orders"], {"id": "A1"})
        assert "shop.test" in str(caught.value) and "allowed_hosts" in str(caught.value)
        assert "refused 127.0.0.1 (loopback) for shop.test" in source.status().detail
    assert server.seen == []  # refused before connecting

    async with running(config, allowed=frozenset({"Shop.Test"}), dns=dns) as (_, tools):
        echoed = json.loads(await call(tools["orders"], {"id": "A1"}))
    assert echoed["claims"] == asker_claims(ANN)
    assert server.seen[-1].headers["Host"] == f"shop.test:{server.port}"


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("10.0.0.1", "private"),
        ("192.168.1.10", "private"),
        ("169.254.169.254", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("100.64.0.1", "non-public"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("fe80::1", "link-local"),
        ("fd00::1", "private"),
        ("::", "unspecified"),
        ("2002:a00:1::1", "private"),
    ],
)
async def test_private_addresses_are_refused_at_connection_time(address: str, why: str) -> None:
    # Refused by the resolver before aiohttp connects: no packet goes to these addresses.
    async with running(
        tool("orders", "https://shop.test/x"), allowed=frozenset(), dns=FakeDNS({"shop.test": address})
    ) as (
        _,
        tools,
    ):
        article = "an" if why[0] in "aeiou" else "a"
        with pytest.raises(ToolUnavailable, match=f"shop.test is on {article} {why} address \\({address}\\)"):
            await call(tools["orders"], {})


async def test_one_private_address_among_public_ones_refuses_the_host() -> None:
    dns = FakeDNS({"shop.test": "93.184.215.14,10.0.0.1"})
    async with running(tool("orders", "https://shop.test/x"), allowed=frozenset(), dns=dns) as (_, tools):
        with pytest.raises(ToolUnavailable, match=r"a private address \(10\.0\.0\.1\)"):
            await call(tools["orders"], {})


def test_public_addresses_pass() -> None:
    for address in ("93.184.215.14", "1.1.1.1", "2606:4700:4700::1111", "::ffff:1.1.1.1", "64:ff9b::101:101"):
        assert _refusal(address) is None, address


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:8080/x",
        "http://api.localhost/x",
        "http://10.0.0.1/x",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:8080/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://0.0.0.0/x",
        "http://127.1/x",
    ],
)
def test_a_literal_private_host_is_refused_at_start_up(url: str) -> None:
    with pytest.raises(ConfigError, match=r"^tools\.orders\.url: .*(allowed_hosts|four numbers)"):
        HTTPTools([tool("orders", url)], signing_secret=None)


def test_an_allowed_literal_host_is_accepted() -> None:
    source = HTTPTools(
        [
            tool("a", "http://localhost:8080/x"),
            tool("b", "http://[::1]/x"),
            tool("c", "http://10.0.0.1/x"),
            tool("d", "http://[::ffff:7f00:1]/x"),
        ],
        signing_secret=None,
        allowed_hosts=frozenset({"localhost", "[::1]", "10.0.0.1", "::FFFF:127.0.0.1"}),
    )
    assert [t.name for t in source.tools()] == ["a", "b", "c", "d"]
    as_source: ToolSource = source  # mypy checks that it is one
    assert as_source.version == 1 and as_source.name == "http"
    with pytest.raises(ConfigError, match="two HTTP tools are named a"):
        HTTPTools([tool("a", "https://shop.example/x"), tool("a", "https://shop.example/y")], signing_secret=None)


# ---------------------------------------------------------------------------------------------------------------------
# OpenAPI


def shop_document(server_url: str = "https://shop.example/api") -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "Shop", "version": "1"},
        "servers": [{"url": server_url}],
        "paths": {
            "/orders/{orderId}": {
                "parameters": [{"$ref": "#/components/parameters/OrderId"}],
                "get": {
                    "operationId": "getOrder",
                    "summary": "Look up an order.",
                    "description": "Status, items and delivery.",
                    "parameters": [{"name": "expand", "in": "query", "schema": {"type": "boolean"}}],
                },
                "delete": {"operationId": "cancelOrder", "summary": "Cancel an order."},
            },
            "/orders/{orderId}/refunds": {
                "parameters": [{"$ref": "#/components/parameters/OrderId"}],
                "post": {
                    "operationId": "refundOrder",
                    "summary": "Refund an order.",
                    "x-helpdesk-acts": True,
                    "parameters": [
                        {"name": "notify", "in": "query", "required": True, "schema": {"type": "boolean"}},
                        {"name": "X-Trace", "in": "header", "schema": {"type": "string"}},
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Refund"}}},
                    },
                },
            },
            "/upload": {
                "post": {
                    "operationId": "upload",
                    "requestBody": {"content": {"multipart/form-data": {"schema": {"type": "object"}}}},
                }
            },
        },
        "components": {
            "parameters": {
                "OrderId": {
                    "name": "orderId",
                    "in": "path",
                    "required": True,
                    "description": "The order number, like A1.",
                    "schema": {"type": "string"},
                }
            },
            "schemas": {
                "Money": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
                "Refund": {
                    "type": "object",
                    "required": ["amount", "id"],
                    "properties": {
                        "id": {"type": "string", "readOnly": True},
                        "amount": {"$ref": "#/components/schemas/Money"},
                        "reason": {"type": "string", "nullable": True, "enum": ["broken", "late"]},
                    },
                },
            },
        },
    }


def test_openapi_operations_become_configs() -> None:
    get, refund, cancel = openapi_tools(
        shop_document(),
        ["getOrder", "refundOrder", "cancelOrder"],
        base_url=None,
        where="tools.openapi.shop",
        acting={"cancelOrder"},
        headers={"X-Api-Key": "k1"},
    )
    assert (get.name, get.method, get.url) == ("getOrder", "GET", "https://shop.example/api/orders/{orderId}")
    assert get.description == "Look up an order. Status, items and delivery."
    assert get.parameters == {
        "type": "object",
        "properties": {
            "orderId": {"type": "string", "description": "The order number, like A1."},
            "expand": {"type": "boolean"},
        },
        "required": ["orderId"],
    }
    assert not get.acts and get.headers == {"X-Api-Key": "k1"}

    assert (refund.method, refund.acts, refund.query) == ("POST", True, frozenset({"notify"}))
    # The $ref body inlined and merged; the read-only id left out; 3.0's boolean bound made a number.
    assert refund.parameters["properties"]["amount"] == {"type": "number", "exclusiveMinimum": 0}
    assert "id" not in refund.parameters["properties"] and "X-Trace" not in refund.parameters["properties"]
    assert refund.parameters["properties"]["reason"] == {"type": "string", "enum": ["broken", "late"]}
    assert refund.parameters["required"] == ["orderId", "notify", "amount"]

    assert (cancel.method, cancel.acts) == ("DELETE", True)


def test_openapi_errors_name_what_to_fix() -> None:
    assert openapi_tools(
        {**shop_document(), "paths": {**shop_document()["paths"], "x-internal": 1}},
        ["getOrder"],
        base_url=None,
        where="w",
    )
    with pytest.raises(ConfigError) as caught:
        openapi_tools(shop_document(), ["getOrder", "listOrders"], base_url=None, where="tools.openapi.shop")
    assert str(caught.value) == (
        "tools.openapi.shop: no operation 'listOrders' in the document; available: cancelOrder, getOrder, "
        "refundOrder, upload"
    )
    with pytest.raises(
        ConfigError, match=r"^tools\.openapi\.shop\.paths\./upload\.post\.requestBody: multipart/form-data"
    ):
        openapi_tools(shop_document(), ["upload"], base_url=None, where="tools.openapi.shop")
    with pytest.raises(ConfigError, match="set base_url"):
        openapi_tools(shop_document("/api"), ["getOrder"], base_url=None, where="w")
    cyclic = shop_document()
    cyclic["components"]["schemas"]["Money"] = {"$ref": "#/components/schemas/Money"}
    with pytest.raises(ConfigError, match="refers to itself"):
        openapi_tools(cyclic, ["refundOrder"], base_url=None, where="w")


REFUND_SCHEMA = "paths./orders/{orderId}/refunds.post.requestBody.content.application/json.schema"


def _put(document: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    node: Any = changed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return changed


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            ("paths", "/orders/{orderId}", "get", "parameters"),
            "oops",
            'w.paths./orders/{orderId}.get.parameters: expected a list of parameters; got "oops"',
        ),
        (
            ("paths", "/orders/{orderId}", "parameters"),
            {"name": "orderId"},
            "w.paths./orders/{orderId}.parameters: expected a list of parameters; got a mapping",
        ),
        (("paths",), {"/x": [1, 2]}, "w.paths./x: expected a path item (a mapping of methods); got a list"),
        (("paths",), {"x": {}}, "w.paths.x: a path starts with /"),
        (
            ("paths", "/orders/{orderId}", "delete"),
            "cancel it",
            "w.paths./orders/{orderId}.delete: expected an operation (a mapping with operationId, parameters, ...); "
            'got "cancel it"',
        ),
        (("paths", "/orders/{orderId}", "get", "operationId"), 5, "w.paths./orders/{orderId}.get.operationId: 5 is"),
        (
            ("components", "schemas", "Refund", "allOf"),
            [5],
            f"w.{REFUND_SCHEMA}.allOf[0]: expected a schema (a mapping); got 5",
        ),
        (("components", "schemas", "Refund", "allOf"), "oops", f"w.{REFUND_SCHEMA}.allOf: expected a list of schemas"),
        (
            ("components", "schemas", "Refund", "properties"),
            ["amount"],
            f"w.{REFUND_SCHEMA}.properties: expected a mapping of names to schemas; got a list",
        ),
        (("components", "schemas", "Refund", "required"), 5, f"w.{REFUND_SCHEMA}.required: expected a list"),
        (
            ("paths", "/orders/{orderId}", "get", "parameters", 0),
            {"in": "query", "schema": {"type": "boolean"}},
            "w.paths./orders/{orderId}.get.parameters[0].name: missing; every parameter needs its name",
        ),
        (
            ("paths", "/orders/{orderId}", "get", "parameters", 0),
            {"name": "expand", "schema": {"type": "boolean"}},
            "w.paths./orders/{orderId}.get.parameters[0].in: missing; use path, query, header or cookie",
        ),
        (
            ("components", "parameters", "OrderId"),
            "orderId",
            "w.paths./orders/{orderId}.parameters[0]: expected a parameter (a mapping with name, in and schema)",
        ),
        (
            ("paths", "/orders/{orderId}", "parameters", 0),
            {"$ref": "#/info/title", "description": "x"},
            "w.paths./orders/{orderId}.parameters[0]: expected #/info/title to point to a mapping; got",
        ),
        (
            ("paths", "/orders/{orderId}/refunds", "post", "requestBody", "content"),
            ["application/json"],
            "w.paths./orders/{orderId}/refunds.post.requestBody.content: expected a mapping of media types",
        ),
        (("servers",), "https://shop.example", 'w.servers: expected a list of servers; got "https://shop.example"'),
        (("servers", 0, "variables"), ["v1"], "w.servers[0].variables: expected a mapping of names to variables"),
        (("servers", 0, "url"), 5, "w.servers[0].url: 5 is not a URL; set base_url"),
    ],
)
def test_a_malformed_openapi_document_names_the_place(path: tuple[str | int, ...], value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        openapi_tools(_put(shop_document(), path, value), ["getOrder", "refundOrder"], base_url=None, where="w")
    assert str(caught.value).startswith(message), str(caught.value)


def _places(node: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in items:
        yield (*path, key)
        yield from _places(value, (*path, key))


def test_any_part_of_an_openapi_document_in_a_bad_shape_is_a_config_error() -> None:
    """Every node of the document replaced in turn by a value of the wrong shape: a ConfigError or tools, never a
    traceback."""
    document = shop_document()
    tried = 0
    for path in _places(document):
        for value in ("oops", [1, [2]], 5, None, True, {"x": [1]}, {"$ref": "#/info"}):
            changed = _put(document, path, value)
            for base_url in (None, "https://shop.example/api"):
                tried += 1
                try:
                    configs = openapi_tools(
                        changed, ["getOrder", "refundOrder", "cancelOrder"], base_url=base_url, where="w"
                    )
                    HTTPTools(configs, signing_secret=None)
                except ConfigError:
                    pass
                except Exception as exc:
                    raise AssertionError(f"{path} = {value!r}: {exc!r}") from exc
    assert tried > 500


async def test_an_openapi_operation_calls_the_server(server: Server) -> None:
    refund, get = openapi_tools(
        shop_document(), ["refundOrder", "getOrder"], base_url=server.url + "/api/", where="tools.openapi.shop"
    )
    async with running(refund, get) as (_, tools):
        echoed = json.loads(
            await call(tools["refundOrder"], {"orderId": "A1", "notify": False, "amount": 5, "reason": "late"})
        )
        assert server.seen[-1].raw_path == "/api/orders/A1/refunds?notify=false"
        assert echoed["body"] == {"amount": 5, "reason": "late"}
        assert echoed["claims"] == asker_claims(ANN)
        with pytest.raises(ToolArgumentsError, match="amount"):
            await call(tools["refundOrder"], {"orderId": "A1", "notify": False, "amount": 0})
        echoed = json.loads(await call(tools["getOrder"], {"orderId": "A1", "expand": True}))
        assert server.seen[-1].raw_path == "/api/orders/A1?expand=true"


# ---------------------------------------------------------------------------------------------------------------------
# The declaration


def test_parse_http_tool_reads_a_declaration() -> None:
    config = parse_http_tool(
        "refund",
        {
            "method": "post",
            "url": "https://shop.example/orders/{order_id}/refund?v=2",
            "description": "Refund an order.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "amount": {}}},
            "headers": {"X-Api-Key": "k1"},
            "acts": True,
            "timeout_s": 5,
        },
    )
    assert config.method == "POST" and config.acts and config.timeout_s == 5.0
    assert config.max_response_bytes == 65536
    assert config.parameters["required"] == ["order_id"]  # the URL cannot be sent without it
    assert config.headers == {"X-Api-Key": "k1"}


GOOD = {"method": "GET", "url": "https://shop.example/orders/{id}", "description": "Look up an order."}
ID = {"type": "object", "properties": {"id": {"type": "string"}}}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"method": "FETCH"},
            'tools.refund.method: "FETCH" is not an HTTP method; use GET, POST, PUT, PATCH or DELETE',
        ),
        ({"method": None}, "tools.refund.method: missing; add one of GET, POST, PUT, PATCH or DELETE"),
        ({"verb": "GET"}, "tools.refund.verb: unknown key; use method, url, description, parameters, headers, acts,"),
        ({"url": "ftp://shop.example/x"}, 'tools.refund.url: "ftp://shop.example/x" is not an http:// or https:// URL'),
        ({"url": "https://{id}.shop.example/x"}, "tools.refund.url: {id} is outside the path; templates fill path"),
        ({"url": "https://shop.example/x?id={id}"}, "tools.refund.url: {id} is outside the path"),
        ({"url": "https://u:p@shop.example/x"}, "tools.refund.url: put credentials in headers, not in the URL"),
        (
            {"url": "https://shop.example/orders/{order}"},
            "tools.refund.url: {order} is not one of the parameters; add order to tools.refund.parameters.properties "
            "or take it out of the URL",
        ),
        ({"description": " "}, "tools.refund.description: missing; say in a sentence what the tool does"),
        (
            {"parameters": {"type": "array"}},
            'tools.refund.parameters.type: "array" is not allowed; the arguments are one object',
        ),
        (
            {"parameters": {"type": "object", "properties": {"id": {"type": "strin"}}}},
            "tools.refund.parameters: not a valid JSON schema: ",
        ),
        (
            {"parameters": {"type": "object", "properties": {"id": {"type": "object"}}}},
            'tools.refund.parameters.properties.id.type: "object" cannot fill a URL path; use string or integer',
        ),
        ({"headers": {"X-Version": 2}}, "tools.refund.headers.X-Version: 2 is not a string; quote it"),
        (
            {"headers": {"x-helpdesk-asker": "forged"}},
            "tools.refund.headers.x-helpdesk-asker: the bot sets this header itself; remove it",
        ),
        ({"acts": "yes"}, 'tools.refund.acts: "yes" is not true or false; write true when the tool changes something'),
        ({"timeout_s": 0}, "tools.refund.timeout_s: 0 is not a positive number of seconds; use e.g. 10"),
        (
            {"max_response_bytes": 1.5},
            "tools.refund.max_response_bytes: 1.5 is not a positive whole number of bytes; use e.g. 65536",
        ),
    ],
)
def test_parse_http_tool_errors_name_the_key_and_the_fix(change: dict[str, Any], message: str) -> None:
    raw = {k: v for k, v in {**GOOD, "parameters": ID, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as caught:
        parse_http_tool("refund", raw)
    assert str(caught.value).startswith(message), str(caught.value)


def test_parse_http_tool_refuses_a_bad_name_and_a_list() -> None:
    with pytest.raises(ConfigError, match=r"^tools\.refund now: a tool's name may hold letters, digits"):
        parse_http_tool("refund now", GOOD)
    with pytest.raises(ConfigError, match=r"^tools\.refund: expected a mapping with method, url and description"):
        parse_http_tool("refund", ["GET"])  # type: ignore[arg-type]


def test_an_operation_id_used_twice_is_refused_and_configs_hide_their_secrets() -> None:
    document = {
        "openapi": "3.0.3",
        "servers": [{"url": "https://api.example.com"}],
        "paths": {"/a": {"get": {"operationId": "same"}}, "/b": {"get": {"operationId": "same"}}},
    }
    with pytest.raises(ConfigError, match="'same' is also"):
        openapi_tools(document, ["same"], base_url=None, where="openapi[0]")
    config = HTTPToolConfig(
        name="t", description="d", method="GET", url="https://api.example.com/x?key=SECRET", headers={"X-Key": "SECRET"}
    )
    assert "SECRET" not in repr(config)
