"""OpenTelemetry traces, optional: `pip install 'helpdesk-bot[otel]'` and the SDK's own variables
(OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_TRACES_EXPORTER, OTEL_SERVICE_NAME, OTEL_EXPORTER_OTLP_HEADERS, ...).

What is traced: a conversation's run (a worker's lease: each message's start, turn and commit), in it a span
per turn (the conversation's key and the message's id), per model call (model, tokens) and per tool call, all from
the engine's own seams (`Model`, the `EventSink`); under them the ecosystem's instrumentations add the database
(asyncpg), HTTP calls to Slack, Teams and tools' servers (aiohttp client) and the requests served (aiohttp server;
/healthz and /metrics left out). Database statements outside a span, the workers' polling, are not recorded.

Nothing here imports OpenTelemetry unless `start` finds it wanted; until then `traced_model` and `conversation_run`
hand back what they are given, so the bot pays nothing for the option.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from agents.logcontext import current_conversation, current_message
from agents.loop import Escalate, Event, EventSink, HandoffRecord, Reply, ToolRecord, ToolStarted, TurnStarted
from agents.model import Model, ModelResponse, TextSink

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

EXTRA_HINT = "pip install 'helpdesk-bot[otel]'"
NOT_IN_TRACES = "healthz,metrics"
"""Requests served that make no span unless OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS says otherwise: probes and
scrapes, every few seconds."""


INSTRUMENTATIONS = (
    ("opentelemetry.instrumentation.asyncpg", "AsyncPGInstrumentor"),
    ("opentelemetry.instrumentation.aiohttp_client", "AioHttpClientInstrumentor"),
    ("opentelemetry.instrumentation.aiohttp_server", "AioHttpServerInstrumentor"),
)
"""The database, the HTTP calls to Slack, Teams and HTTP tools, and the requests served. Not the openai package's
(opentelemetry-instrumentation-openai-v2): it wraps `chat.completions.create`, which the engine does not call
(agents.model posts itself, for speed; `traced_model` makes those spans), and it imports httpx, which openai 3
no longer uses."""


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the operator asked for traces: an OTLP endpoint, or an exporter named (`none` says no)."""
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none" or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return bool(exporters or endpoint)


