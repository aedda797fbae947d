"""Routing a customer's message without a model call, only when it is safe.

Each agent declares short customer-style `examples` of what it handles (`Agent.examples`); the router embeds
them once per process and scores a message by its k nearest examples per agent (the mean of their cosines).
Its score is the margin of the best agent over the runner-up, so a message that sits between two agents'
examples scores low however similar it is to both. Below `min_score` it abstains and the model routes, as
before; it also abstains for a message that asks for a person (`ASKS_FOR_PERSON`, or nearest to
`PERSON_EXAMPLES`), which must never go to an agent.

The bot embeds with a static table distilled from the bundled MiniLM (`agents.knowledge.static`: a look-up, no
forward pass; `bot.runtime.calibrated_router`), whatever the knowledge base searches with. The threshold is calibrated
on bench/data/routing.jsonl with it and checked on bench/data/routing_b.jsonl (`python -m bench routing`, which
shows MiniLM's figures beside it): precision at least 0.97 is the bar.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from agents.knowledge.embedders import Embedder
from agents.offline import ASKS_FOR_PERSON

PERSON = "_person"
"""The class of `PERSON_EXAMPLES`: nearest to it, the router abstains."""

PERSON_EXAMPLES: tuple[str, ...] = (
    "can I talk to someone please",
    "I'd rather chat with an actual human",
    "put me through to your team",
    "is there a real person there",
    "I don't want a bot, get me a person",
    "connect me to customer service staff",
    "can somebody from your team call me back",
    "I want to complain to whoever is in charge",
    "let me speak to a representative",
    "stop, I need a human to look at this",
)
"""Ways of asking for a person that the regular expression may miss; written for this module, not from a set."""

MIN_SCORE = 0.08
"""The default threshold (ROUTER_MIN_SCORE), for the static embedder: the lowest (in steps of 0.01) with precision
>= 0.97 on routing.jsonl, chosen there alone; routing_b.jsonl has 1.00 there too, but 0.967 (one message) at 0.075.
The static table's margins are about a third of MiniLM's, whose threshold was 0.24 (bench/routing.py)."""

K = 3
"""Nearest examples per agent that make its similarity: one is noisy, many blur a small agent's examples."""


@dataclass(frozen=True)
class Routed:
    agent: str
    score: float
    """The best agent's margin over the runner-up (mean cosine of the K nearest examples each)."""

    @property
    def reason(self) -> str:
        """How the switch is recorded (handoffs.reason)."""
        return f"router {self.score:.2f}"


@dataclass(frozen=True)
class Scored:
    """The router's view of one message before the threshold: what it would name and how confidently; the
    benchmark sweeps thresholds over these."""

    agent: str | None
    """None: the message asks for a person (or it could not be embedded)."""
    score: float


def acts_on(agent: str, *, entry: str, text: str, active: str | None = None, answering: bool = False) -> bool:
    """Whether the engine takes a route the router names (the routing sets measure the router alone, with no
    active agent). To the entry agent only for a question ("what are your opening hours?" to a specialist): a
    customer saying "thanks" or "yes" stays with the specialist following up. Away from a specialist that has just
    asked the customer something (`answering`) only for a question of their own: "the Harrier X4", answering
    support's "which model do you have?", is support's to read, however much it looks like sales'."""
    if agent == entry and "?" not in text:
        return False
    return not (answering and active not in (None, entry) and "?" not in text)


class Router:
    """Names the agent for a message, or abstains (None). Embeds the examples on first use, once."""

    def __init__(
        self,
        embedder: Embedder,
        examples: Mapping[str, Sequence[str]],
        *,
        min_score: float,
        k: int = K,
        query_vector: Callable[[str], Awaitable[list[float] | None]] | None = None,
    ) -> None:
        self.embedder = embedder
        self.query_vector = query_vector or self._embedded
        """A message's vector from `embedder`: the knowledge base's remembered one when it embeds with the same
        model, so that the search before the first call does not embed the message again."""
        self.labels = [name for name, texts in examples.items() if texts]
        self.texts = {name: tuple(examples[name]) for name in self.labels} | {PERSON: PERSON_EXAMPLES}
        self.min_score = min_score
        self.k = k
        self._vectors: dict[str, NDArray[np.float32]] | None = None
        self._lock = asyncio.Lock()

    async def _examples(self) -> dict[str, NDArray[np.float32]]:
        async with self._lock:
            if self._vectors is None:
                names = list(self.texts)
                flat = [t for n in names for t in self.texts[n]]
                vectors = np.array(await self.embedder.embed(flat), dtype=np.float32)
                out, start = {}, 0
                for n in names:
                    out[n] = vectors[start : start + len(self.texts[n])]
                    start += len(self.texts[n])
                self._vectors = out
            return self._vectors

    async def _embedded(self, text: str) -> list[float]:
        [vector] = await self.embedder.embed([text])
        return vector

    async def warm(self) -> str | None:
        """Load the model and embed the examples now (at start-up, before the process says it is ready), not on the
        first message, which would wait seconds for it. None when done, else why not: a failure is left for `route`,
        which abstains (and tries again at the next message)."""
        try:
            await self._examples()
        except Exception as exc:  # routing without a call is an optimisation: the first message routes by the model
            return f"could not embed its examples ({type(exc).__name__}: {exc}); the model routes until it can"
        return None

    async def score(self, text: str) -> Scored:
        if ASKS_FOR_PERSON.search(text):
            return Scored(None, 0.0)
        examples = await self._examples()
        vector = await self.query_vector(text)
        if vector is None:
            return Scored(None, 0.0)
        query = np.array(vector, dtype=np.float32)
        similarity = {name: float(np.sort(vectors @ query)[-self.k :].mean()) for name, vectors in examples.items()}
        ranked = sorted(similarity, key=similarity.__getitem__, reverse=True)
        best, second = ranked[0], ranked[1]
        if best == PERSON:
            return Scored(None, 0.0)
        return Scored(best, similarity[best] - similarity[second])

    async def route(self, text: str) -> Routed | None:
        """The agent for `text` when the router is sure enough; None to leave it to the model. An embedder
        that fails leaves it to the model too: routing without a call is an optimisation, never a failure."""
        if not text.strip() or len(self.labels) < 2:
            return None
        try:
            scored = await self.score(text)
        except Exception:  # a provider's or a broken local model's failure: the model routes, as without a router
            return None
        if scored.agent is None or scored.score < self.min_score:
            return None
        return Routed(scored.agent, scored.score)
