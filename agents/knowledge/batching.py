"""One forward pass for the texts that arrive together: a micro-batcher in front of a local model.

Under a crowd each message comes as a call of its own (the router's, then the search's), and a model run one short
text at a time pays its per-call cost (a thread hop, Python around each layer, all of its weights read from memory
for a few tokens) for every message.
`Batcher.run(encode, texts)` queues the texts; one drain task per batcher takes the waiting calls, runs `encode` once
on up to `limit` texts in the batcher's own thread, and hands each call its own rows. Texts that arrive while a pass
runs wait for the next one, so a crowd is coalesced without a timer. A call that finds the model idle starts at
once, with the calls made in the same turn of the event loop: waiting 2 or 5 ms for company saved almost no passes
(100 messages arriving 2, 8 or 20 ms apart: 9, 75 and 93 passes with 2 ms, 9, 76 and 95 without) and added that
wait to a lone message's latency.

One pass at a time per model: the drain task is the only one that runs `encode`. A pass takes texts from the waiting
calls in turn (a large ingestion cannot hold a customer's question behind all of its chunks), and only calls of one
`encode` (a model's query and passage modes are not mixed). An error in a pass goes to every call that had texts in
it; a cancelled caller's rows are dropped, and the others still get theirs.

One thread per model, not the event loop's shared pool: glibc gives each thread that allocates its own malloc arena,
and a forward pass's temporaries grow it by 8-25 MB that stay resident; passes spread over the pool's threads grew
one arena per thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

T = TypeVar("T")
Array = NDArray[np.float32]
Encode = Callable[[list[str]], Array]

LIMIT = 32
"""Texts per pass (`MiniLM.encode`'s batch too): 32 short messages take about 140 ms on one core; a longer pass
would only delay the callers that arrive during it."""


@dataclass(eq=False)
class _Call:
    encode: Encode
    texts: list[str]
    done: asyncio.Future[list[list[float]]]
    rows: list[list[float]] = field(init=False)
    taken: int = 0
    """Texts already handed to a pass."""

    def __post_init__(self) -> None:
        self.rows = [[] for _ in self.texts]


class Batcher:
    """Coalesces concurrent calls into passes of `encode`, one at a time, each in the batcher's thread."""

    def __init__(self, *, limit: int = LIMIT, name: str = "model") -> None:
        self.limit = limit
        self.passes = 0
        """Forward passes run so far (one per `encode` call)."""
        self.name = name
        self._waiting: list[_Call] = []
        self._drain: asyncio.Task[None] | None = None
        self._thread: ThreadPoolExecutor | None = None
        """Started at the first use, so a model never used has none."""

    async def in_thread(self, work: Callable[[], T]) -> T:
        """`work()` in the batcher's thread (the model's passes, and its loading, whose arena they then reuse)."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        return await asyncio.get_running_loop().run_in_executor(self._thread, work)

    def close(self) -> None:
        """Let the thread end once its pass is over; a later call starts another."""
        if self._thread is not None:
            self._thread.shutdown(wait=False)
            self._thread = None

    async def run(self, encode: Encode, texts: list[str]) -> list[list[float]]:
        """`encode(texts)` as plain lists of floats, in one pass with whatever other texts are waiting."""
        if not texts:
            return []
        call = _Call(encode, list(texts), asyncio.get_running_loop().create_future())
        self._waiting.append(call)
        if self._drain is None:
            self._drain = asyncio.create_task(self._run_passes())
        return await call.done

    async def _run_passes(self) -> None:
        try:
            while self._waiting:
                await self._one_pass()
        finally:
            self._drain = None
            for call in self._waiting:  # only when the drain itself is cancelled (the loop shutting down)
                call.done.cancel()
            self._waiting.clear()

    async def _one_pass(self) -> None:
        self._waiting = [c for c in self._waiting if not c.done.done()]
        if not self._waiting:
            return
        encode = self._waiting[0].encode
        calls = [c for c in self._waiting if c.encode == encode]
        picked: list[tuple[_Call, int]] = []
        while len(picked) < self.limit and any(c.taken < len(c.texts) for c in calls):
            for call in calls:  # in turn, one text each, so no call holds the others back
                if call.taken < len(call.texts) and len(picked) < self.limit:
                    picked.append((call, call.taken))
                    call.taken += 1
        in_pass = {id(c): c for c, _ in picked}.values()
        self.passes += 1
        try:
            texts = [c.texts[i] for c, i in picked]
            vectors = await self.in_thread(lambda: encode(texts))
        except Exception as exc:
            for call in in_pass:
                if not call.done.done():
                    call.done.set_exception(exc)
            return
        # One `.tolist()` for the pass: converting row by row in Python costs more than a short text's pass.
        for (call, i), row in zip(picked, vectors.tolist(), strict=True):
            call.rows[i] = row
        for call in in_pass:
            if call.taken == len(call.texts) and not call.done.done():
                call.done.set_result(call.rows)
