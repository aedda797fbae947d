"""The Driftwing sample as tests and benchmarks use it: its declaration built into a roster, without starting
anything (its tools are Python tools)."""

from __future__ import annotations

from agents.agent import Roster
from agents.knowledge.store import KnowledgeBase
from bot.declaration.build import SAMPLE, build
from bot.declaration.parse import load

KNOWLEDGE_OF: dict[str, tuple[str, ...]] = {"sales": ("catalogue",), "support": ("support",)}
"""The collections the sample's agents search, as its declaration says."""


def default_roster(knowledge: KnowledgeBase | None = None, *, min_similarity: float = 0.35) -> Roster:
    """The sample's three agents; with a knowledge base, sales and support search it."""
    return build(load(SAMPLE)).roster(knowledge, min_similarity=min_similarity)


SAMPLE_KNOWLEDGE = SAMPLE.parent / "knowledge"
SAMPLE_VECTORS = SAMPLE_KNOWLEDGE / "vectors.npz"
"""The sample's passages embedded by the local model, so that a first start need not embed them (checked against the
model before use; `scripts/sample_vectors.py` writes it)."""
SAMPLE_COLLECTIONS = ("catalogue", "support")
