"""What a process that runs turns loads before it says it is ready: ready means warm.

The router's examples embedded, the local embedding models the stored collections are searched with loaded, and the
language detector loaded: seconds of work that the first customers after a start would otherwise wait for. They
run side by side in the background while the process already listens, so /healthz can say what it is waiting for
(`pending`, with 503); a step that fails ends all the same, since each part has a degraded way to answer (the model
routes, full-text search), and /healthz names it (`failed`) beside the existing reports. A process that runs no
turns (PROCESS_ROLE=web) has no steps and is warm at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from agents import language
from agents.knowledge.local import LocalEmbedder
from agents.knowledge.multilingual import MultilingualEmbedder
from agents.knowledge.store import KnowledgeBase
from agents.router import Router

log = logging.getLogger(__name__)

Step = Callable[[], Awaitable[str | None]]
"""One part's warm-up: None when it is warm, else why it could not be warmed (the part then runs degraded)."""


def steps(*, router: Router | None, knowledge: KnowledgeBase, runs_turns: bool) -> dict[str, Step]:
    """What a process warms: nothing unless it runs turns; then the router (when on), the knowledge base's local
    models and the language detector."""
    if not runs_turns:
        return {}
    warming: dict[str, Step] = {"knowledge": lambda: _local_models(knowledge), "language": _language}
    if router is not None:
        warming["router"] = router.warm
    return warming


async def _language() -> None:
    await asyncio.to_thread(language.warm)


async def _local_models(knowledge: KnowledgeBase) -> str | None:
    """The local models the stored collections were embedded with, loaded (the English one usually is already, by
    the start-up's probe; the multilingual one otherwise waits for the first search of a collection not in
    English). One that cannot be loaded leaves the knowledge base on full text, as a first search would."""
    if knowledge.unavailable is not None and knowledge.unavailable.why == "disabled":
        return None  # EMBEDDINGS=none: no search embeds, so no model is worth its 100 MB
    used = {collection.embedder for collection in (await knowledge.status()).collections}
    for model in knowledge.models:
        if model.name not in used or not isinstance(model, LocalEmbedder | MultilingualEmbedder):
            continue
        if (unavailable := await model.load()) is not None:
            if knowledge.unavailable is None:
                knowledge.unavailable = unavailable
                log.warning("knowledge search is full text only. %s", unavailable)
            return str(unavailable)
    return None


class WarmUp:
    def __init__(self, steps: dict[str, Step]) -> None:
        self.steps = steps
        self.pending: set[str] = set()
        """The steps still running: /healthz's `warming`."""
        self.failed: dict[str, str] = {}
        """Each step that failed, and why: /healthz shows them."""
        self._done = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = 0.0

    @property
    def warm(self) -> bool:
        """Every step over, whether it worked or not."""
        return self._done.is_set()

    def start(self) -> None:
        self._started = time.perf_counter()
        self.pending = set(self.steps)
        if not self.steps:
            self._done.set()
            return
        log.info("warming up before saying ready: %s", ", ".join(sorted(self.steps)))
        self._tasks = [
            asyncio.create_task(self._run(name, step), name=f"warm-{name}") for name, step in self.steps.items()
        ]

    async def wait(self) -> None:
        await self._done.wait()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, name: str, step: Step) -> None:
        try:
            why = await step()
        except Exception as exc:  # a step's own failure must not keep the process unready for ever
            why = f"{type(exc).__name__}: {exc}"
        if why is not None:
            self.failed[name] = why
            log.warning("warm-up of %s failed, running without it: %s", name, why)
        self.pending.discard(name)
        if not self.pending:
            self._done.set()
            took = time.perf_counter() - self._started
            if self.failed:
                log.warning("warm in %.1f s, degraded: %s", took, ", ".join(sorted(self.failed)))
            else:
                log.info("warm in %.1f s (%s)", took, ", ".join(sorted(self.steps)))
