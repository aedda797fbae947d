"""Serving without an LLM: a `Model` that answers from the knowledge base.

It speaks the same protocol as a real model, so the engine runs unchanged (handoffs, tools, escalation,
audit trail): it asks for a person with `escalate_to_human` when the customer wants one, routes with
`transfer_to_<agent>` to the agent whose knowledge (or, failing that, description) the message is most similar
to, looks the question
up with `search_knowledge`, and replies with the passages found and their sources, worded as found articles.
When nothing matches, it escalates. `FallbackModel` uses it while the real provider is failing.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from agents.errors import AgentsError, ProviderError
from agents.knowledge.embedders import Embedder
from agents.knowledge.store import KnowledgeBase
from agents.knowledge.tool import NOTHING_FOUND, passages_in, relevant
from agents.language import Language
from agents.messages import ToolCall
from agents.model import Model, ModelResponse, TextSink, Usage
from agents.texts import Text, Texts
from agents.window import spoken

log = logging.getLogger(__name__)

ASKS_FOR_PERSON = re.compile(
    r"\b(human|person|real (?:person|people)|someone real|somebody|agent|representative|operator|manager|"
    r"supervisor|staff|colleague|talk to (?:a|an|some)one|speak (?:to|with) (?:a|an|some)one"
    # The bot's other languages (agents.language), accents optional: a person, a human, an agent, someone.
    r"|persona|humano|agente|alguien|operador|"
    r"mensch(?:en)?|mitarbeiter(?:in)?|jemande[mn]|berater(?:in)?|"
    r"humain|quelqu.un|conseill[eè]re?|une personne|"
    r"pessoa|atendente|algu[eé]m)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Route:
    agent: str
    score: float
    basis: str
    """"passage" (the best passage is in this agent's collections) or "description" (the agent's description)."""


class SimilarityRouter:
    """Routes a message to the agent whose knowledge answers it: the agent owning the collection of the most
    similar passage, when that passage is similar enough to count as found (`min_passage_similarity`, the bar
    `search_knowledge` uses); else the agent whose description the message is most similar to.

    Passages first because descriptions are one line each: on bench/data/routing.jsonl routing by description
    alone was right for 69% of messages, with the passages first for 84% (README, knowledge benchmark)."""

    def __init__(
        self,
        embedder: Embedder,
        descriptions: Mapping[str, str],
        *,
        knowledge: KnowledgeBase | None = None,
        collections: Mapping[str, Sequence[str]] | None = None,
        min_passage_similarity: float | None = None,
    ) -> None:
        self.embedder = embedder
        self.descriptions = dict(descriptions)
        self.knowledge = knowledge
        self.owner = {c: agent for agent, names in (collections or {}).items() for c in names}
        self.min_passage_similarity = min_passage_similarity
        self._vectors: np.ndarray[Any, Any] | None = None

    async def route(self, text: str) -> Route:
        if self.knowledge is not None and self.owner:
            try:
                # The nearest passage of each model (collections may be embedded by two), judged by its own cut-off.
                hits = await self.knowledge.search(text, collections=list(self.owner), k=3, mode="vector")
            except AgentsError:  # e.g. a collection embedded by another model: route by description
                hits = []
            if found := relevant(hits, "", self.min_passage_similarity):
                return Route(self.owner[found[0].collection], float(found[0].similarity or 0.0), "passage")
        names = list(self.descriptions)
        if self.knowledge is not None and self.knowledge.unavailable is not None:
            return Route(names[0], 0.0, "description")  # no vectors to compare: no transfer
        try:
            if self._vectors is None:
                self._vectors = np.array(await self.embedder.embed([self.descriptions[n] for n in names]))
            query = np.array((await self.embedder.embed_query([text]))[0])
        except ProviderError:  # the stand-in for a failing provider must not fail with it
            return Route(names[0], 0.0, "description")
        scores = self._vectors @ query
        best = int(np.argmax(scores))
        return Route(names[best], float(scores[best]), "description")


OFFLINE = "offline"
"""The model name recorded for the offline stand-in's answers (llm_calls.model)."""


def _call(name: str, arguments: dict[str, Any], n: int) -> ModelResponse:
    return ModelResponse(None, (ToolCall(f"offline_{n}", name, json.dumps(arguments)),), Usage(), 0.0, OFFLINE)


def _reply(text: str) -> ModelResponse:
    return ModelResponse(text, (), Usage(), 0.0, OFFLINE)


def _found_articles(passages: Sequence[tuple[str, str]], texts: Texts, language: Language | None) -> str:
    """The passages quoted with their articles, between the bot's own words in the customer's language (an empty
    override leaves its line out)."""
    lines = [texts.get(Text.OFFLINE_FOUND, language)]
    cite = texts.get(Text.OFFLINE_SOURCE, language)
    for head, body in passages[:2]:
        excerpt = body.strip()
        excerpt = excerpt if len(excerpt) < 700 else excerpt[:700].rsplit(" ", 1)[0] + "…"
        source = re.sub(r"^\[\d+\] ", "", head)
        lines.append(f"> {excerpt}\n{cite.format(source=source)}".rstrip())
    lines.append(texts.get(Text.OFFLINE_MORE, language))
    return "\n\n".join(line for line in lines if line)