class Tracing:
    """Spans from the engine's seams, on one tracer provider."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("helpdesk-bot", _version())
        self._instrumentors: list[Any] = []

    def instrument(self) -> None:
        """The ecosystem's instrumentations, onto this provider: they patch their libraries process-wide. One that
        is missing or cannot load is said once and left out; the rest still trace."""
        for module, name in INSTRUMENTATIONS:
            try:
                instrumentor = getattr(importlib.import_module(module), name)()
            except ImportError as exc:
                log.warning("%s is left out of the traces: %s", module, exc)
                continue
            instrumentor.instrument(tracer_provider=self.provider)
            self._instrumentors.append(instrumentor)

    def uninstrument(self) -> None:
        for instrumentor in reversed(self._instrumentors):
            instrumentor.uninstrument()
        self._instrumentors.clear()

    def model(self, model: Model) -> Model:
        return _TracedModel(model, self.tracer)

    @contextlib.contextmanager
    def conversation_run(self, conversation_id: int, inner: EventSink | None) -> Iterator[EventSink]:
        """A span for one run of a conversation's waiting messages, current while it lasts, and the event sink
        that makes the turns' and tools' spans in it (then hands each event to `inner`)."""
        from opentelemetry.trace import SpanKind

        attributes = {"helpdesk.conversation_id": conversation_id}
        with self.tracer.start_as_current_span("conversation.run", kind=SpanKind.INTERNAL, attributes=attributes):
            spans = _TurnSpans(self.tracer, inner)
            try:
                yield spans
            except BaseException as exc:
                spans.close(f"{type(exc).__name__}: {exc}")
                raise
            spans.close("the turn ended without an outcome")


class _TracedModel:
    def __init__(self, inner: Model, tracer: Tracer) -> None:
        self.inner = inner
        self.tracer = tracer

    async def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_text: TextSink | None = None,
    ) -> ModelResponse:
        from opentelemetry.trace import SpanKind

        attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
        # Current, so that whatever the call does underneath (an HTTP span, a retry) nests in it; an exception
        # (a provider failure) is recorded on it and marks it failed.
        with self.tracer.start_as_current_span(f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes) as span:
            response = await self.inner.complete(model=model, messages=messages, tools=tools, on_text=on_text)
            span.set_attribute("gen_ai.response.model", response.model or model)
            span.set_attribute("gen_ai.usage.input_tokens", response.usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", response.usage.completion_tokens)
            if response.fallback_from is not None:
                span.set_attribute("helpdesk.fallback_from", response.fallback_from)
            return response

    async def close(self) -> None:
        closer = getattr(self.inner, "close", None)
        if closer is not None:
            await closer()


class _TurnSpans:
    """The engine's events as spans. A turn's span lasts from `TurnStarted` to its `Reply` or `Escalate` and is
    current meanwhile, so the turn's model calls and queries nest in it; a tool call's starts at `ToolStarted` and
    lasts as long as the engine measured it (`ToolRecord.duration_ms`: its record comes after all the calls it ran
    beside). Tool calls run in tasks of their own, so their spans name the turn's as parent explicitly."""

    def __init__(self, tracer: Tracer, inner: EventSink | None) -> None:
        self.tracer = tracer
        self.inner = inner
        self.turn: Span | None = None
        self.token: object = None
        self.tools: dict[str, tuple[Span, int]] = {}

    async def __call__(self, event: Event) -> None:
        self.on(event)
        if self.inner is not None:
            await self.inner(event)

    def on(self, event: Event) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import SpanKind, StatusCode

        match event:
            case TurnStarted(agent=agent):
                self.close("the turn ended without an outcome")  # the last one raised: a retry starts afresh
                attributes: dict[str, Any] = {
                    "gen_ai.conversation.id": current_conversation.get(),
                    "gen_ai.agent.name": agent,
                }
                if (message := current_message.get()) is not None:
                    attributes["helpdesk.message_id"] = message
                self.turn = self.tracer.start_span("turn", kind=SpanKind.INTERNAL, attributes=attributes)
                self.token = context.attach(trace.set_span_in_context(self.turn))
            case ToolStarted(agent=agent, call=call) if self.turn is not None:
                parent = trace.set_span_in_context(self.turn)
                attributes = {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": call.name,
                    "gen_ai.tool.call.id": call.id,
                    "gen_ai.agent.name": agent,
                }
                started = time.time_ns()
                span = self.tracer.start_span(
                    f"execute_tool {call.name}", parent, attributes=attributes, start_time=started
                )
                self.tools[call.id] = (span, started)
            case ToolRecord(call=call, ok=ok, duration_ms=duration_ms, source=source):
                if (found := self.tools.pop(call.id, None)) is None:
                    return
                span, started = found
                span.set_attribute("helpdesk.tool.source", source)
                if not ok:
                    span.set_status(StatusCode.ERROR, "the tool failed; the model was told why")
                span.end(end_time=started + int(duration_ms * 1_000_000))
            case HandoffRecord(from_agent=source, to_agent=target) if self.turn is not None:
                self.turn.add_event("handoff", {"from": source, "to": target})
            case Reply() | Escalate() if self.turn is not None:
                self.turn.set_attribute("helpdesk.outcome", "reply" if isinstance(event, Reply) else "escalate")
                if isinstance(event, Escalate):
                    self.turn.set_attribute("helpdesk.escalation.trigger", event.trigger)
                self._end()

    def close(self, problem: str) -> None:
        """Ends what a turn that raised left open, as failed."""
        from opentelemetry.trace import StatusCode

        if self.turn is not None:
            self.turn.set_status(StatusCode.ERROR, problem)
            self._end()

    def _end(self) -> None:
        from opentelemetry import context

        assert self.turn is not None
        # A look-up planned before the first call that failed or found nothing has no record (the engine leaves it
        # out of the turn): its span ends with the turn, marked.
        for span, _ in self.tools.values():
            span.set_attribute("helpdesk.tool.left_out", True)
            span.end()
        self.tools.clear()
        self.turn.end()
        self.turn = None
        with contextlib.suppress(ValueError):  # attached in another context: that context is gone with its task
            context.detach(self.token)  # type: ignore[arg-type]


