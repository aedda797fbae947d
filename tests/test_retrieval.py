"""Retrieval on real Postgres: identifiers matched exactly and ranked first, full text trying all the
question's words before any of them, and a small collection beside a big one searched fully by vector.
Embeddings come from the fake OpenAI server (a hashed bag of words) over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.knowledge.embedders import OpenAIEmbedder
from agents.knowledge.store import KnowledgeBase
from fakes.openai_server import EMBEDDING_DIM, FakeOpenAI

Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
async def kb(sessions: Sessions, fake_llm: FakeOpenAI) -> AsyncIterator[KnowledgeBase]:
    client = openai.AsyncOpenAI(api_key="test", base_url=fake_llm.base_url, max_retries=0)
    yield KnowledgeBase(
        sessions=sessions, embedder=OpenAIEmbedder(client=client, model="fake-embed", dimensions=EMBEDDING_DIM)
    )
    await client.close()


def write(folder: Path, documents: dict[str, str]) -> list[Path]:
    folder.mkdir(exist_ok=True)
    for name, body in documents.items():
        (folder / name).write_text(body)
    return sorted(folder.iterdir())


async def test_an_identifier_finds_its_passage_first_whatever_the_wording(kb: KnowledgeBase, tmp_path: Path) -> None:
    paths = write(
        tmp_path / "docs",
        {
            "pairing.md": "# Pairing\n\n## When pairing fails\n\nIf pairing fails, reset the controller: hold the "
            "power button until the lights blink, then pair the controller again after the reset.",
            "km2.md": "# Kestrel\n\n## The KM-2 handset\n\nShips with a lanyard and a USB cable; charge it first.",
        },
    )
    await kb.ingest(paths, collection="docs", root=tmp_path)
    question = "how do i reset the km2 controller when pairing fails"
    by_vector = await kb.search(question, collections=["docs"], k=2, mode="vector")
    assert by_vector[0].source == "docs/pairing.md"  # the words agree with the other passage
    for mode in ("hybrid", "text"):
        hits = await kb.search(question, collections=["docs"], k=2, mode=mode)
        assert hits[0].source == "docs/km2.md", mode


async def test_full_text_tries_all_the_words_before_any_of_them(kb: KnowledgeBase, tmp_path: Path) -> None:
    noise = {
        f"guards-{n}.md": f"# Propeller guard {n}\n\n## Propeller guard fitting\n\n"
        + "Fit the propeller guard; the propeller guard clips on. " * 3
        for n in range(12)
    }
    answer = {"cover.md": "# Terms\n\n## Accidents\n\nThe warranty covers a cracked propeller guard once."}
    await kb.ingest(write(tmp_path / "docs", noise | answer), collection="docs", root=tmp_path)
    hits = await kb.search("propeller guard warranty", collections=["docs"], k=3, mode="text")
    assert hits[0].source == "docs/cover.md"
    # No passage has every word: any of them are searched.
    fallback = await kb.search("propeller guard refund", collections=["docs"], k=3, mode="text")
    assert len(fallback) == 3 and all(h.source.startswith("docs/guards-") for h in fallback)


async def test_a_small_collection_beside_a_big_one_gets_its_candidates(kb: KnowledgeBase, sessions: Sessions) -> None:
    """The HNSW index is shared by all collections of a dimension. Here the big collection's passages lie
    nearer the question than the small one's, so the index's nearest entries are the big one's: without
    iterative scans, the filter on the small collection left nothing (with the small collection at a third
    of the rows, the planner scans the index rather than the collection's rows)."""
    [query] = await kb.embedder.embed(["rotor arm"])
    # Random vectors, the big collection's leaning towards the question's (cosine about 0.4 against 0).
    for collection, size, lean in (("big", 6000, 0.3), ("small", 3000, 0.0)):
        await kb.ensure_collection(collection)
        async with sessions() as s, s.begin():
            document = await s.scalar(
                text(
                    "INSERT INTO kb_documents (collection, source, title, content_hash) "
                    "VALUES (:c, :c || '.md', :c, 'x') RETURNING id"
                ),
                {"c": collection},
            )
            await s.execute(
                text(
                    "INSERT INTO kb_chunks (document_id, collection, ordinal, title, text, dim, embedding) "
                    "SELECT :doc, :c, g, :c, 'passage ' || g, :dim, "
                    "(SELECT array_agg(:lean * x + (random() - 0.5) * 0.3 ORDER BY i) "
                    " FROM unnest(CAST(:q AS real[])) WITH ORDINALITY AS v(x, i) WHERE g > 0)::vector "
                    "FROM generate_series(1, :n) g"
                ),
                {"doc": document, "c": collection, "dim": EMBEDDING_DIM, "q": query, "lean": lean, "n": size},
            )
    async with sessions() as s, s.begin():
        await s.execute(text("ANALYZE kb_chunks"))
    hits = await kb.search("rotor arm", collections=["small"], k=40, mode="vector")
    assert len(hits) == 40 and {h.collection for h in hits} == {"small"}
