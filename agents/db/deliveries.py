"""What the outbox owes the chat platform: a closed set of typed deliveries, and their rows in `outbox`.

A delivery says what is owed (post this text in this conversation's thread, add this reaction, post the case of
escalation N for staff, relay this staff message to the customer, ...), not how a platform does it: the sender
(`bot.delivery.sender.OutboxSender`) makes the calls through each channel's messenger, and `escalation.render` renders
what the staff side's messages show. Each delivery is written in the transaction that caused it (`enqueue`) and read
back by the
sender (`delivery_of`). A row's `kind` is its delivery's `kind`, spelled here and nowhere else.

`NewMessage` deliveries post a message: they carry the exactly-once mark and are looked for after an unknown
outcome. `Change` deliveries act on a message that exists (reactions, edits, deletions), which is safe to repeat.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from agents.db.statements import Conn, Statement


class Outcome(StrEnum):
    """How a row stopped being owed (`outbox.outcome`, with `done_at`); a row still owed has none."""

    SENT = "sent"
    SKIPPED = "skipped"
    """Nothing to do any more (a reaction removed before it was added, a relay whose source was deleted)."""
    GIVEN_UP = "given_up"
    """Failed for good: shown in /metrics and `/support status`, never counted as sent."""


GIVEN_UP = text(f"outbox.outcome = '{Outcome.GIVEN_UP}'")
"""Rows given up, as the partial index `ix_outbox_given_up` is written (so that counting them uses it)."""


MAX_SOURCES = 5
"""Sources an answer carries at most: the few it is most likely to rest on, not every passage a search returned."""
EXCERPT = 160
"""Characters of a passage a source keeps (Teams shows at most 160 of a citation's abstract)."""


@dataclass(frozen=True)
class Source:
    """Knowledge an agent's answer was grounded in (a passage of the knowledge base it was given), as a channel cites
    it: "Warranty › Proof of purchase"."""

    title: str
    """The document's title."""
    heading: str | None
    """The section the passage is in."""
    link: str
    """The document's URL, or its path in the knowledge folder."""
    excerpt: str = ""
    """The passage's first words (at most EXCERPT characters)."""

    @property
    def label(self) -> str:
        return f"{self.title} › {self.heading}" if self.heading else self.title

    @property
    def url(self) -> str | None:
        """The link, when it is one a reader can open."""
        return self.link if self.link.startswith(("https://", "http://")) else None

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "heading": self.heading, "link": self.link, "excerpt": self.excerpt}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Source:
        return cls(str(raw["title"]), raw.get("heading"), str(raw["link"]), str(raw.get("excerpt") or ""))


@dataclass(frozen=True)
class Post:
    """A message in a conversation."""

    kind: ClassVar[str] = "post"
    conversation_id: int
    channel: str
    thread: str | None
    """The thread's root; None: in the channel itself (a direct message)."""
    text: str
    """As the conversation's platform shows it (Slack mrkdwn, Teams markdown), short enough for one message."""
    answer: bool = False
    """An AI agent's words (where the channel has no `Answer`s): labelled as AI-made and rated where the channel can;
    a notice, a handoff's text or an off-hours note is not."""
    sources: tuple[Source, ...] = ()
    """What the answer was grounded in, cited under it (only an `answer` has any)."""


@dataclass(frozen=True)
class Answer:
    """An AI agent's answer in a Slack conversation, rendered when it is sent (Slack's markdown block over an mrkdwn
    fallback, and the feedback buttons): the only post that carries them, not the notices, relays or cases."""

    kind: ClassVar[str] = "answer"
    conversation_id: int
    channel: str
    thread: str | None
    text: str
    """The model's Markdown, as it wrote it, short enough for one message."""
    sources: tuple[Source, ...] = ()
    """What the answer was grounded in, shown under it."""


@dataclass(frozen=True)
class _Reaction:
    conversation_id: int
    channel: str
    message: str
    """The message it goes on (such as the customer's)."""
    name: str
    """The emoji's name: `eyes`."""


@dataclass(frozen=True)
class AddReaction(_Reaction):
    """The bot's reaction on a message."""

    kind: ClassVar[str] = "react_add"


@dataclass(frozen=True)
class RemoveReaction(_Reaction):
    """The bot's reaction taken off a message again."""

    kind: ClassVar[str] = "react_remove"