# The process's tracing, set once by `start` (as OpenTelemetry's own tracer provider is, process-wide).
_started: Tracing | None = None


def start() -> bool:
    """Called once at start-up: traces exported when they are wanted (`wanted`) and the extra is installed; one
    info line when wanted without it. True when traces are on."""
    global _started
    if _started is not None or not wanted(os.environ):
        return _started is not None
    try:
        provider = _provider(os.environ)
    except ImportError as exc:
        log.info("OpenTelemetry is configured (OTEL_*) but the otel extra is not installed (%s): no traces", EXTRA_HINT)
        log.debug("missing: %s", exc.name)
        return False
    if provider is None:
        return False
    from opentelemetry import trace

    # Probes and scrapes are no one's request; read by the aiohttp server instrumentation as it starts.
    os.environ.setdefault("OTEL_PYTHON_AIOHTTP_SERVER_EXCLUDED_URLS", NOT_IN_TRACES)
    trace.set_tracer_provider(provider)  # the Agents SDK's own spans (token requests) go to it as well
    tracing = Tracing(provider)
    tracing.instrument()
    _started = tracing
    log.info("OpenTelemetry traces on (service %s)", provider.resource.attributes.get("service.name"))
    return True


def traced_model(model: Model) -> Model:
    """`model`, with a span per call when traces are on."""
    return model if _started is None else _started.model(model)


def conversation_run(
    conversation_id: int, inner: EventSink | None
) -> contextlib.AbstractContextManager[EventSink | None]:
    """Around one run of a conversation's messages: its span, and the event sink to give the engine (`inner`
    itself, possibly None, when traces are off)."""
    if _started is None:
        return contextlib.nullcontext(inner)
    return _started.conversation_run(conversation_id, inner)


def _provider(environ: Mapping[str, str]) -> TracerProvider | None:
    """The SDK's tracer provider with the exporters OTEL_TRACES_EXPORTER names (default otlp, over HTTP unless
    OTEL_EXPORTER_OTLP_PROTOCOL says grpc); None when none of them can be made. ImportError: no extra."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace import TracerProvider as SdkProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    processors: list[SpanProcessor] = []
    for name in [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",") if n.strip()]:
        if name == "console":
            processors.append(SimpleSpanProcessor(ConsoleSpanExporter()))
        elif name == "otlp":
            protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
                "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
            )
            if protocol == "grpc":
                try:
                    grpc = importlib.import_module("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
                except ImportError:
                    log.warning(
                        "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc installed; "
                        "the otel extra exports over HTTP (http/protobuf, port 4318): no traces"
                    )
                    continue
                processors.append(BatchSpanProcessor(grpc.OTLPSpanExporter()))
            else:
                processors.append(BatchSpanProcessor(HttpExporter()))
        else:
            log.warning("OTEL_TRACES_EXPORTER=%s: not an exporter this bot makes (otlp, console); ignored", name)
    if not processors:
        return None
    resource = Resource.create({"service.version": _version()})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):  # OTEL_SERVICE_NAME unset
        resource = resource.merge(Resource({"service.name": "helpdesk-bot"}))
    provider = SdkProvider(resource=resource, sampler=None if "OTEL_TRACES_SAMPLER" in environ else _sampler())
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def _sampler() -> Any:
    """Every trace, except a database statement that is not part of one: the workers poll several times a second
    while idle, and those statements would be most of what is exported."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased, Sampler, SamplingResult

    class QueriesInContext(Sampler):
        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: Any = None,
            attributes: Any = None,
            links: Any = None,
            trace_state: Any = None,
        ) -> SamplingResult:
            if attributes and ("db.system" in attributes or "db.system.name" in attributes):
                return SamplingResult(Decision.DROP)
            return ALWAYS_ON.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

        def get_description(self) -> str:
            return "QueriesInContext"

    return ParentBased(root=QueriesInContext())


def _version() -> str:
    try:
        return importlib.metadata.version("helpdesk-bot")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
