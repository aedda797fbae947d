"""Pacing per channel after a 429: the channel's posts go one per turn until it is quiet again, instead of every
waiting conversation trying at once. In memory, per sender: turns are a courtesy, not a guarantee (another process
paces its own)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

PACE_S = 1.0
"""Posts to a channel that answered a 429 go this far apart: Slack's "one message a second per channel" (a channel
that allows more is paced only once it has said 429 too)."""
QUIET_AFTER_S = 30.0
"""A channel paced this long ago, or a turn given out this long ago, is forgotten."""
TURN_SLACK_S = 0.05
"""A paced row that comes back this close to its turn takes it."""


@dataclass
class _Pace:
    next_s: float
    """time.monotonic() of the channel's next free turn."""
    turns: dict[int, float] = field(default_factory=dict)
    """Turns given out and not yet taken: row id -> time.monotonic()."""


class Pacing:
    def __init__(self) -> None:
        self._paced: dict[tuple[str, str], _Pace] = {}
        """Channels that answered a post with a 429 lately, by (platform, channel)."""

    def refused(self, platform: str, channel: str, retry_after_s: float) -> None:
        """After a 429 on a post to `channel`: the next post in Retry-After, then one every PACE_S; turns given out
        before it are void (their rows take new ones, in the order they come back)."""
        now = time.monotonic()
        for other, pace in list(self._paced.items()):  # channels quiet for a while: forgotten
            if pace.next_s + QUIET_AFTER_S < now:
                del self._paced[other]
        pace = self._paced.setdefault((platform, channel), _Pace(next_s=now))
        pace.next_s = max(pace.next_s, now + retry_after_s)
        pace.turns.clear()

    def turn_in(self, platform: str, channel: str, row_id: int) -> float:
        """Seconds until row `row_id` may post to `channel` (0: now). A row given a turn keeps it when it comes
        back for it; a channel with no post for PACE_S and no turn given out is no longer paced."""
        pace = self._paced.get((platform, channel))
        if pace is None:
            return 0.0
        now = time.monotonic()
        if (turn := pace.turns.pop(row_id, None)) is not None:
            if turn - now > TURN_SLACK_S:  # back early (woken for another reason): the same turn stands
                pace.turns[row_id] = turn
                return turn - now
            return 0.0
        # Turns long past were never taken (another process sent the row, or it was given up): forgotten.
        pace.turns = {row: at for row, at in pace.turns.items() if at > now - QUIET_AFTER_S}
        if pace.next_s + PACE_S < now and not pace.turns:
            del self._paced[(platform, channel)]
            return 0.0
        turn = max(pace.next_s, now)
        pace.next_s = turn + PACE_S
        if turn - now <= TURN_SLACK_S:
            return 0.0
        pace.turns[row_id] = turn
        return turn - now
