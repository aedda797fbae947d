"""What `/support` changes: hand back, close, reset, pause, resume, and the record of every admin command."""

from __future__ import annotations

from typing import Literal

from sqlalchemy import delete, insert, select, true, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents import personal
from agents.address import Address, Platform, is_teams_id
from agents.db import models as m
from bot.admin.parse import Change, Ref
from bot.admin.queries import AdminQueries
from escalation.desk import ActionResult, CaseDesk

EVERYWHERE = "%"


def channel_scope(channel: str | None) -> tuple[str, str]:
    """(LIKE pattern over conversation keys, label) for a channel, or for every conversation."""
    if channel is None:
        return EVERYWHERE, "everywhere"
    return Address.like("slack", channel=channel), f"<#{channel}>"


class AdminActions:
    def __init__(
        self, *, sessions: async_sessionmaker[AsyncSession], queries: AdminQueries, desk: CaseDesk, entry_agent: str
    ) -> None:
        self.sessions = sessions
        self.queries = queries
        self.desk = desk
        self.entry_agent = entry_agent

    async def change(self, change: Change, ref: Ref, *, user: str, team: str | None = None) -> ActionResult:
        async with self.sessions() as s:
            conversation = await self.queries.find(s, ref, team=team)
            if conversation is None:
                return ActionResult(False, "I found no conversation for that link.")
            conversation_id = conversation.id
        match change:
            case "handback" | "close":
                action: Literal["hand_back", "close"] = "close" if change == "close" else "hand_back"
                return await self.desk.on_conversation(conversation_id=conversation_id, action=action, user=user)
            case "reset":
                return await self.desk.reset(conversation_id=conversation_id, user=user, entry_agent=self.entry_agent)

    async def pause(self, channel: str | None, *, user: str) -> ActionResult:
        scope, label = channel_scope(channel)
        async with self.sessions() as s, s.begin():
            added = await s.scalar(
                pg_insert(m.Pause)
                .values(scope=scope, label=label, paused_by=user)
                .on_conflict_do_nothing()
                .returning(m.Pause.scope)
            )
        if added is None:
            return ActionResult(False, f"The bot is already paused {_where(label)}.")
        return ActionResult(
            True,
            f"Paused {_where(label)}. New messages there go to the staff channel as cases, and customers are told "
            "a person will reply. `/support resume` undoes it.",
        )

    async def resume(self, channel: str | None, *, user: str) -> ActionResult:
        scope, label = channel_scope(channel)
        async with self.sessions() as s, s.begin():
            # Resuming everywhere lifts every pause; a channel lifts only its own.
            where = true() if channel is None else m.Pause.scope == scope
            lifted = (await s.scalars(delete(m.Pause).where(where).returning(m.Pause.label))).all()
            remaining = (await s.scalars(select(m.Pause.label))).all()
        if not lifted:
            still = f" (it is paused {', '.join(_where(r) for r in remaining)})" if remaining else ""
            return ActionResult(False, f"The bot was not paused {_where(label)}{still}.")
        message = f"Resumed {', '.join(_where(label) for label in lifted)}. Cases already open stay with your team."
        if remaining:
            message += f" Still paused {', '.join(_where(r) for r in remaining)}."
        return ActionResult(True, message)

    async def forget(self, user: str, *, by: str) -> dict[str, int]:
        """Everything held about `user` erased; the rows changed per table."""
        platform = Platform.TEAMS if is_teams_id(user) else Platform.SLACK
        return await personal.forget(self.sessions, personal.Person(platform, user), requested_by=by)

    async def record(self, *, user: str, channel: str | None, command: str, arguments: str, allowed: bool) -> int:
        """Record a command before it runs, so that none runs unrecorded; `finish` adds how it went."""
        async with self.sessions() as s, s.begin():
            row_id: int | None = await s.scalar(
                insert(m.AdminAction)
                .values(user_id=user, channel_id=channel, command=command, arguments=arguments, allowed=allowed)
                .returning(m.AdminAction.id)
            )
        assert row_id is not None
        return row_id

    async def finish(self, record_id: int, *, ok: bool, result: str) -> None:
        async with self.sessions() as s, s.begin():
            await s.execute(
                update(m.AdminAction).where(m.AdminAction.id == record_id).values(ok=ok, result=result[:2000])
            )


def _where(label: str) -> str:
    return label if label == "everywhere" else f"in {label}"
