"""`python -m bench tools`: what a tool the operator brings costs per call, against a Python tool doing the same work.

Four tools look up the asker's invoice INV-1001 (the Tallyhouse example's data) and answer the same sentence: a Python
`function_tool`; `get_invoice` of the fake Tallyhouse MCP server (`fakes.mcp_server`) over stdio and over Streamable
HTTP, through `MCPServer`; and a signed `HTTPTools` GET to an aiohttp endpoint that checks the signature with
`verify_request` (in a process of its own, started as `python -m bench.tools --endpoint PORT`, so its CPU is not the
bot's). Every call goes through `Tool.invoke(ctx, arguments)` as the engine makes it, with an `Author` as the asker.

1. Sequential: per tool, latency p50 / p99 and this process's CPU per call (`time.process_time`), against the Python
   tool's; the server process's CPU per call beside it (from /proc, 10 ms ticks), to show where the rest goes.
2. Concurrency: 100 conversations at once, each calling a 0.2 s tool (the MCP servers' `slow`, the endpoint's `/slow`),
   split between the stdio server, the HTTP MCP server and the HTTP tool, with `max_concurrency` 8 per MCP server.
   Each source alone, then all mixed: a source's wall time mixed over alone (about 1 when no source waits on
   another's queue), and over its queue's floor (ceil(calls / limit) x 0.2 s).

Everything is on 127.0.0.1; no database is needed. This process, the two MCP servers and the endpoint share the
machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

from aiohttp import web
from pydantic import Field

from agents.http_tools import HTTPToolConfig, HTTPTools, verify_request
from agents.identity import Author
from agents.mcp_servers import MCPServer, MCPServerConfig
from agents.tools import Tool, ToolContext, function_tool
from bench.live import process_cpu_s
from bench.setup import RESULTS, machine, percentile, quiet, section, source_version, table, write_report
from bench.tables import tools
from bot.examples.tallyhouse.server import ACCOUNTS, INVOICES, NO_SUCH_INVOICE
from harness.bot import ROOT, free_port
from harness.mcp import http_server, listening, stdio_command

ASKER = Author("slack", "T0001", "U_CASEY", "Casey", "casey@example.com")
INVOICE = {"invoice_id": "INV-1001"}
ANSWER = "INV-1001: $49.00, paid."
SLOW_S = 0.2
SECRET_ENV = "BENCH_TOOLS_SECRET"
ENDPOINT_LIFETIME_S = 600.0
"""The endpoint process exits by itself after this, should the benchmark die without stopping it."""
PHASE_S = 90.0
"""No phase (the servers' start, one sequential series, one wave) may take longer."""
PYTHON, STDIO, MCP_HTTP, HTTP = "python", "mcp stdio", "mcp http", "http tool"


@dataclass(frozen=True)
class Params:
    calls: int
    warmup: int
    rounds: int
    """Waves per plan (each source alone, then mixed); the median wall time is reported."""
    mix: tuple[tuple[str, int], ...]
    """Conversations per source in the mixed wave: the stdio server gets the longest queue."""
    max_concurrency: int

    @classmethod
    def of(cls, quick: bool) -> Params:
        mix = ((STDIO, 50), (MCP_HTTP, 25), (HTTP, 25))
        if quick:
            return cls(calls=100, warmup=10, rounds=1, mix=mix, max_concurrency=8)
        return cls(calls=300, warmup=20, rounds=3, mix=mix, max_concurrency=8)


def lookup(email: str | None, invoice_id: str) -> str:
    """The Tallyhouse server's `get_invoice`, as the Python tool and the endpoint do it."""
    account = next((a for a in ACCOUNTS if email and a.email.lower() == email.lower()), None)
    invoice = next((i for i in INVOICES if account and i.id == invoice_id and i.account == account.id), None)
    return NO_SUCH_INVOICE if invoice is None else f"{invoice.id}: {invoice.amount}, {invoice.status}."


def python_tool() -> Tool:
    async def get_invoice(
        ctx: ToolContext,
        invoice_id: Annotated[str, Field(description="The invoice number, like INV-1001", pattern=r"^INV-\d{4}$")],
    ) -> str:
        """One invoice of the asker's account: amount and status."""
        return lookup(ctx.asker.email if ctx.asker else None, invoice_id)

    tool: Tool = function_tool(get_invoice)
    return tool


def http_configs(port: int) -> list[HTTPToolConfig]:
    base = f"http://127.0.0.1:{port}"
    return [
        HTTPToolConfig(
            name="get_invoice",
            description="One invoice of the asker's account: amount and status.",
            method="GET",
            url=base + "/invoices/{invoice_id}",
            parameters={
                "type": "object",
                "properties": {"invoice_id": {"type": "string", "pattern": r"^INV-\d{4}$"}},
                "required": ["invoice_id"],
            },
        ),
        HTTPToolConfig(
            name="slow",
            description="Answer after `seconds`.",
            method="GET",
            url=base + "/slow",
            parameters={
                "type": "object",
                "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": 5}},
                "required": ["seconds"],
            },
        ),
    ]


