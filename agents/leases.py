"""Per-conversation mutual exclusion without a held lock or connection: a lease.

A lease is claimed in one short statement (owner, expiry, and a fencing token raised by every claim), renewed
while its holder works, and released at the end. Every write made under a lease checks the fence in the same
transaction (`fenced`), so a holder whose lease expired meanwhile (a stalled or partitioned process) commits
nothing: its work is done again by the next holder. A process that dies loses its leases at expiry.

Turns (agents.conversations) and human takeover's actions (escalation.desk) take the same lease, so they never
interleave on one conversation; nothing waits on a row lock across an LLM or Slack call.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db.notify import TURNS
from agents.db.statements import Conn, Statement, alone, engine_of

LEASE_S = 30.0


def process_owner() -> str:
    """Names this process in the leases it holds (for operators reading the table)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class LeaseLost(Exception):
    """The lease expired and was taken by another holder: nothing was committed; the work will be redone."""


@dataclass(frozen=True)
class Lease:
    conversation_id: int
    token: int
    owner: str


# The lease's clauses, shared with the engine's statements that claim or fence a lease in passing.
CLAIM_SET = "lease_owner = :owner, lease_until = now() + make_interval(secs => :ttl), lease_token = lease_token + 1"
FREE = "(lease_until IS NULL OR lease_until < now())"
RENEW_SET = "lease_until = now() + make_interval(secs => :ttl)"
HELD = "lease_token = :token AND lease_owner = :owner"

_CLAIM_PENDING = Statement(
    """
    UPDATE conversations c
    SET lease_owner = :owner, lease_until = now() + make_interval(secs => :ttl), lease_token = c.lease_token + 1
    FROM (
        SELECT c2.id FROM conversations c2
        WHERE c2.id IN (SELECT i.conversation_id FROM inbound i WHERE i.processed_at IS NULL)
          AND (c2.lease_until IS NULL OR c2.lease_until < now())
        ORDER BY c2.updated_at
        LIMIT :limit
        FOR NO KEY UPDATE OF c2 SKIP LOCKED
    ) free
    WHERE c.id = free.id
    RETURNING c.id, c.lease_token
    """
)

_CLAIM_ONE = Statement(f"UPDATE conversations SET {CLAIM_SET} WHERE id = :id AND {FREE} RETURNING id, lease_token")

_RENEW = Statement(f"UPDATE conversations SET {RENEW_SET} WHERE id = :id AND {HELD} RETURNING id")

_RELEASE = Statement(
    f"""
    WITH released AS (
        UPDATE conversations SET lease_owner = NULL, lease_until = now() + make_interval(secs => :after)
        WHERE id = :id AND lease_token = :token AND lease_owner = :owner
    )
    -- Released at once: a message that came in meanwhile waits for this conversation, so say so.
    SELECT pg_notify('{TURNS}', '')
    WHERE CAST(:after AS float8) = 0
      AND EXISTS (SELECT FROM inbound WHERE conversation_id = :id AND processed_at IS NULL)
    """
)


class Leases:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], *, owner: str, ttl_s: float = LEASE_S) -> None:
        self.sessions = sessions
        self.owner = owner
        self.ttl_s = ttl_s
        self._alone = alone(engine_of(sessions))
        """Each of a lease's statements commits by itself."""

    async def claim_pending(self, limit: int) -> list[Lease]:
        """Leases on up to `limit` conversations that have unprocessed messages and no live lease."""
        async with self._alone() as conn:
            rows = await _CLAIM_PENDING.run(conn, {"owner": self.owner, "ttl": self.ttl_s, "limit": limit})
            return [Lease(row.id, row.lease_token, self.owner) for row in rows]

    async def claim(self, conversation_id: int) -> Lease | None:
        async with self._alone() as conn:
            row = (await _CLAIM_ONE.run(conn, {"owner": self.owner, "ttl": self.ttl_s, "id": conversation_id})).first()
            return Lease(row.id, row.lease_token, self.owner) if row else None

    async def wait_for(self, conversation_id: int, *, timeout_s: float, poll_s: float = 0.05) -> Lease | None:
        """The lease of one conversation, waiting while someone else (a running turn) holds it."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (lease := await self.claim(conversation_id)) is None:
            if asyncio.get_running_loop().time() > deadline:
                return None
            await asyncio.sleep(poll_s)
        return lease

    async def renew(self, lease: Lease) -> bool:
        async with self._alone() as conn:
            return await _renewed(conn, lease, ttl_s=self.ttl_s)

    async def release(self, lease: Lease, *, retry_after_s: float = 0.0) -> None:
        """Give the conversation back; `retry_after_s` keeps it from being claimed again that long (after a
        failure, so that a message that fails is not retried in a tight loop)."""
        values = {"id": lease.conversation_id, "token": lease.token, "owner": lease.owner, "after": retry_after_s}
        async with self._alone() as conn:
            await _RELEASE.run(conn, values)

    def kept(self, lease: Lease, lost: asyncio.Event) -> AbstractContextManager[None]:
        """The lease renewed every third of its life while the block runs; `lost` is set if it was taken."""
        return renewing(lambda: self.renew(lease), every_s=self.ttl_s / 3, lost=lost)


@contextmanager
def renewing(renew: Callable[[], Awaitable[bool]], *, every_s: float, lost: asyncio.Event) -> Iterator[None]:
    """Call `renew` every `every_s` while the block runs, until it says the lease was taken (then `lost` is set).
    A database that does not answer is tried again: the fence decides at commit. The task that renews starts
    when the first renewal is due, from a timer: most blocks (a turn, a send) end before, and a task made and
    cancelled for each was 2% of a message's CPU."""
    loop = asyncio.get_running_loop()
    renewer: asyncio.Task[None] | None = None

    async def keep() -> None:
        while True:
            try:
                if not await renew():
                    lost.set()
                    return
            except Exception:
                pass
            await asyncio.sleep(every_s)

    def start() -> None:
        nonlocal renewer
        renewer = loop.create_task(keep(), name="lease-renewer")

    timer = loop.call_later(every_s, start)
    try:
        yield
    finally:
        timer.cancel()
        if renewer is not None:
            renewer.cancel()


async def fenced(s: AsyncSession, lease: Lease, *, ttl_s: float = LEASE_S) -> bool:
    """Inside a transaction that writes under `lease`: True (and the lease extended, and the conversation row
    locked until commit) while the lease is still the holder's; False when it was lost."""
    return await _renewed(await s.connection(), lease, ttl_s=ttl_s)


async def _renewed(conn: Conn, lease: Lease, *, ttl_s: float) -> bool:
    values = {"id": lease.conversation_id, "token": lease.token, "owner": lease.owner, "ttl": ttl_s}
    return (await _RENEW.run(conn, values)).first() is not None
