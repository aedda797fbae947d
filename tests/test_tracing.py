"""OpenTelemetry traces (the `otel` extra): a turn's spans from the engine's seams with the instrumentations' under
them, exported over OTLP/HTTP to a collector played by this test; nothing imported or done without the extra."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.conversations import Conversations
from agents.db.url import libpq_dsn
from agents.model import OpenAIChatModel
from bot.tracing import Tracing
from escalation.machine import TAKEOVER
from fakes.openai_server import FakeOpenAI, reply, tool_call, tools
from harness.bot import clean_environ
from harness.llm import CONFIG, make_model
from harness.sample import default_roster

pytest.importorskip("opentelemetry.instrumentation.asyncpg", reason="the otel extra is not installed")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra is not installed")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

# aiohttp's, about how the server instrumentation adds its middleware (a subclass of web.Application).
pytestmark = pytest.mark.filterwarnings("ignore:Inheritance class _InstrumentedApplication:DeprecationWarning")


def traced_service(
    sessions: async_sessionmaker[AsyncSession], model: OpenAIChatModel
) -> tuple[InMemorySpanExporter, Tracing, Conversations]:
    """The engine with its model traced, and the spans it makes kept in memory."""
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing = Tracing(provider)
    service = Conversations(
        takeover=TAKEOVER, sessions=sessions, roster=default_roster(), model=tracing.model(model), config=CONFIG
    )
    return exported, tracing, service


async def test_a_turn_is_a_span_with_its_model_calls_tools_and_queries_in_it(
    sessions: async_sessionmaker[AsyncSession], fake_llm: FakeOpenAI
) -> None:
    model = make_model(fake_llm)
    exported, tracing, service = traced_service(sessions, model)
    fake_llm.script(tools(tool_call("transfer_to_sales", {"reason": "camera drone"})), reply("The Harrier X4."))
    submitted = await service.submit("t:traced", "I want a drone for photos")

    async def worker() -> Any:
        # As bot.runtime.workers runs a conversation: a task of its own, the run's span around it.
        with tracing.conversation_run(submitted.conversation_id, None) as on_event:
            return await service.process_next(submitted.conversation_id, on_event=on_event)

    tracing.instrument()
    try:
        result = await asyncio.create_task(worker())
    finally:
        tracing.uninstrument()
        await model.close()
    assert result is not None and result.reply == "The Harrier X4."
    spans = exported.get_finished_spans()
    [run] = named(spans, "conversation.run")
    [turn] = named(spans, "turn")
    assert run.parent is None and turn.parent is not None and turn.parent.span_id == run.context.span_id
    assert {s.context.trace_id for s in spans} == {run.context.trace_id}
    attributes = dict(turn.attributes or {})
    assert attributes["gen_ai.conversation.id"] == "t:traced"
    assert attributes["helpdesk.message_id"] == submitted.inbound_id
    assert (attributes["gen_ai.agent.name"], attributes["helpdesk.outcome"]) == ("triage", "reply")
    assert [(e.name, dict(e.attributes or {})) for e in turn.events] == [("handoff", {"from": "triage", "to": "sales"})]
    chats = named(spans, "chat fake-model")
    assert len(chats) == 2 and children_of(turn, chats)
    assert all((dict(c.attributes or {})["gen_ai.usage.input_tokens"]) > 0 for c in chats)  # type: ignore[operator]
    [tool] = named(spans, "execute_tool transfer_to_sales")
    assert children_of(turn, [tool]) and dict(tool.attributes or {})["helpdesk.tool.source"] == "python"
    assert tool.start_time is not None and tool.end_time is not None and tool.end_time >= tool.start_time
    queries = [s for s in spans if "db.system" in (s.attributes or {}) or "db.system.name" in (s.attributes or {})]
    # The turn's own statements (its start and its commit) are in the run, beside the turn.
    assert queries and all(q.parent is not None for q in queries)
    assert {q.parent.span_id for q in queries if q.parent} & {run.context.span_id}


async def test_a_turn_that_raises_ends_its_span_as_failed(
    sessions: async_sessionmaker[AsyncSession], fake_llm: FakeOpenAI
) -> None:
    model = make_model(fake_llm)
    exported, tracing, service = traced_service(sessions, model)
    fake_llm.script(tools(tool_call("transfer_to_sales")), reply("unused"))
    submitted = await service.submit("t:raised", "I want a drone")

    async def failing(event: object) -> None:
        raise RuntimeError("the status line broke")

    async def worker() -> None:
        with tracing.conversation_run(submitted.conversation_id, failing) as on_event:
            await service.process_next(submitted.conversation_id, on_event=on_event)

    try:
        with pytest.raises(RuntimeError, match="the status line broke"):
            await asyncio.create_task(worker())
    finally:
        await model.close()
    [run] = named(exported.get_finished_spans(), "conversation.run")
    [turn] = named(exported.get_finished_spans(), "turn")
    assert not turn.status.is_ok and "RuntimeError: the status line broke" in (turn.status.description or "")
    assert not run.status.is_ok


class Collector:
    """An OpenTelemetry collector's OTLP/HTTP trace endpoint (protobuf): what a process exported to it."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.services: set[str] = set()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _traces(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            for attribute in resource_spans.resource.attributes:
                if attribute.key == "service.name":
                    self.services.add(attribute.value.string_value)
            for scope in resource_spans.scope_spans:
                self.spans.extend(scope.spans)
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    received = Collector()
    await received.start()
    yield received
    assert received.runner is not None
    await received.runner.cleanup()


