"""`search_knowledge`: the agents' window on the knowledge base, with sources to cite."""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Annotated, Any

from pydantic import Field

from agents.agent import Retrieved, Retriever
from agents.db.deliveries import EXCERPT, Source
from agents.knowledge.identifiers import in_document, in_question
from agents.knowledge.store import Hit, KnowledgeBase
from agents.language import Language
from agents.tools import Cited, Tool, function_tool

NOTHING_FOUND = (
    "No article in the knowledge base answers this. Tell the customer plainly that you could not find it, "
    "do not guess, and offer to bring in a colleague (escalate_to_human) if they want."
)
MIN_TEXT_MATCH = 0.5
"""A passage found only by full text counts as found when it holds at least this share of the question's words:
one shared word ("open", "write") is not an answer."""


def relevant(hits: Sequence[Hit], query: str, min_similarity: float | None = None) -> list[Hit]:
    """Hits close enough to the question in meaning (by `min_similarity`, or unset, by the cut-off of the model
    that ranked each), or that contain a product code the question names (embeddings blur codes; an exact match is
    the strongest evidence there is). A passage that could only be searched by full text has no similarity to
    judge it by: it must hold most of the question's words."""
    codes = in_question(query)
    return [
        h
        for h in hits
        if (h.similarity is not None and h.similarity >= _cut_off(h, min_similarity))
        or bool(codes & in_document(h.text))
        or (not h.vector_searched and (h.text_match or 0.0) >= MIN_TEXT_MATCH)
    ]


def _cut_off(hit: Hit, min_similarity: float | None) -> float:
    if min_similarity is not None:
        return min_similarity
    return hit.min_similarity if hit.min_similarity is not None else math.inf


def written_in(languages: Sequence[Language]) -> str:
    """What the tool tells the model of the articles' languages: a model for one language (the English one) does
    not match a question in another, so the model is asked to write its query in theirs."""
    if not languages:
        return ""
    names = [language.english_name for language in languages]
    if len(names) == 1:
        return f" The articles are in {names[0]}: write the query in {names[0]}."
    listed = ", ".join(names[:-1]) + f" and {names[-1]}"
    return f" The articles are in {listed}: write the query in one of these languages."


def format_hits(hits: Sequence[Hit]) -> str:
    return "\n\n".join(f"[{n}] {hit.citation}\n{hit.text}" for n, hit in enumerate(hits, 1))


def passages_in(result: str) -> list[tuple[str, str]]:
    """(head "[n] citation", text) of each passage in what the search showed; [] when it found nothing."""
    if not result.startswith(PASSAGES):
        return []
    blocks = re.split(r"\n\n(?=\[\d+\] )", result.removeprefix(PASSAGES).strip("\n"))
    return [(head, body) for head, _, body in (block.partition("\n") for block in blocks)]


PASSAGES = "Answer only from these passages; cite those you use as [n] Title (link):"
"""Opens what the model is shown for passages found: short, since it travels with every call of the turn."""


def answer_from(hits: Sequence[Hit]) -> str:
    """What the model is shown for passages found, by the tool or before the first call."""
    return f"{PASSAGES}\n\n{format_hits(hits)}"


def sources_of(hits: Sequence[Hit]) -> tuple[Source, ...]:
    """The passages as an answer cites them, in the order the model was shown them."""
    return tuple(Source(h.title, h.heading, h.source, _excerpt(h.text)) for h in hits)


def _excerpt(text: str) -> str:
    words = " ".join(text.split())
    if len(words) <= EXCERPT:
        return words
    cut = words[: EXCERPT - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + "…"


CHARS_PER_TOKEN = 4
"""A rough count, as the token budget of the window counts (agents.window)."""


def within(hits: Sequence[Hit], budget_tokens: int) -> list[Hit]:
    """The best passages whose text fits the budget, best first; the best one is kept, cut to the budget, even
    when it alone is larger."""
    room = budget_tokens * CHARS_PER_TOKEN
    kept: list[Hit] = []
    for hit in hits:
        if len(hit.text) > room:
            if not kept and room > 0:
                kept.append(replace(hit, text=hit.text[:room].rstrip() + "…"))
            break
        kept.append(hit)
        room -= len(hit.text)
    return kept


Finder = Callable[[str], Awaitable[list[Hit]]]


def _finder(kb: KnowledgeBase, collections: Sequence[str], k: int, min_similarity: float | None) -> Finder:
    async def found(query: str) -> list[Hit]:
        return relevant(await kb.search(query, collections=collections, k=k), query, min_similarity)

    return found


def search_knowledge_tool(
    kb: KnowledgeBase, *, collections: Sequence[str], k: int = 4, min_similarity: float | None = None
) -> Tool:
    return knowledge_search(kb, collections=collections, k=k, min_similarity=min_similarity)[0]


def knowledge_search(
    kb: KnowledgeBase, *, collections: Sequence[str], k: int = 4, min_similarity: float | None = None
) -> tuple[Tool, Retriever]:
    """`search_knowledge`, and the same search run on the customer's message before the agent's first call
    (agents.loop): only passages that clear `min_similarity` (unset: each model's own), within a token budget,
    shown as the tool shows them. The description names the articles' languages, as the knowledge base last read
    them (`KnowledgeBase.languages`), for the model to search in theirs; the search before the first call uses the
    customer's own words."""
    scope = ", ".join(collections) or "all collections"
    found = _finder(kb, collections, k, min_similarity)

    async def search_knowledge(
        query: Annotated[str, Field(min_length=2, description="In the customer's terms")],
    ) -> Cited | str:
        hits = await found(query)
        return Cited(answer_from(hits), sources_of(hits)) if hits else NOTHING_FOUND

    description = f"Search our documents ({scope})." + written_in(kb.languages(collections))
    tool: Tool = function_tool(search_knowledge, description=description)

    async def retrieve(message: str, budget_tokens: int) -> Retrieved | None:
        hits = within(await found(message), budget_tokens) if len(message.strip()) >= 2 else []
        arguments: dict[str, Any] = {"query": message}
        return Retrieved(tool.name, arguments, answer_from(hits), sources_of(hits)) if hits else None

    return tool, retrieve
