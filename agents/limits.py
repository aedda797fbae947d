"""Rate limits: how many messages of one person, and of one channel, the agents answer a minute, and how many
tokens one person's messages may cost a UTC day. Over a limit a message gets no turn: it is stored and kept in
the transcript as always, and the person is told once per window.

The counts live in `rate_counters`, one row per person and per channel, updated in place: the turn's first
statement reads its author's and its channel's rows by primary key (`READ_COLUMNS`, `READ_JOINS`), the turn's
commit adds to them (`COUNT`), both under the conversation's lease; a notice is claimed on the author's row
(`TELL`) so that conversations of one person limited at once give one. Conversations of one person running at
once may each pass a per-minute limit by one: the limits are a brake on cost, not an exact quota.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agents import leases
from agents.address import Address
from agents.db.statements import Statement
from agents.loop import TurnResult
from agents.texts import Window


class Scope(StrEnum):
    """Whose row of `rate_counters`: the message's author, or the channel of its conversation."""

    USER = "user"
    CHANNEL = "channel"


class Limit(StrEnum):
    """The limit a message was over (its outcome's `limited_by`, the metrics' `scope`)."""

    USER = "user"
    """Messages one person sends that an agent answers, per minute."""
    CHANNEL = "channel"
    """The same, over all the conversations of one channel."""
    DAILY_TOKENS = "daily_tokens"
    """Prompt and completion tokens of one person's messages, per UTC day."""

    @property
    def window(self) -> Window:
        """When the agents answer again (the notice's `{when}`, in the customer's words: agents.texts.WHEN)."""
        return "day" if self is Limit.DAILY_TOKENS else "minute"


@dataclass(frozen=True)
class Counts:
    """The author's and the channel's use so far, as the turn's first statement read it."""

    user_minute: int = 0
    """Messages of the author an agent answered this minute."""
    channel_minute: int = 0
    user_day_tokens: int = 0
    told: bool = False
    """The author was told of a limit whose window has not ended: no second notice."""


@dataclass(frozen=True)
class Limits:
    """0 switches a limit off; all off (the default), nothing is counted."""

    user_per_minute: int = 0
    channel_per_minute: int = 0
    daily_tokens_per_user: int = 0

    def exceeded(self, counts: Counts) -> Limit | None:
        """The limit this message is over, the one with the longest window first (what the notice says)."""
        if self.daily_tokens_per_user and counts.user_day_tokens >= self.daily_tokens_per_user:
            return Limit.DAILY_TOKENS
        if self.user_per_minute and counts.user_minute >= self.user_per_minute:
            return Limit.USER
        if self.channel_per_minute and counts.channel_minute >= self.channel_per_minute:
            return Limit.CHANNEL
        return None

    def counters(self, turn: TurnResult | None) -> list[dict[str, Any]]:
        """What an agent's turn adds to the counters (`COUNT`'s `:counters`): only the rows a limit in force
        reads, so that with the limits off a turn writes none."""
        if turn is None:
            return []
        rows: list[dict[str, Any]] = []
        if self.user_per_minute or self.daily_tokens_per_user:
            tokens = sum(c.usage.prompt_tokens + c.usage.completion_tokens for c in turn.llm_calls)
            rows.append({"scope": Scope.USER, "tokens": tokens})
        if self.channel_per_minute:
            rows.append({"scope": Scope.CHANNEL, "tokens": 0})
        return rows


NO_LIMITS = Limits()

_MINUTE = "date_trunc('minute', now())"
_TODAY = "CAST(timezone('UTC', now()) AS date)"

READ_COLUMNS = f"""
       CASE WHEN ru.minute = {_MINUTE} THEN ru.answered ELSE 0 END AS user_minute,
       CASE WHEN rc.minute = {_MINUTE} THEN rc.answered ELSE 0 END AS channel_minute,
       CASE WHEN ru.day = {_TODAY} THEN ru.tokens ELSE 0 END AS user_day_tokens,
       coalesce(ru.told_until > now(), false) AS told"""
"""`Counts`' columns, for the turn's first statement, over READ_JOINS."""

READ_JOINS = f"""
LEFT JOIN rate_counters ru ON ru.scope = '{Scope.USER}' AND ru.name = n.author
LEFT JOIN rate_counters rc ON rc.scope = '{Scope.CHANNEL}' AND rc.name = {Address.channel_sql("l.key")}"""
"""The counters' rows (primary key lookups), joined to the first statement's lease `l` (the key) and next
message `n` (its author)."""

COUNT = f"""
counted AS (
    INSERT INTO rate_counters AS r (scope, name, minute, answered, day, tokens)
    SELECT x.scope, x.name, {_MINUTE}, 1, {_TODAY}, x.tokens
    FROM (
        SELECT c.scope, c.tokens, CASE c.scope WHEN '{Scope.USER}' THEN CAST(:customer AS text)
                                  ELSE {Address.channel_sql("CAST(:key AS text)")} END AS name
        FROM jsonb_to_recordset(CAST(:counters AS jsonb)) AS c(scope text, tokens bigint)
    ) x, conv
    WHERE x.name IS NOT NULL
    ON CONFLICT (scope, name) DO UPDATE
    SET answered = CASE WHEN r.minute = excluded.minute THEN r.answered ELSE 0 END + 1,
        tokens = CASE WHEN r.day = excluded.day THEN r.tokens ELSE 0 END + excluded.tokens,
        minute = excluded.minute, day = excluded.day
)"""
"""A common table expression for the turn's commit, fenced by its `conv`: counts the answered message and its
tokens (`:counters`, `Limits.counters`) on the rows of the author (`:customer`) and of the channel of `:key`,
starting a new minute or day as it comes."""

TELL = Statement(
    f"""
INSERT INTO rate_counters AS r (scope, name, minute, day, told_until)
SELECT '{Scope.USER}', CAST(:author AS text), {_MINUTE}, {_TODAY},
       CASE WHEN CAST(:limit AS text) = '{Limit.DAILY_TOKENS}' THEN date_trunc('day', now(), 'UTC') + interval '1 day'
            ELSE {_MINUTE} + interval '1 minute' END
WHERE CAST(:author AS text) IS NOT NULL
  AND EXISTS (SELECT FROM conversations WHERE id = :id AND {leases.HELD})
ON CONFLICT (scope, name) DO UPDATE SET told_until = excluded.told_until
WHERE r.told_until IS NULL OR r.told_until <= now()
RETURNING 1
"""
)
"""Marks the author told until the end of `:limit`'s window, unless someone was quicker (the row's lock makes
a concurrent claim wait and then see it taken): a row back means this message carries the notice."""
