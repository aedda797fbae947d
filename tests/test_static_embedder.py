"""The router's static embedding (agents.knowledge.static): MiniLM's vocabulary looked up, no forward pass."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np

from agents.knowledge.static import StaticEmbedder, StaticModel
from agents.router import MIN_SCORE, Router
from harness.sample import default_roster


@cache
def table() -> StaticModel:
    return StaticModel()


async def test_a_text_has_one_unit_vector_the_same_every_time() -> None:
    embedder = StaticEmbedder(table())
    first, again = await embedder.embed(["my drone will not turn on", "my drone will not turn on"])
    [alone] = await embedder.embed(["my drone will not turn on"])
    assert len(first) == embedder.dim == 256
    assert first == again == alone
    assert abs(float(np.linalg.norm(first)) - 1.0) < 1e-5
    [other] = await embedder.embed(["do you sell spare propellers?"])
    assert float(np.dot(first, other)) < 0.99


async def test_an_empty_or_unknown_text_is_a_zero_vector_that_routes_nowhere() -> None:
    embedder = StaticEmbedder(table())
    empty, unknown = await embedder.embed(["", "\U0001f9ff\U0001fae8"])  # no token, only [UNK]s
    assert not any(empty) and not any(unknown)
    router = Router(embedder, {n: a.examples for n, a in default_roster().agents.items()}, min_score=MIN_SCORE)
    assert await router.route("\U0001f9ff\U0001fae8") is None


async def test_the_router_with_it_routes_clear_messages_and_never_a_request_for_a_person() -> None:
    roster = default_roster()
    router = Router(StaticEmbedder(table()), {n: a.examples for n, a in roster.agents.items()}, min_score=MIN_SCORE)
    for example in (roster["sales"].examples[0], "which drone should I buy for shooting landscape photos?"):
        routed = await router.route(example)
        assert routed is not None and routed.agent == "sales", (example, routed)
    routed = await router.route(roster["support"].examples[0])
    assert routed is not None and routed.agent == "support"
    for person in ("is there a real person there", "I'd rather chat with an actual human about my order"):
        assert await router.route(person) is None


async def test_a_missing_table_is_reported_and_the_router_abstains(tmp_path: Path) -> None:
    embedder = StaticEmbedder(path=tmp_path)
    unavailable = await embedder.load()
    assert unavailable is not None and unavailable.why == "broken_model" and "static" in unavailable.problem
    assert not embedder.loaded
    router = Router(embedder, {n: a.examples for n, a in default_roster().agents.items()}, min_score=MIN_SCORE)
    assert await router.warm() is not None
    assert await router.route("which drone should I buy for shooting landscape photos?") is None
