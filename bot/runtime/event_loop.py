"""The event loop the bot's long-running processes run on (`EVENT_LOOP`): uvloop where it is installed, since every
ack, post and database round trip is a handful of socket operations, each several times cheaper on libuv than on the
standard library's selector loop; the standard library's otherwise (Windows, or `EVENT_LOOP=asyncio`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def factory(wanted: Literal["uvloop", "asyncio"]) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory when it is wanted and installed; None: the standard library's loop."""
    if wanted != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:  # not installed for this platform (Windows): the standard loop, said in the ready line
        log.info("uvloop is not installed here: running on asyncio's own event loop")
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], wanted: Literal["uvloop", "asyncio"]) -> T:
    """`asyncio.run` on the loop `wanted` names (or the standard one when uvloop is missing)."""
    with asyncio.Runner(loop_factory=factory(wanted)) as runner:
        return runner.run(main)


def name() -> str:
    """The running loop's kind, for the ready line and the log: `uvloop` or `asyncio`."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
