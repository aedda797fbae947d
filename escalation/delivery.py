"""The Slack side of the escalation outbox rows: the case message, relays both ways, edits and deletions of
relayed staff messages, case updates and reminders. Called by the outbox sender, row by row, in order."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy import select, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import Address
from db import models as m
from escalation.views import CaseView, case_blocks, case_text

log = logging.getLogger(__name__)

Summarizer = Callable[[list[tuple[str, str]]], Awaitable[str]]
"""Turns (speaker, text) pairs into a short summary for staff."""

POSTING_KINDS = frozenset({"case", "relay_to_staff", "relay_to_customer", "reminder"})
KINDS = POSTING_KINDS | {"update_case", "update_relay", "delete_relay"}
THREADED_IN_CASE = frozenset({"relay_to_staff", "reminder"})


class CaseDelivery:
    def __init__(
        self,
        *,
        client: AsyncWebClient,
        sessions: async_sessionmaker[AsyncSession],
        staff_channel: str | None,
        summarize: Summarizer | None = None,
    ) -> None:
        self.client = client
        self.sessions = sessions
        self.staff_channel = staff_channel
        self.summarize = summarize
        self._people: dict[str, tuple[str, str | None]] = {}
        self._summaries: dict[int, str] = {}
        """Written once, when the case is posted: updates of the case message re-render its state, and must
        not cost an LLM call (or a wait in the conversation's outbox) per staff reply."""

    async def person(self, user: str | None) -> tuple[str, str | None]:
        """Display name and avatar of a Slack user, cached; the id itself when the profile cannot be read."""
        if not user:
            return "Someone", None
        if user not in self._people:
            try:
                profile = (await self.client.users_info(user=user))["user"]
                details = profile.get("profile") or {}
                name = details.get("real_name") or profile.get("real_name") or details.get("display_name") or user
                self._people[user] = (str(name), details.get("image_192") or details.get("image_72"))
            except SlackApiError:
                return user, None
        return self._people[user]

    async def case_thread(self, escalation_id: int | None) -> tuple[str, str] | None:
        """Where a relay or reminder for this case goes: the case message's thread, once it is posted."""
        async with self.sessions() as s:
            escalation = None if escalation_id is None else await s.get(m.Escalation, escalation_id)
        if escalation is None or escalation.case_ts is None or escalation.case_channel is None:
            return None
        return escalation.case_channel, escalation.case_ts

    async def send(self, row: Row[Any]) -> str | None:
        match row.kind:
            case "case":
                view = await self.view(row.escalation_id)
                return await self._post(row, text=case_text(view), blocks=case_blocks(view))
            case "update_case":
                view = await self.view(row.escalation_id)
                where = await self.case_thread(row.escalation_id)
                if where is not None:
                    await self.client.chat_update(
                        channel=where[0], ts=where[1], text=case_text(view), blocks=case_blocks(view)
                    )
                return None
            case "relay_to_staff":
                name, _ = await self.person(row.author)
                return await self._post(row, text=f"*{name}* (customer): {row.text}")
            case "reminder":
                return await self._post(row, text=row.text, reply_broadcast=True)
            case "relay_to_customer":
                name, avatar = await self.person(row.author)
                return await self._post(row, text=row.text, username=f"{name} (Driftwing team)", icon_url=avatar)
            case "update_relay" | "delete_relay":
                copy = await self._relayed_copy(row.source_ts)
                if copy is not None and row.kind == "update_relay":
                    await self.client.chat_update(channel=copy[0], ts=copy[1], text=row.text)
                elif copy is not None:
                    await self.client.chat_delete(channel=copy[0], ts=copy[1])
                return None
        raise ValueError(f"unknown escalation outbox kind {row.kind}")

    async def posted(self, row: Row[Any], ts: str) -> None:
        """After a case message is posted (or found after a crash): remember where its thread is."""
        if row.kind == "case":
            async with self.sessions() as s, s.begin():
                await s.execute(
                    update(m.Escalation)
                    .where(m.Escalation.id == row.escalation_id)
                    .values(case_channel=row.channel, case_ts=ts)
                )

    async def _post(self, row: Row[Any], **fields: Any) -> str:
        from bot.outbox import METADATA_TYPE  # the one place that names the metadata marker

        response = await self.client.chat_postMessage(
            channel=row.channel,
            thread_ts=row.thread_ts,
            metadata={"event_type": METADATA_TYPE, "event_payload": {"outbox_id": row.id}},
            **{k: v for k, v in fields.items() if v is not None},
        )
        return str(response["ts"])

    async def _relayed_copy(self, source_ts: str | None) -> tuple[str, str] | None:
        async with self.sessions() as s:
            copy = await s.scalar(
                select(m.Outbox).where(
                    m.Outbox.kind == "relay_to_customer",
                    m.Outbox.source_ts == source_ts,
                    m.Outbox.result_ts.is_not(None),
                )
            )
        return None if copy is None or copy.result_ts is None else (copy.channel, copy.result_ts)

    async def view(self, escalation_id: int) -> CaseView:
        async with self.sessions() as s:
            escalation = await s.get(m.Escalation, escalation_id)
            assert escalation is not None
            conversation = await s.get(m.Conversation, escalation.conversation_id)
            assert conversation is not None
            recent = (
                await s.scalars(
                    select(m.Message)
                    .where(
                        m.Message.conversation_id == conversation.id, m.Message.role.in_(("user", "assistant", "staff"))
                    )
                    .where(m.Message.content.is_not(None), m.Message.content != "")
                    .order_by(m.Message.id.desc())
                    .limit(12)
                )
            ).all()
        address = Address.parse(conversation.key)
        channel = address.channel if address else "?"
        customer, _ = await self.person(escalation.customer)
        lines = [
            (
                customer if r.role == "user" else r.author or "Staff" if r.role == "staff" else f"{r.agent} agent",
                r.content or "",
            )
            for r in reversed(recent)
        ]
        view = CaseView(
            escalation_id=escalation.id,
            customer=customer,
            channel=channel,
            permalink=await self._permalink(address),
            reason=escalation.reason,
            summary=self._summaries.get(escalation.id) or await self._summary(lines),
            agent=escalation.agent,
            status=escalation.status,
            claimed_by=escalation.claimed_by,
            closed_by=escalation.closed_by,
        )
        self._summaries[escalation.id] = view.summary
        return view

    async def _permalink(self, address: Address | None) -> str | None:
        if address is None or address.thread is None:
            return None
        try:
            found = await self.client.chat_getPermalink(channel=address.channel, message_ts=address.thread)
            return str(found["permalink"])
        except SlackApiError:
            return None

    async def _summary(self, lines: list[tuple[str, str]]) -> str:
        if self.summarize is not None:
            try:
                return await self.summarize(lines)
            except Exception as exc:  # a case without an LLM summary beats no case
                log.warning("case summary failed, showing the last messages: %s", exc)
        return "\n".join(f"*{who}:* {_clip(text, 300)}" for who, text in lines[-6:]) or "(no messages)"


def _clip(text: str, limit: int) -> str:
    """At most `limit` characters, cut at a word and marked, so a summary line never ends mid-word."""
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"