SCRIPT = """
import asyncio, logging, sys
logging.basicConfig(level="INFO", format="%(message)s")
import asyncpg
from bot import tracing

async def main() -> None:
    print(tracing.start())
    conn = await asyncpg.connect(sys.argv[1])
    await conn.fetchval("SELECT 'polled'")  # as the workers poll: part of nothing
    with tracing.conversation_run(7, None):
        await conn.fetchval("SELECT 'in a run'")
    await conn.close()

asyncio.run(main())
"""


async def python(script: str, *args: str, env: dict[str, str]) -> tuple[int, str, str]:
    base = {k: v for k, v in clean_environ().items() if not k.startswith("OTEL_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=base | env,
        cwd=os.getcwd(),
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_started_from_the_sdks_variables_it_exports_over_otlp(collector: Collector, database_url: str) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_SERVICE_NAME": "helpdesk-test"}
    code, out, err = await python(SCRIPT, libpq_dsn(database_url), env=env)
    assert code == 0, err
    assert out.split() == ["True"] and "OpenTelemetry traces on (service helpdesk-test)" in err
    # Exported in the background, and the rest at exit.
    assert collector.services == {"helpdesk-test"}
    by_name: dict[str, list[Any]] = {}
    for span in collector.spans:
        by_name.setdefault(span.name, []).append(span)
    [run] = by_name["conversation.run"]
    statements = [
        next(a.value.string_value for a in s.attributes if a.key in ("db.statement", "db.query.text"))
        for s in collector.spans
        if any(a.key in ("db.system", "db.system.name") for a in s.attributes)
    ]
    assert "SELECT 'in a run'" in statements and "SELECT 'polled'" not in statements
    [in_run] = [s for s in collector.spans if s.parent_span_id == run.span_id]
    assert in_run.trace_id == run.trace_id


@pytest.mark.services
async def test_without_the_extra_or_the_variables_nothing_is_imported() -> None:
    check = (
        "import sys, logging\n"
        "logging.basicConfig(level='INFO', format='%(message)s')\n"
        "{block}"
        "from bot import tracing\n"
        "print(tracing.start(), any(m.startswith('opentelemetry') for m in sys.modules))\n"
    )
    code, out, err = await python(check.format(block=""), env={})
    assert (code, out.split(), err) == (0, ["False", "False"], "")
    # The extra's exporter made unimportable, as in an install without it.
    block = "sys.modules['opentelemetry.exporter.otlp.proto.http.trace_exporter'] = None\n"
    code, out, err = await python(check.format(block=block), env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert code == 0 and out.split()[0] == "False"
    assert err.splitlines() == [
        "OpenTelemetry is configured (OTEL_*) but the otel extra is not installed "
        "(pip install 'helpdesk-bot[otel]'): no traces"
    ]


def named(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def children_of(parent: ReadableSpan, spans: list[ReadableSpan]) -> bool:
    return all(s.parent is not None and s.parent.span_id == parent.context.span_id for s in spans)