@dataclass(frozen=True)
class Typing:
    """The bot is working on a customer's message (Teams' typing indicator: a few seconds, or until the reply)."""

    kind: ClassVar[str] = "typing"
    conversation_id: int
    channel: str
    thread: str | None


@dataclass(frozen=True)
class _OfCase:
    conversation_id: int
    escalation_id: int


@dataclass(frozen=True)
class CasePost(_OfCase):
    """The case of an escalation, posted for staff; its thread is where the case is talked about."""

    kind: ClassVar[str] = "case"
    channel: str
    """The staff channel."""


@dataclass(frozen=True)
class CaseUpdate(_OfCase):
    """The case message shows the case's state again (claimed, resolved, handed back)."""

    kind: ClassVar[str] = "update_case"


@dataclass(frozen=True)
class RelayToStaff(_OfCase):
    """A customer's message, copied into the case's thread."""

    kind: ClassVar[str] = "relay_to_staff"
    author: str | None
    """The customer (a platform user id)."""
    text: str


@dataclass(frozen=True)
class RelayToCustomer(_OfCase):
    """A colleague's message from the case's thread, copied to the customer under the colleague's name."""

    kind: ClassVar[str] = "relay_to_customer"
    channel: str
    thread: str | None
    author: str | None
    """The colleague (a platform user id)."""
    text: str
    """As the colleague wrote it; the relay shows the message as it is when it goes out (`source`)."""
    source: str | None
    """The colleague's message, so that its edits and deletion reach the copy."""


@dataclass(frozen=True)
class RelayEdit(_OfCase):
    """A colleague edited a relayed message: the copy the customer sees changes too."""

    kind: ClassVar[str] = "update_relay"
    source: str
    text: str


@dataclass(frozen=True)
class RelayDelete(_OfCase):
    """A colleague deleted a relayed message: so is the customer's copy."""

    kind: ClassVar[str] = "delete_relay"
    source: str


@dataclass(frozen=True)
class Reminder(_OfCase):
    """A nudge in the case's thread (shown in the staff channel too) for a case nobody has taken."""

    kind: ClassVar[str] = "reminder"
    text: str


@dataclass(frozen=True)
class StaffNotice(_OfCase):
    """A note only one person in the case's thread sees (ephemeral): why their message was not relayed."""

    kind: ClassVar[str] = "staff_notice"
    author: str
    """Whom it is for (a platform user id)."""
    text: str


@dataclass(frozen=True)
class CsatAsk(_OfCase):
    """The customer is asked to rate a resolved case (`bot.csat` renders the question and its buttons)."""

    kind: ClassVar[str] = "csat_ask"
    channel: str
    thread: str | None
    text: str
    """The question."""


@dataclass(frozen=True)
class FilesToStaff(_OfCase):
    """A customer's message with files, copied into the case's thread: the files uploaded again and shared there
    with the relayed text (a file from a customer's Slack Connect channel cannot be shared into ours)."""

    kind: ClassVar[str] = "files_to_staff"
    author: str | None
    text: str
    source: str
    """The customer's message (its ts), whose files (`inbound.files`) are relayed."""


@dataclass(frozen=True)
class FilesToCustomer(_OfCase):
    """A colleague's files from the case's thread, shared with the customer (their words go as a `RelayToCustomer`,
    which edits and deletions follow)."""

    kind: ClassVar[str] = "files_to_customer"
    channel: str
    thread: str | None
    author: str | None
    source: str
    """The colleague's message, whose files are relayed; none once it was deleted."""


@dataclass(frozen=True)
class Erase:
    """A post of the bot's taken down (a forgotten person's conversation, `agents.personal`): the post of outbox
    row `erases` wherever it went (queued after it, so it is out or given up by then), or, for a streamed preview that
    no row owns, the message `message` in `channel`/`thread`. A post already gone counts as erased."""

    kind: ClassVar[str] = "erase"
    conversation_id: int
    erases: int | None
    channel: str = ""
    thread: str | None = None
    message: str | None = None


FileRelay = FilesToStaff | FilesToCustomer
"""Shared as files where the other side is Slack; elsewhere the text goes with the files' names."""
NewMessage = (
    Post | Answer | CasePost | RelayToStaff | RelayToCustomer | Reminder | CsatAsk | FilesToStaff | FilesToCustomer
)
Change = AddReaction | RemoveReaction | Typing | CaseUpdate | RelayEdit | RelayDelete | StaffNotice | Erase
Delivery = NewMessage | Change

