"""One forward pass for the texts that arrive together (agents.knowledge.batching), with the bundled models: the
vectors are those of one call at a time, in fewer passes; an error reaches every caller of its pass; a cancelled
caller leaves the others their vectors."""

from __future__ import annotations

import asyncio
from functools import cache

import numpy as np
import pytest

from agents.knowledge.local import LocalEmbedder, MiniLM
from agents.knowledge.multilingual import MultilingualEmbedder

MESSAGES = [
    "hi, my order DW-1002 still has not arrived",
    "which drone should I buy for shooting landscape photos?",
    "the battery of my Harrier X4 does not charge any more, what can I do",
    "refund please",
    "can I talk to a person",
    "how long does shipping to Portugal take and is there a tracking number for it",
]


@cache
def minilm() -> MiniLM:
    return MiniLM()  # loaded once for the module: a second per load on a busy machine


async def one_by_one(texts: list[str]) -> list[list[float]]:
    embedder = LocalEmbedder(minilm())
    return [(await embedder.embed([t]))[0] for t in texts]


async def test_messages_arriving_together_share_a_pass_and_get_their_own_vectors() -> None:
    embedder = LocalEmbedder(minilm())
    # Five callers at once, one of them with two texts (as a search and an ingestion would be).
    calls = [[m] for m in MESSAGES[:4]] + [MESSAGES[4:]]
    together = await asyncio.gather(*(embedder.embed(texts) for texts in calls))
    assert [len(v) for v in together] == [len(texts) for texts in calls]
    np.testing.assert_allclose(
        np.array([v for vectors in together for v in vectors]), np.array(await one_by_one(MESSAGES)), atol=1e-6
    )
    assert embedder.passes < len(calls)


async def test_a_crowd_larger_than_a_pass_is_split_and_a_large_caller_does_not_hold_the_others_back() -> None:
    embedder = LocalEmbedder(minilm())
    chunks = [f"{m} (part {i})" for i in range(40) for m in MESSAGES[:1]]
    ingestion = asyncio.create_task(embedder.embed(chunks))
    question = asyncio.create_task(embedder.embed([MESSAGES[1]]))
    [vector] = await question
    # The question went in the first pass beside the ingestion's first chunks, not after all 40 of them.
    assert not ingestion.done()
    assert len(await ingestion) == 40 and embedder.passes == 2
    np.testing.assert_allclose(vector, (await one_by_one([MESSAGES[1]]))[0], atol=1e-6)


async def test_an_error_in_a_pass_reaches_every_caller_of_it_and_the_next_pass_works() -> None:
    embedder = LocalEmbedder(minilm())
    not_text: list[str] = [12345]  # type: ignore[list-item]  # the tokenizer refuses it, failing the whole pass
    outcomes = await asyncio.gather(
        embedder.embed([MESSAGES[0]]), embedder.embed(not_text), embedder.embed([MESSAGES[1]]), return_exceptions=True
    )
    assert all(isinstance(o, TypeError) for o in outcomes), outcomes
    assert embedder.passes == 1
    [vector] = await embedder.embed([MESSAGES[0]])
    np.testing.assert_allclose(vector, (await one_by_one([MESSAGES[0]]))[0], atol=1e-6)


async def test_a_cancelled_caller_does_not_take_the_others_vectors_with_it() -> None:
    embedder = LocalEmbedder(minilm())
    tasks = [asyncio.create_task(embedder.embed([m])) for m in MESSAGES[:3]]
    # Until the pass has started in its thread, with all three texts (the embedder has no event to wait on).
    while embedder.passes == 0:  # noqa: ASYNC110
        await asyncio.sleep(0)
    tasks[1].cancel()
    first, third = await tasks[0], await tasks[2]
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]
    expected = await one_by_one([MESSAGES[0], MESSAGES[2]])
    np.testing.assert_allclose(np.array([first[0], third[0]]), np.array(expected), atol=1e-6)
    assert embedder.passes == 1
    # Cancelled before its pass: the others still go through, and the cancelled text is not run.
    tasks = [asyncio.create_task(embedder.embed([m])) for m in MESSAGES[3:6]]
    await asyncio.sleep(0)
    tasks[0].cancel()
    rest = [await t for t in tasks[1:]]
    assert [len(v) for v in rest] == [1, 1] and embedder.passes == 2


async def test_the_multilingual_model_batches_questions_and_passages_apart() -> None:
    embedder = MultilingualEmbedder()
    texts = ["¿Dónde está mi pedido?", "my order is late", "Die Batterie lädt nicht mehr"]
    queries = [(await embedder.embed_query([t]))[0] for t in texts]
    passages = [(await embedder.embed([t]))[0] for t in texts]
    before = embedder.passes
    together = await asyncio.gather(*(embedder.embed_query([t]) for t in texts), *(embedder.embed([t]) for t in texts))
    # One pass for the questions, one for the passages: e5 embeds the two with different prefixes.
    assert embedder.passes - before == 2
    np.testing.assert_allclose(np.array([v[0] for v in together]), np.array(queries + passages), atol=1e-6)
