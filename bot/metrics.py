"""Prometheus metrics: counters kept by this process, and gauges of the shared queues read from Postgres.

A scrape reads no table. Totals (LLM calls and tokens) are counters of this process, counted as its turns commit
their calls: each process reports its own, Prometheus sums them across processes, and `rate()` and `increase()`
absorb a restart's reset to zero (the full history stays in `llm_calls`, for `/support stats`). The gauges (inbox
and outbox backlog, open cases) are the same for every process, whoever holds the work, so they come from the
database: read at most once per `ttl_s` on a connection of their own, through the partial indexes of unsent and
unprocessed rows, under a statement timeout; between reads, and when a read fails, the last values are served and
`helpdesk_gauges_age_seconds` says how old they are.

The operator's tools are counted the same way: each call a turn of this process made, by where it ran
(`helpdesk_tool_calls_total{source, outcome}` and the histogram of their duration, never by tool name, whose number
the operator's servers decide), and whether each tool source is up now (`helpdesk_tool_source_up{source, kind}`),
asked of the sources themselves at each scrape, so that a server that is down shows before a customer meets it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from agents.conversations import SET_ASIDE
from agents.db import models as m
from agents.db.deliveries import GIVEN_UP
from agents.loop import LLMCallRecord, ToolRecord
from agents.toolsets import SourceStatus
from escalation.machine import OPEN_CASE

log = logging.getLogger(__name__)

GAUGES_TTL_S = 10.0
GAUGES_TIMEOUT_MS = 2000

_GAUGES = {
    "helpdesk_inbox_backlog": (
        "customer messages stored and not yet processed",
        select(func.count()).where(m.Inbound.processed_at.is_(None)),
    ),
    "helpdesk_outbox_backlog": (
        "Slack calls owed and not yet sent",
        select(func.count()).where(m.Outbox.done_at.is_(None)),
    ),
    "helpdesk_outbox_given_up": (
        "Slack calls given up for good (failed: never counted as sent)",
        select(func.count()).select_from(m.Outbox).where(GIVEN_UP),
    ),
    "helpdesk_messages_set_aside": (
        "messages set aside after failing repeatedly (see /support status)",
        select(func.count()).select_from(m.Inbound).where(SET_ASIDE),
    ),
    "helpdesk_open_escalations": (
        "escalations waiting for or owned by a human",
        select(func.count()).where(m.Escalation.status.in_(OPEN_CASE)),
    ),
}


class DatabaseGauges(Collector):
    def __init__(self, engine: AsyncEngine, *, ttl_s: float = GAUGES_TTL_S) -> None:
        self.engine = engine
        """A small engine of their own: a scrape never waits for the workers' connections, nor they for it."""
        self.ttl_s = ttl_s
        self.values: dict[str, float] = {}
        self.read_at: float | None = None
        self._tried_at = float("-inf")
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        """Read the gauges again if they are older than `ttl_s`; concurrent scrapes share one read."""
        async with self._lock:
            if time.monotonic() - self._tried_at < self.ttl_s:
                return
            self._tried_at = time.monotonic()
            try:
                async with asyncio.timeout(GAUGES_TIMEOUT_MS / 1000 + 1), self.engine.connect() as conn:
                    await conn.execute(text(f"SET LOCAL statement_timeout = {GAUGES_TIMEOUT_MS}"))
                    row = (await conn.execute(select(*(q.scalar_subquery() for _, q in _GAUGES.values())))).one()
            except Exception as exc:  # the last values stay, and their age shows it
                log.warning("metrics: reading the gauges failed (%s)", type(exc).__name__)
                return
            self.values = dict(zip(_GAUGES, map(float, row), strict=True))
            self.read_at = time.monotonic()

    def collect(self):  # type: ignore[no-untyped-def]
        for name, (doc, _) in _GAUGES.items():
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], self.values.get(name, 0.0))
            yield gauge
        age = GaugeMetricFamily("helpdesk_gauges_age_seconds", "how old the database gauges are (-1: never read)")
        age.add_metric([], -1.0 if self.read_at is None else time.monotonic() - self.read_at)
        yield age


def source_label(status: SourceStatus) -> str:
    """A source's name as `ToolRecord.source` writes it ("http", "mcp:<server>"), so that its calls and whether it is
    up can be put side by side in a query."""
    return status.kind if status.name == status.kind else f"{status.kind}:{status.name}"


class SourceGauges(Collector):
    """Whether each tool source is up, read from the sources at each scrape: their status is in memory and cheap to
    ask, so it is always current (unlike the database gauges, nothing is cached)."""

    def __init__(self, statuses: Callable[[], Iterable[SourceStatus]]) -> None:
        self.statuses = statuses

    def describe(self):  # type: ignore[no-untyped-def]
        """What the registry checks names against when registering, so that registering asks the sources nothing."""
        yield self._family()

    def collect(self):  # type: ignore[no-untyped-def]
        up = self._family()
        try:
            statuses = list(self.statuses())
        except Exception as exc:  # a scrape must not fail because one source cannot say
            log.warning("metrics: the tool sources could not say how they are (%s)", type(exc).__name__)
            statuses = []
        for status in statuses:
            up.add_metric([source_label(status), status.kind], 1.0 if status.up else 0.0)
        yield up

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "helpdesk_tool_source_up",
            "1 when a tool source (MCP server, HTTP tools) is up, 0 when down",
            labels=["source", "kind"],
        )


