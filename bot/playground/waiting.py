"""What the emulators share: waiting for what a test expects, with what happened meanwhile when it does not come."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar, cast

T = TypeVar("T")


# A polling deadline, not a cancellation scope, hence a plain ``timeout`` parameter.
async def poll(predicate: Callable[[], T | bool | None], timeout: float, story: Callable[[], str]) -> T:  # noqa: ASYNC109
    """`predicate`'s first truthy value, polled every 20 ms; TimeoutError telling `story()` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return cast(T, value)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"condition not met within {timeout}s (last value {value!r}); {story()}")
        await asyncio.sleep(0.02)