def context(conversation: int) -> ToolContext:
    return ToolContext(conversation_id=conversation, inbound_id=conversation, agent="billing", state={}, asker=ASKER)


# ------------------------------------------------------------------------------------------------ the endpoint


async def serve_endpoint(port: int, secret: str) -> None:
    """The operator's HTTP service: refuses what `verify_request` refuses, answers from the asker's verified email."""

    async def invoice(request: web.Request) -> web.Response:
        claims = verify_request(secret, request.method, request.raw_path, await request.read(), request.headers)
        if claims is None:
            return web.Response(status=401, text="bad signature")
        return web.Response(text=lookup(claims.get("email"), request.match_info["invoice_id"]))

    async def slow(request: web.Request) -> web.Response:
        if verify_request(secret, request.method, request.raw_path, await request.read(), request.headers) is None:
            return web.Response(status=401, text="bad signature")
        seconds = min(max(float(request.query.get("seconds", "0")), 0.0), 5.0)
        await asyncio.sleep(seconds)
        return web.Response(text=f"slept {seconds:g} s")

    app = web.Application()
    app.router.add_get("/invoices/{invoice_id}", invoice)
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        await asyncio.sleep(ENDPOINT_LIFETIME_S)
    finally:
        await runner.cleanup()


@asynccontextmanager
async def endpoint(port: int, secret: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """`serve_endpoint` as a child process, once it accepts connections; killed at the end."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.tools", "--endpoint", str(port), cwd=ROOT, env=os.environ | {SECRET_ENV: secret}
    )
    try:
        await listening(process, port, what="the HTTP endpoint")
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


# ------------------------------------------------------------------------------------------------ the sources


@dataclass(frozen=True)
class Source:
    label: str
    lookup: Tool
    slow: Tool | None
    pid: int | None
    """The server's process, whose CPU is read from /proc; None for the Python tool."""
    limit: int | None
    """Calls in flight at most (`max_concurrency`), None when unbounded."""


@asynccontextmanager
async def sources(params: Params) -> AsyncIterator[dict[str, Source]]:
    """The four tools, their servers started and connected; all stopped at the end."""
    async with AsyncExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-tools-")))
        mcp_port, http_port, secret = free_port(), free_port(), os.urandom(24).hex()
        mcp_processes = await stack.enter_async_context(http_server(mcp_port))
        endpoint_process = await stack.enter_async_context(endpoint(http_port, secret))
        pid_file = folder / "stdio.pid"
        command, *args = stdio_command(pid_file)
        options: dict[str, Any] = {"max_concurrency": params.max_concurrency, "timeout_s": 10.0}
        stdio = MCPServer(MCPServerConfig("tallyhouse", command=command, args=tuple(args), cwd=str(ROOT), **options))
        remote = MCPServer(MCPServerConfig("tallyhouse_http", url=f"http://127.0.0.1:{mcp_port}/mcp", **options))
        http = HTTPTools(http_configs(http_port), signing_secret=secret, allowed_hosts=frozenset({"127.0.0.1"}))
        for source in (stdio, remote, http):
            stack.push_async_callback(source.close)
            await source.start()
            if not source.status().up:
                raise RuntimeError(f"{source.name} did not start: {source.status().detail}")

        def tool(tools: Sequence[Tool], name: str) -> Tool:
            return next(t for t in tools if t.name == name)

        python = python_tool()
        yield {
            PYTHON: Source(PYTHON, python, None, None, None),
            STDIO: Source(STDIO, tool(stdio.tools(), "get_invoice"), tool(stdio.tools(), "slow"),
                          int(pid_file.read_text()), params.max_concurrency),
            MCP_HTTP: Source(MCP_HTTP, tool(remote.tools(), "get_invoice"), tool(remote.tools(), "slow"),
                             mcp_processes[0].pid, params.max_concurrency),
            HTTP: Source(HTTP, tool(http.tools(), "get_invoice"), tool(http.tools(), "slow"), endpoint_process.pid,
                         None),
        }  # fmt: skip


# ------------------------------------------------------------------------------------------------ 1. sequential


async def sequential(source: Source, params: Params) -> dict[str, Any]:
    """`params.calls` calls one after the other, after `params.warmup` unmeasured ones. In ms to the tenth of a µs:
    the Python tool's call takes a few µs."""
    ctx, arguments = context(1), json.dumps(INVOICE)
    for _ in range(params.warmup):
        await expect(source.lookup, ctx, arguments, ANSWER)
    latencies: list[float] = []
    server_before = process_cpu_s(source.pid) if source.pid else None
    cpu_before, started = time.process_time(), time.perf_counter()
    for _ in range(params.calls):
        called = time.perf_counter()
        await expect(source.lookup, ctx, arguments, ANSWER)
        latencies.append((time.perf_counter() - called) * 1000)
    cpu_s, wall_s = time.process_time() - cpu_before, time.perf_counter() - started
    server_after = process_cpu_s(source.pid) if source.pid else None
    server = None if server_before is None or server_after is None else server_after - server_before
    return {
        "calls": params.calls,
        "latency_ms": {f"p{q}": round(percentile(latencies, q), 4) for q in (50, 90, 99)}
        | {"mean": round(statistics.fmean(latencies), 4), "max": round(max(latencies), 4)},
        "bot_cpu_ms_per_call": round(cpu_s * 1000 / params.calls, 4),
        "server_cpu_ms_per_call": None if server is None else round(server * 1000 / params.calls, 2),
        "calls_per_s": round(params.calls / wall_s, 1),
    }


async def expect(tool: Tool, ctx: ToolContext, arguments: str, answer: str) -> None:
    result = await tool.invoke(ctx, arguments)
    if result != answer:
        raise RuntimeError(f"{tool.source} {tool.name} answered {result!r}, not {answer!r}")


def with_ratios(figures: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    base = figures[PYTHON]
    for f in figures.values():
        f["p50_vs_python"] = round(f["latency_ms"]["p50"] / base["latency_ms"]["p50"])
        f["p99_vs_python"] = round(f["latency_ms"]["p99"] / base["latency_ms"]["p99"])
        f["bot_cpu_vs_python"] = round(f["bot_cpu_ms_per_call"] / base["bot_cpu_ms_per_call"])
    return figures


# ------------------------------------------------------------------------------------------------ 2. concurrency


async def wave(plan: Sequence[tuple[Source, int]]) -> dict[str, Any]:
    """All of `plan`'s conversations at once (interleaved by source), each calling its source's 0.2 s tool: seconds
    from the start to each call's end, by source."""
    order = [s for i in range(max(n for _, n in plan)) for s, n in plan if i < n]
    arguments, answer = json.dumps({"seconds": SLOW_S}), f"slept {SLOW_S:g} s"

    async def one(source: Source, conversation: int) -> tuple[str, float]:
        assert source.slow is not None
        await expect(source.slow, context(conversation), arguments, answer)
        return source.label, time.perf_counter() - started

    cpu_before, started = time.process_time(), time.perf_counter()
    ends = await asyncio.gather(*(one(s, i) for i, s in enumerate(order)))
    cpu_s = time.process_time() - cpu_before
    by_source = {s.label: [t for label, t in ends if label == s.label] for s, _ in plan}
    return {
        "wall_s": {label: max(times) for label, times in by_source.items()},
        "p50_s": {label: statistics.median(times) for label, times in by_source.items()},
        "bot_cpu_ms_per_call": cpu_s * 1000 / len(order),
    }


async def concurrency(found: dict[str, Source], params: Params) -> dict[str, Any]:
    plan = [(found[label], n) for label, n in params.mix]
    alone: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in params.mix}
    mixed: list[dict[str, Any]] = []
    for _ in range(params.rounds):
        for source, n in plan:
            alone[source.label].append(await wave([(source, n)]))
        mixed.append(await wave(plan))
    out: dict[str, Any] = {}
    for source, n in plan:
        label = source.label
        alone_s = statistics.median(w["wall_s"][label] for w in alone[label])
        mixed_s = statistics.median(w["wall_s"][label] for w in mixed)
        floor_s = math.ceil(n / source.limit) * SLOW_S if source.limit else SLOW_S
        out[label] = {
            "calls": n,
            "max_concurrency": source.limit,
            "floor_s": round(floor_s, 3),
            "alone_wall_s": round(alone_s, 3),
            "mixed_wall_s": round(mixed_s, 3),
            "mixed_p50_s": round(statistics.median(w["p50_s"][label] for w in mixed), 3),
            "mixed_vs_alone": round(mixed_s / alone_s, 2),
            "mixed_vs_floor": round(mixed_s / floor_s, 2),
            "alone_bot_cpu_ms_per_call": round(statistics.median(w["bot_cpu_ms_per_call"] for w in alone[label]), 3),
        }
    return {
        "sources": out,
        "mixed_wall_s": round(statistics.median(max(w["wall_s"].values()) for w in mixed), 3),
        "mixed_bot_cpu_ms_per_call": round(statistics.median(w["bot_cpu_ms_per_call"] for w in mixed), 3),
        "rounds": params.rounds,
    }


# ------------------------------------------------------------------------------------------------ report


async def run(params: Params) -> dict[str, Any]:
    async with sources(params) as found:  # each server's start is bounded by its own timeout
        figures: dict[str, dict[str, Any]] = {}
        for label, source in found.items():
            section(f"{label}: {params.calls} calls one after the other, after {params.warmup} warm-up calls")
            async with asyncio.timeout(PHASE_S):
                figures[label] = await sequential(source, params)
            print(figures[label], flush=True)
        with_ratios(figures)
        calls = " + ".join(f"{n} {label}" for label, n in params.mix)
        section(f"{calls} at once, {SLOW_S:g} s per call, max_concurrency {params.max_concurrency} per MCP server")
        async with asyncio.timeout(PHASE_S):
            waves = await concurrency(found, params)
        for label, f in waves["sources"].items():
            print(label, f, flush=True)

    section(f"per call, sequential ({params.calls} calls; ms; x = against the Python tool)")
    one_by_one = tools({"sequential": figures})
    print(table(one_by_one.headers, one_by_one.rows))
    section(f"{sum(n for _, n in params.mix)} conversations at once (median of {params.rounds}; s)")
    rows: list[tuple[object, ...]] = [
        (label, f["calls"], f["max_concurrency"] or "-", f["floor_s"], f["alone_wall_s"], f["mixed_wall_s"],
         f["mixed_vs_alone"], f["mixed_vs_floor"])
        for label, f in waves["sources"].items()
    ]  # fmt: skip
    print(table(("source", "calls", "limit", "floor s", "alone s", "mixed s", "mixed/alone", "mixed/floor"), rows))
    return {"parameters": asdict(params) | {"slow_s": SLOW_S}, "sequential": figures, "concurrency": waves}


def main(*, quick: bool = False, results: Path = RESULTS) -> dict[str, Any]:
    """Run the tools benchmark, print its figures and write `results/tools.json`."""
    quiet()
    print(f"tools benchmark{' (quick)' if quick else ''}: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    started, source = time.perf_counter(), source_version()
    report = asyncio.run(run(Params.of(quick)))
    versions = {name: metadata.version(name) for name in ("mcp", "aiohttp")}
    report = {"benchmark": "tools", "quick": quick, **report, "machine": machine("not used", None, **versions)}
    report |= {"source": source, "total_s": round(time.perf_counter() - started, 1)}
    return write_report(report, results / "tools.json")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.tools", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run")
    parser.add_argument("--endpoint", type=int, metavar="PORT", help=f"serve the endpoint only (secret: ${SECRET_ENV})")
    args = parser.parse_args()
    if args.endpoint is None:
        main(quick=args.quick)
    else:
        asyncio.run(serve_endpoint(args.endpoint, os.environ[SECRET_ENV]))