KINDS: dict[str, type[Delivery]] = {
    cls.kind: cls
    for cls in (
        Post,
        Answer,
        AddReaction,
        RemoveReaction,
        Typing,
        CasePost,
        CaseUpdate,
        RelayToStaff,
        RelayToCustomer,
        RelayEdit,
        RelayDelete,
        Reminder,
        StaffNotice,
        CsatAsk,
        FilesToStaff,
        FilesToCustomer,
        Erase,
    )
}

# Fields stored under another column name; the rest are stored under their own, but for an answer's grounding: its
# sources in `sources` (a JSON list), which is NULL for a post that is no answer.
_COLUMN_OF = {"thread": "thread_ts", "message": "target_ts", "name": "reaction", "source": "source_ts"}
_GROUNDING = frozenset({"answer", "sources"})
COLUMNS = tuple(
    dict.fromkeys(
        (
            "kind",
            "channel",
            "sources",
            *sorted({_COLUMN_OF.get(f.name, f.name) for cls in KINDS.values() for f in fields(cls)} - _GROUNDING),
        )
    )
)
"""The columns a queued row sets (`row_of`'s keys); the rest keep their defaults."""


def row_of(delivery: Delivery) -> dict[str, Any]:
    """The delivery as the values of an `outbox` row: every column the deliveries use, NULL where this one has no
    value, and an empty channel for deliveries whose place the sender looks up (the case's thread)."""
    values: dict[str, Any] = dict.fromkeys(COLUMNS) | {"kind": delivery.kind, "channel": ""}
    for f in fields(delivery):
        if f.name not in _GROUNDING:
            values[_COLUMN_OF.get(f.name, f.name)] = getattr(delivery, f.name)
    if isinstance(delivery, Answer) or (isinstance(delivery, Post) and delivery.answer):
        values["sources"] = [source.to_json() for source in delivery.sources]
    return values


def delivery_of(row: Mapping[Any, Any]) -> Delivery:
    """The delivery an `outbox` row holds (its values by column name: `row_of`'s, a Core row's `_mapping`);
    ValueError for a kind this version does not know."""
    cls = KINDS.get(row["kind"])
    if cls is None:
        raise ValueError(f"unknown outbox kind {row['kind']!r}")
    values = {f.name: row[_COLUMN_OF.get(f.name, f.name)] for f in fields(cls) if f.name not in _GROUNDING}
    if cls is Post or cls is Answer:
        grounding = row.get("sources")
        values["sources"] = tuple(Source.from_json(raw) for raw in grounding or ())
        if cls is Post:
            values["answer"] = grounding is not None
    return cls(**values)


def queued_sql(*, fenced_by: str | None = None) -> str:
    """An INSERT of the rows in the JSON array `:outbox` (`rows_json`), in their order, each column typed as the
    table has it; with `fenced_by`, only if that relation (a common table expression) has a row."""
    return (
        f"INSERT INTO outbox ({', '.join(COLUMNS)}) SELECT {', '.join(f'r.{column}' for column in COLUMNS)} "
        f"FROM {f'{fenced_by}, ' if fenced_by else ''}"
        "jsonb_array_elements(CAST(:outbox AS jsonb)) WITH ORDINALITY AS e(value, n), "
        "LATERAL jsonb_populate_record(CAST(NULL AS outbox), e.value) AS r ORDER BY e.n"
    )


_QUEUE = Statement(queued_sql())


def rows_json(deliveries: Iterable[Delivery]) -> str:
    """Deliveries as the JSON array of their rows (`row_of`), for `queued_sql`."""
    return json.dumps([row_of(d) for d in deliveries])


async def enqueue(s: AsyncSession | Conn, deliveries: Iterable[Delivery]) -> None:
    """Queue deliveries in the caller's transaction: they are owed exactly when what caused them commits. One
    statement however many rows of whatever kinds, on any connection (a turn's commit queues its own rows with the
    same SQL: `agents.conversation_sql.FINISH`)."""
    owed = list(deliveries)
    if not owed:
        return
    if isinstance(s, AsyncSession):
        await s.flush()  # what the session holds goes first, as its own statements would autoflush it
        s = await s.connection()
    await _QUEUE.run(s, {"outbox": rows_json(owed)})
