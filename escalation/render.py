"""The staff side's messages, rendered from the database: the case message, relays both ways and reminders.

Rendering only: the outbox's sender posts what this returns, and nothing in escalation calls a platform's API. The
names, avatars and links that messages show come through a `Directory` that the platform's edge provides."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import Address, is_teams_id
from agents.attachments import FileRef
from agents.db import models as m
from agents.db.deliveries import FileRelay, FilesToCustomer, FilesToStaff, RelayToCustomer, RelayToStaff, Reminder
from agents.markup.limits import clip
from agents.markup.text import escape, from_markdown, inert
from escalation import views
from escalation.views import CaseView, Message, Person

log = logging.getLogger(__name__)

Summarizer = Callable[[list[tuple[str, str]]], Awaitable[str]]
"""Turns (speaker, text) pairs into a short summary for staff."""


class Directory(Protocol):
    """People and links as the platform knows them."""

    async def person(self, user: str) -> Person:
        """A user's name and avatar; the id itself as the name when the profile cannot be read."""
        ...

    async def permalink(self, channel: str, message: str) -> str | None:
        """A link to a message, None when there is none to be had."""
        ...


@dataclass(frozen=True)
class SharedFiles:
    comment: Message
    """The message the files are shared with (the relayed words, who sent them)."""
    files: tuple[FileRef, ...]


class CaseRenderer:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        directory: Directory,
        summarize: Summarizer | None = None,
        name_suffix: str,
    ) -> None:
        self.sessions = sessions
        self.directory = directory
        self.summarize = summarize
        self.name_suffix = name_suffix
        """After a colleague's name on their relayed messages (STAFF_NAME_SUFFIX)."""
        self._summaries: dict[int, str] = {}
        """Written once, when the case is posted: updates of the case message re-render its state, and must
        not cost an LLM call (or a wait in the conversation's outbox) per staff reply."""

    async def case(self, escalation_id: int) -> Message:
        """The case message, as posted and as each update shows it."""
        return views.case_message(await self.view(escalation_id))

    async def relay_to_staff(self, relay: RelayToStaff) -> Message:
        return views.relay_to_staff(await self._person(relay.author), relay.text)

    async def relay_to_customer(self, relay: RelayToCustomer) -> Message | None:
        """The colleague's message as it is now (edited since, maybe); None when it was deleted or made a note."""
        words = await self.staff_words(relay.conversation_id, relay.source) if relay.source else relay.text
        if words is None:
            return None
        return views.relay_to_customer(await self._person(relay.author), words, suffix=self.name_suffix)

    async def staff_words(self, conversation_id: int, source: str) -> str | None:
        """A colleague's message as last edited, None once deleted (or edited into a note): read when its relay
        or edit goes out, so that an edit or a deletion that overtook the relay still wins."""
        async with self.sessions() as s:
            row = (
                await s.execute(
                    select(m.Inbound.text, m.Inbound.deleted_at).where(
                        m.Inbound.conversation_id == conversation_id,
                        m.Inbound.external_id == source,
                        m.Inbound.kind == "staff",
                    )
                )
            ).first()
        return None if row is None or row.deleted_at is not None else str(row.text)

    async def shared_files(self, relay: FileRelay) -> SharedFiles | None:
        """The files of a relayed message and what introduces them; None when the message is gone (a colleague's,
        deleted or edited into a note before its files went out)."""
        async with self.sessions() as s:
            row = (
                await s.execute(
                    select(m.Inbound.files, m.Inbound.deleted_at).where(
                        m.Inbound.conversation_id == relay.conversation_id, m.Inbound.external_id == relay.source
                    )
                )
            ).first()
        if row is None or row.deleted_at is not None or not row.files:
            return None
        files = tuple(FileRef.from_json(f) for f in row.files)
        match relay:
            case FilesToStaff():
                return SharedFiles(views.relay_to_staff(await self._person(relay.author), relay.text), files)
            case FilesToCustomer():
                return SharedFiles(
                    views.files_from_colleague(await self._person(relay.author), suffix=self.name_suffix), files
                )

    async def files_as_text(self, relay: FileRelay, *, why: Callable[[FileRef], str]) -> Message | None:
        """A file relay whose files cannot go: the relayed words, and each file's name with `why`."""
        shared = await self.shared_files(relay)
        if shared is None:
            return None
        return Message(views.files_not_shared(shared.comment.text, [(f.name, why(f)) for f in shared.files]))

    def reminder(self, reminder: Reminder) -> Message:
        return views.reminder(reminder.text)

    async def case_thread(self, escalation_id: int) -> tuple[str, str] | None:
        """Where relays and reminders for this case go: the case message's channel and thread, once it is posted."""
        async with self.sessions() as s:
            escalation = await s.get(m.Escalation, escalation_id)
        if escalation is None or escalation.case_ts is None or escalation.case_channel is None:
            return None
        return escalation.case_channel, escalation.case_ts

    async def case_posted(self, escalation_id: int, *, channel: str, ts: str) -> None:
        """After the case message is posted (or found after a crash): remember where its thread is."""
        async with self.sessions() as s, s.begin():
            await s.execute(
                update(m.Escalation).where(m.Escalation.id == escalation_id).values(case_channel=channel, case_ts=ts)
            )

    async def _person(self, user: str | None) -> Person:
        return Person("Someone") if not user else await self.directory.person(user)

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
        customer = (await self._person(escalation.customer)).name
        lines = [
            (
                customer if r.role == "user" else r.author or "Staff" if r.role == "staff" else f"{r.agent} agent",
                r.content or "",
            )
            for r in reversed(recent)
        ]
        # As each was shown in Slack: the agents wrote Markdown, people mrkdwn (a colleague's `*bold*` is bold).
        shown = [
            (who, from_markdown(text) if r.role == "assistant" else inert(text))
            for (who, text), r in zip(lines, reversed(recent), strict=True)
        ]
        permalink = None
        if address is not None and address.thread is not None:
            permalink = await self.directory.permalink(address.channel, address.thread)
        view = CaseView(
            escalation_id=escalation.id,
            customer=customer,
            channel=channel,
            permalink=permalink,
            reason=escalation.reason,
            summary=self._summaries.get(escalation.id) or await self._summary(lines, shown),
            agent=escalation.agent,
            status=escalation.status,
            claimed_by=escalation.claimed_by,
            closed_by=escalation.closed_by,
            names={
                user: (await self._person(user)).name
                for user in (escalation.claimed_by, escalation.closed_by)
                if user is not None and is_teams_id(user)
            },
        )
        self._summaries[escalation.id] = view.summary
        return view

    async def _summary(self, lines: list[tuple[str, str]], shown: list[tuple[str, str]]) -> str:
        """mrkdwn for the case message: the model's summary (Markdown) of `lines`, or the last messages as `shown`
        (mrkdwn, inert); either way made inert, as the messages (and a model summarizing them) may carry mentions
        and disguised links."""
        if self.summarize is not None:
            try:
                return from_markdown(await self.summarize(lines))
            except Exception as exc:  # a case without an LLM summary beats no case
                log.warning("case summary failed, showing the last messages: %s", exc)
        transcript = [f"*{escape(who)}:* {clip(text, LINE)}" for who, text in shown[-6:]]
        return "\n".join(transcript) or "(no messages)"


LINE = 300
"""Characters of one message in a transcript summary."""