class OfflineModel:
    """Answers from the knowledge base; `min_route_score` is the similarity needed to transfer."""

    def __init__(self, router: SimilarityRouter, *, texts: Texts | None = None, min_route_score: float = 0.15) -> None:
        self.router = router
        self.texts = texts or Texts()
        """Its greeting and the words around the passages it quotes, in the language the window names
        (agents.window.speaks)."""
        self.min_route_score = min_route_score

    async def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_text: TextSink | None = None,
    ) -> ModelResponse:
        # `on_text` is not called: the answer is ready at once, so a preview of it would only cost the channel a
        # stream started and stopped around the same words.
        available = {t["function"]["name"] for t in tools}
        turn = _current_turn(messages)
        question = str(turn[0].get("content") or "") if turn else ""
        results = [m for m in turn if m.get("role") == "tool"]
        calls = sum(len(m.get("tool_calls") or []) for m in turn)
        if ASKS_FOR_PERSON.search(question) and "escalate_to_human" in available:
            return _call("escalate_to_human", {"reason": "the customer asked for a person"}, calls)
        # Only the knowledge base's passages are answered from: other results (an order looked up before the
        # first call) are written for a model, not for the customer. A question that needed such a look-up is not
        # answered by pasting help articles beside it: a colleague can read the record.
        looked_up = sorted(_looked_up(turn))
        if looked_up and "escalate_to_human" in available:
            reason = f"the question needs {', '.join(looked_up)}, which the offline mode cannot answer from"
            return _call("escalate_to_human", {"reason": reason}, calls)
        outputs = [str(r.get("content", "")) for r in results]
        passages = [passage for output in outputs for passage in passages_in(output)]
        if passages:
            return _reply(_found_articles(passages, self.texts, spoken(messages)))
        if any(output.startswith(NOTHING_FOUND[:30]) for output in outputs):
            return _call("escalate_to_human", {"reason": "no help article matches the question"}, calls)
        if not any(str(r.get("content", "")).startswith("Transferred") for r in results):
            route = await self.router.route(question)
            if f"transfer_to_{route.agent}" in available and (
                route.basis == "passage" or route.score >= self.min_route_score
            ):
                reason = (
                    f"closest passage is in {route.agent}'s knowledge ({route.score:.2f})"
                    if route.basis == "passage"
                    else f"similar to {route.agent}'s description ({route.score:.2f})"
                )
                return _call(f"transfer_to_{route.agent}", {"reason": reason}, calls)
        if "search_knowledge" in available:
            return _call("search_knowledge", {"query": question}, calls)
        return _reply(self.texts.get(Text.OFFLINE_GREETING, spoken(messages)))


def _looked_up(turn: Sequence[dict[str, Any]]) -> set[str]:
    """Tools of the turn that found a record (not passages, a transfer or a person), by name."""
    names = {c["id"]: c["function"]["name"] for m in turn for c in m.get("tool_calls") or ()}
    return {
        names[m["tool_call_id"]]
        for m in turn
        if m.get("role") == "tool"
        and names.get(m.get("tool_call_id", "")) not in (None, "search_knowledge", "escalate_to_human")
        and not str(names.get(m.get("tool_call_id", ""))).startswith("transfer_to_")
        and not passages_in(str(m.get("content", "")))
    }


def _current_turn(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The customer's latest message and everything after it."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") == "user":
            return list(messages[index:])
    return []


@dataclass(frozen=True)
class ProviderHealth:
    """How the LLM provider is doing, as this process saw its calls: for /healthz (degraded, not down: customers
    still get an apology and a colleague, or the offline stand-in's answers) and the log."""

    failing_since: datetime | None = None
    """Start of the current incident: the first failed call after the last good one; None while it answers."""
    failures: int = 0
    """Failed calls in the current incident."""
    last_error: str | None = None

    @property
    def status(self) -> str:
        return "ok" if self.failing_since is None else "degraded"


class FallbackModel:
    """The real model, watched: a provider failure (after the SDK's retries) is one incident, logged once when it
    starts, with its cause, and once when the provider answers again. With a `fallback` (LLM_OUTAGE=offline) each
    failed call is answered by it instead; without, the failure goes on to the engine, which apologises and hands
    the conversation to a colleague."""

    def __init__(self, primary: Model, fallback: Model | None, *, where: str = "the LLM provider") -> None:
        self.primary = primary
        self.fallback = fallback
        self.where = where
        self.health = ProviderHealth()

    async def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        on_text: TextSink | None = None,
    ) -> ModelResponse:
        try:
            answer = await self.primary.complete(model=model, messages=messages, tools=tools, on_text=on_text)
        except ProviderError as exc:
            self._failed(exc)
            if self.fallback is None:
                raise
            answer = await self.fallback.complete(model=model, messages=messages, tools=tools, on_text=on_text)
            return replace(answer, fallback_from=str(exc))
        if self.health.failing_since is not None:
            took = datetime.now(UTC) - self.health.failing_since
            log.warning(
                "%s answers again, after %d failed call(s) over %.0f s", self.where, self.health.failures,
                took.total_seconds(),
            )  # fmt: skip
            self.health = ProviderHealth()
        return answer

    def current_health(self) -> ProviderHealth:
        return self.health

    def _failed(self, exc: ProviderError) -> None:
        if self.health.failing_since is None:
            meanwhile = (
                "customers get the offline stand-in's answers and a colleague"
                if self.fallback is not None
                else "customers get an apology and a colleague"
            )
            log.error("%s failed (%s); %s until it answers again", self.where, exc, meanwhile)
            self.health = ProviderHealth(datetime.now(UTC), 1, str(exc))
        else:
            self.health = replace(self.health, failures=self.health.failures + 1, last_error=str(exc))
