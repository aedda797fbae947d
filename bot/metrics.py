"""Prometheus metrics: counters kept by this process, and gauges read from Postgres at scrape time (so every
process reports the same backlog, whoever holds it)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.conversations import SET_ASIDE
from db import models as m
from db.deliveries import GIVEN_UP
from escalation.machine import OPEN_CASE


class _DatabaseGauges(Collector):
    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def collect(self):  # type: ignore[no-untyped-def]
        docs = {
            "helpdesk_inbox_backlog": "customer messages stored and not yet processed",
            "helpdesk_outbox_backlog": "Slack calls owed and not yet sent",
            "helpdesk_outbox_given_up": "Slack calls given up for good (failed: never counted as sent)",
            "helpdesk_messages_set_aside": "messages set aside after failing repeatedly (see /support status)",
            "helpdesk_open_escalations": "escalations waiting for or owned by a human",
            "helpdesk_llm_calls_total": "LLM calls recorded in the audit trail",
            "helpdesk_llm_prompt_tokens_total": "prompt tokens recorded in the audit trail",
            "helpdesk_llm_completion_tokens_total": "completion tokens recorded in the audit trail",
        }
        for name, doc in docs.items():
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], self.values.get(name, 0.0))
            yield gauge


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
        self._db = _DatabaseGauges()
        self.registry.register(self._db)

    async def render(self, sessions: async_sessionmaker[AsyncSession]) -> bytes:
        async with sessions() as s:
            unprocessed = m.Inbound.processed_at.is_(None)
            self._db.values = {
                "helpdesk_inbox_backlog": await s.scalar(select(func.count()).where(unprocessed)) or 0,
                "helpdesk_outbox_backlog": await s.scalar(select(func.count()).where(m.Outbox.done_at.is_(None))) or 0,
                "helpdesk_outbox_given_up": await s.scalar(select(func.count()).select_from(m.Outbox).where(GIVEN_UP))
                or 0,
                "helpdesk_messages_set_aside": await s.scalar(
                    select(func.count()).select_from(m.Inbound).where(SET_ASIDE)
                )
                or 0,
                "helpdesk_open_escalations": await s.scalar(
                    select(func.count()).where(m.Escalation.status.in_(OPEN_CASE))
                )
                or 0,
            }
            calls, prompt, completion = (
                await s.execute(
                    select(
                        func.count(),
                        func.coalesce(func.sum(m.LLMCall.prompt_tokens), 0),
                        func.coalesce(func.sum(m.LLMCall.completion_tokens), 0),
                    )
                )
            ).one()
            self._db.values |= {
                "helpdesk_llm_calls_total": calls,
                "helpdesk_llm_prompt_tokens_total": prompt,
                "helpdesk_llm_completion_tokens_total": completion,
            }
        return generate_latest(self.registry)