LLM_FAILURE_KINDS = frozenset({"timeout", "rate_limit", "server", "connection", "other"})
"""`ProviderError.kind`s: the label's closed set."""


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.events = Counter(
            "helpdesk_events_received_total",
            "Events API deliveries by disposition",
            ["disposition"],
            registry=self.registry,
        )
        self.processed = Counter(
            "helpdesk_messages_processed_total",
            "customer messages processed, by outcome",
            ["kind"],
            registry=self.registry,
        )
        self.turn_seconds = Histogram(
            "helpdesk_turn_seconds",
            "wall time of one turn (LLM included)",
            registry=self.registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
        )
        self.rate_limited = Counter(
            "helpdesk_rate_limited_total",
            "customer messages no agent answered, being over a rate limit, by limit",
            ["scope"],
            registry=self.registry,
        )
        self.outbox_sent = Counter(
            "helpdesk_outbox_sent_total", "Slack calls sent (not those given up)", registry=self.registry
        )
        self.llm_failures = Counter(
            "helpdesk_llm_failures_total",
            "LLM calls the provider failed (after the SDK's retries), by kind",
            ["kind"],
            registry=self.registry,
        )
        self.llm_seconds = Histogram(
            "helpdesk_llm_call_seconds",
            "wall time of the provider's answered calls, retries included",
            buckets=(0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120),
            registry=self.registry,
        )
        self.llm_calls = Counter(
            "helpdesk_llm_calls_total", "LLM calls committed by this process's turns", registry=self.registry
        )
        self.prompt_tokens = Counter(
            "helpdesk_llm_prompt_tokens_total", "prompt tokens of those calls", registry=self.registry
        )
        self.completion_tokens = Counter(
            "helpdesk_llm_completion_tokens_total", "completion tokens of those calls", registry=self.registry
        )
        self.status_failures = Counter(
            "helpdesk_status_failures_total",
            "Slack AI status calls that failed (the reply goes out regardless), by error",
            ["error"],
            registry=self.registry,
        )
        self.summary_failures = Counter(
            "helpdesk_summary_failures_total",
            "running summaries not made (the agents then see more history, within the token budget)",
            registry=self.registry,
        )
        self.tool_calls = Counter(
            "helpdesk_tool_calls_total",
            "tool calls made by this process's turns, by where the tool ran and outcome (ok, failed)",
            ["source", "outcome"],
            registry=self.registry,
        )
        self.tool_seconds = Histogram(
            "helpdesk_tool_call_seconds",
            "duration of one tool call, by where the tool ran",
            ["source"],
            registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
        )
        self.gauges: DatabaseGauges | None = None
        """Set once the database is open (`watch`)."""
        self.sources: SourceGauges | None = None
        """Set once the tool sources exist (`watch_sources`)."""

    def watch(self, engine: AsyncEngine, *, ttl_s: float = GAUGES_TTL_S) -> None:
        self.gauges = DatabaseGauges(engine, ttl_s=ttl_s)
        self.registry.register(self.gauges)

    def watch_sources(self, statuses: Callable[[], Iterable[SourceStatus]]) -> None:
        """Report `helpdesk_tool_source_up` from `statuses` at each scrape (once; a second call replaces the first)."""
        if self.sources is not None:
            self.registry.unregister(self.sources)
        self.sources = SourceGauges(statuses)
        self.registry.register(self.sources)

    def tool_call(self, record: ToolRecord) -> None:
        """One tool call of a turn: counted by source and outcome, its duration observed."""
        self.tool_calls.labels(record.source, "ok" if record.ok else "failed").inc()
        self.tool_seconds.labels(record.source).observe(record.duration_ms / 1000)

    def count_tool_calls(self, records: Iterable[ToolRecord]) -> None:
        for record in records:
            self.tool_call(record)

    def count_llm_calls(self, calls: Iterable[LLMCallRecord]) -> None:
        for call in calls:
            self.llm_calls.inc()
            self.prompt_tokens.inc(call.usage.prompt_tokens)
            self.completion_tokens.inc(call.usage.completion_tokens)
            if not call.ok:
                # ProviderError's kind (timeout, rate_limit, server, connection, other) leads its message.
                kind = (call.error or "other").split(":", 1)[0].strip() or "other"
                self.llm_failures.labels(kind if kind in LLM_FAILURE_KINDS else "other").inc()
            elif call.model != "offline":
                self.llm_seconds.observe(call.latency_ms / 1000)

    def count_summary(self, call: LLMCallRecord) -> None:
        """A running summary's call (agents.summary): counted with the turns' calls, and apart when it failed."""
        self.count_llm_calls((call,))
        if not call.ok:
            self.summary_failures.inc()

    async def render(self) -> bytes:
        if self.gauges is not None:
            await self.gauges.refresh()
        return generate_latest(self.registry)
