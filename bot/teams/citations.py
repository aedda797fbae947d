"""An AI agent's answer as Teams marks it (learn.microsoft.com, "Bot messages with AI-generated content"): one root
`https://schema.org/Message` entity with the "AI generated" label and the answer's citations. Each citation is a
`Claim` whose `position` is an `[n]` marker in the text, where Teams shows it; Teams refuses (400) a second root
message entity, more than 20 citations, and an empty `appearance`, and shows at most 80 characters of a
citation's name and 160 of its abstract.

The model was asked to cite the passages it used as `[n]` (`agents.knowledge.tool`), in the order it was shown
them, which is the sources' order: its markers are kept, and the sources it did not mark are marked at the end, so
that every citation can be opened.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from microsoft_agents.activity import AIEntity, ClientCitation, ClientCitationAppearance

from agents.db.deliveries import Source
from bot.teams.limits import clip

MAX_CITATIONS = 20
NAME = 80
ABSTRACT = 160
AI_GENERATED = "AIGeneratedContent"
_MARKER = re.compile(r"\\\[(\d{1,2})\\\](?!\()")
"""`[n]` as `bot.teams.text` writes a model's `[n]`: escaped, so it is no link. Not before `(`, where unescaping it
would make a link of the text that follows."""


def labelled(text: str, sources: Sequence[Source]) -> tuple[str, AIEntity]:
    """The answer's text with a marker for each citation, and the entity that labels it AI-made and holds the
    citations."""
    cited = list(sources)[:MAX_CITATIONS]
    marked = _MARKER.sub(lambda m: f"[{m[1]}]" if 1 <= int(m[1]) <= len(cited) else m[0], text)
    missing = [n for n in range(1, len(cited) + 1) if f"[{n}]" not in marked]
    if missing:
        marked = marked.rstrip() + "\n\n" + " ".join(f"[{n}]" for n in missing)
    citations = [
        ClientCitation(
            position=n,
            appearance=ClientCitationAppearance(
                name=clip(source.label, NAME), abstract=clip(source.excerpt or source.label, ABSTRACT), url=source.url
            ),
        )
        for n, source in enumerate(cited, 1)
    ]
    entity = AIEntity(type="https://schema.org/Message", id="", additional_type=[AI_GENERATED])
    if citations:  # set only when there are any: Teams reads an empty or null list as a malformed entity
        entity.citation = citations
    return marked, entity
