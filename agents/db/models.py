"""The one declarative Base and every table. Alembic owns the schema; these mirror it for queries.

conversations  one per customer thread: mode (bot / awaiting_human / human / closed), active agent, context
inbound        each customer message as received; unprocessed rows are the engine's durable queue
messages       the transcript in Chat Completions shape, each row with the agent that produced it
handoffs, tool_runs, llm_calls, escalations    the audit trail of every turn
refunds        the refund tool's idempotency record (one refund per order)
pauses         where admins paused the bot: conversations there go to humans
admin_actions  every admin command: who, what, when, allowed or refused, and its outcome
rate_counters  per customer and per channel: messages answered this minute, tokens spent today (agents.limits)
answer_feedback  👍/👎 on the bot's answers, one per answer per person (the last click kept)
retention_log  how many rows each retention run erased, per kind (bot.retention)
csat           the customer's rating of a resolved case (and optional comment), asked once after Resolve
forgotten      each person forgotten: when, who asked, counts (agents.personal)
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, ClassVar

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql import text as sql  # `text` is also a column name below


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSONB, list[Any]: JSONB}


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now())


UNERASED = "erased_at IS NULL OR erased_at < updated_at"


class Conversation(Base):
    __tablename__ = "conversations"
    __table_args__ = (
        # Retention looks only at conversations with something left to erase (bot.retention).
        Index("ix_conversations_unerased", "updated_at", postgresql_where=UNERASED),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    key: Mapped[str] = mapped_column(Text, unique=True)
    mode: Mapped[str] = mapped_column(Text, server_default="bot")
    active_agent: Mapped[str] = mapped_column(Text)
    context: Mapped[dict[str, Any]] = mapped_column(server_default="{}")
    history_from: Mapped[int | None] = mapped_column(BigInteger)
    """Messages with a smaller id stay in the transcript but out of the agents' prompt (set by an admin reset)."""
    summary: Mapped[str | None] = mapped_column(Text)
    """The running summary of the older turns (agents.summary): the agents see it instead of those turns."""
    summary_through: Mapped[int | None] = mapped_column(BigInteger)
    """The last message the summary covers; the agents see the messages after it. The transcript keeps them all."""
    language: Mapped[str | None] = mapped_column(Text)
    """The customer's language (`agents.language.Language`), told from their messages or their locale; NULL: not known
    yet, the operator's default is spoken. Written with each customer message's turn (agents.conversations)."""
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    lease_owner: Mapped[str | None] = mapped_column(Text)
    """The process running this conversation's turn (agents.leases), until `lease_until`."""
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    lease_token: Mapped[int] = mapped_column(BigInteger, server_default="0")
    """Fencing token: raised by each claim, so a holder whose lease expired cannot commit."""
    erased_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """When retention last erased its transcript (bot.retention): nothing written before it is held."""


class Inbound(Base):
    __tablename__ = "inbound"
    __table_args__ = (
        UniqueConstraint("conversation_id", "external_id"),
        Index("ix_inbound_pending", "conversation_id", "id", postgresql_where="processed_at IS NULL"),
        Index("ix_inbound_set_aside", "id", postgresql_where="outcome->>'kind' = 'set_aside'"),
        Index("ix_inbound_author", "author", "id"),
        Index("ix_inbound_files_held", "received_at", postgresql_where="files IS NOT NULL"),
        Index("ix_inbound_identity_user", sql("(identity ->> 'user')")),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    external_id: Mapped[str | None] = mapped_column(Text)
    author: Mapped[str | None] = mapped_column(Text)
    """The author's platform user id (a Slack user id)."""
    identity: Mapped[dict[str, Any] | None] = mapped_column()
    """The author as the edge verified it (`agents.identity.Author`: platform, workspace, user, name, email)."""
    text: Mapped[str] = mapped_column(Text)
    order_key: Mapped[str | None] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(Text, server_default="customer")
    """customer, or staff: a human colleague's reply, relayed to the customer and kept in the transcript."""
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    received_at: Mapped[datetime] = _now()
    processed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    outcome: Mapped[dict[str, Any] | None] = mapped_column()
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """A colleague's message deleted, or edited into a note: not relayed, or its copy deleted."""
    files: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    """The files it carried (`agents.attachments.FileRef`): names and where to fetch them, never their bytes."""


class Message(Base):
    __tablename__ = "messages"
    __table_args__ = (
        Index("ix_messages_conversation", "conversation_id", "id"),
        Index("ix_messages_author", "author"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    inbound_id: Mapped[int | None] = mapped_column(ForeignKey("inbound.id", ondelete="SET NULL"))
    role: Mapped[str] = mapped_column(Text)
    agent: Mapped[str | None] = mapped_column(Text)
    author: Mapped[str | None] = mapped_column(Text)
    author_name: Mapped[str | None] = mapped_column(Text)
    """The author's display name when they wrote it: what the model sees in a thread where several write."""
    content: Mapped[str | None] = mapped_column(Text)
    tool_calls: Mapped[list[Any] | None] = mapped_column()
    tool_call_id: Mapped[str | None] = mapped_column(Text)
    name: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class Handoff(Base):
    __tablename__ = "handoffs"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    inbound_id: Mapped[int | None] = mapped_column(ForeignKey("inbound.id", ondelete="SET NULL"))
    from_agent: Mapped[str] = mapped_column(Text)
    to_agent: Mapped[str] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class ToolRun(Base):
    __tablename__ = "tool_runs"
    __table_args__ = (
        Index("ix_tool_runs_created_at", "created_at"),
        Index("ix_tool_runs_text_held", "created_at", postgresql_where="arguments <> '' OR output <> ''"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    inbound_id: Mapped[int | None] = mapped_column(ForeignKey("inbound.id", ondelete="SET NULL"))
    agent: Mapped[str] = mapped_column(Text)
    call_id: Mapped[str] = mapped_column(Text)
    tool: Mapped[str] = mapped_column(Text)
    arguments: Mapped[str] = mapped_column(Text)
    ok: Mapped[bool] = mapped_column(Boolean)
    output: Mapped[str] = mapped_column(Text)
    duration_ms: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(Text, server_default="python")
    """Where the tool ran: "python", "http" or "mcp:<server>" (`agents.tools.Tool.source`). Who asked is the inbound
    message's verified author (`inbound.identity`)."""
    created_at: Mapped[datetime] = _now()


class LLMCall(Base):
    __tablename__ = "llm_calls"
    __table_args__ = (Index("ix_llm_calls_error_held", "created_at", postgresql_where="error IS NOT NULL"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    conversation_id: Mapped[int | None] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    inbound_id: Mapped[int | None] = mapped_column(ForeignKey("inbound.id", ondelete="SET NULL"))
    agent: Mapped[str | None] = mapped_column(Text)
    model: Mapped[str] = mapped_column(Text)
    ok: Mapped[bool] = mapped_column(Boolean)
    error: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    completion_tokens: Mapped[int] = mapped_column(Integer, server_default="0")
    cached_tokens: Mapped[int | None] = mapped_column(Integer)
    """Prompt tokens served from the provider's prompt cache; NULL when the provider does not say."""
    latency_ms: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = _now()


class Escalation(Base):
    """One hand-over to humans: open -> claimed -> resolved or handed_back, with who and when."""

    __tablename__ = "escalations"
    __table_args__ = (
        UniqueConstraint("case_channel", "case_ts"),
        # Forgetting a person finds them by these (`agents.personal`).
        Index("ix_escalations_customer", "customer"),
        Index("ix_escalations_claimed_by", "claimed_by"),
        Index("ix_escalations_closed_by", "closed_by"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    inbound_id: Mapped[int | None] = mapped_column(ForeignKey("inbound.id", ondelete="SET NULL"))
    status: Mapped[str] = mapped_column(Text, server_default="open")
    reason: Mapped[str] = mapped_column(Text)
    trigger: Mapped[str] = mapped_column(Text)
    agent: Mapped[str] = mapped_column(Text)
    customer: Mapped[str | None] = mapped_column(Text)
    """Who wrote the message that escalated (a Slack user id)."""
    case_channel: Mapped[str | None] = mapped_column(Text)
    case_ts: Mapped[str | None] = mapped_column(Text)
    """The case message in the staff channel; its thread is where staff talk to the customer."""
    claimed_by: Mapped[str | None] = mapped_column(Text)
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    first_response_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    closed_by: Mapped[str | None] = mapped_column(Text)
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reminders_sent: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = _now()


class Refund(Base):
    __tablename__ = "refunds"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    order_id: Mapped[str] = mapped_column(Text, unique=True)
    amount_cents: Mapped[int] = mapped_column(Integer)
    conversation_id: Mapped[int | None] = mapped_column(ForeignKey("conversations.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = _now()


class Received(Base):
    """Every delivery a channel made and the bot accepted, by its id (Slack's event_id, a slash command's or click's
    trigger, a Teams activity's id): retries, replays and duplicates are recognised here."""

    __tablename__ = "received"

    event_id: Mapped[str] = mapped_column(Text, primary_key=True)
    team_id: Mapped[str | None] = mapped_column(Text)
    event_type: Mapped[str] = mapped_column(Text)
    disposition: Mapped[str] = mapped_column(Text)
    """stored (became a customer message), ignored (bot, subtype, other channel), or what else took it."""
    received_at: Mapped[datetime] = _now()


class Preview(Base):
    """An answer a channel shows while the model writes it (Slack's streamed message, Teams' streaming typing):
    never the answer of record. The next message the outbox owes the customer's thread finishes it in place (its
    text replaced by that message's) and closes it, so a stream cut short (a process killed, a stream expired, an
    append refused) never stays as the answer, and never stands beside it. At most one is open per conversation."""

    __tablename__ = "previews"
    __table_args__ = (Index("ix_previews_open", "conversation_id", unique=True, postgresql_where="state = 'open'"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    platform: Mapped[str] = mapped_column(Text)
    channel: Mapped[str] = mapped_column(Text)
    thread: Mapped[str | None] = mapped_column(Text)
    stream_id: Mapped[str | None] = mapped_column(Text)
    """The platform's id of the streamed message (Slack's ts, Teams' streamId) once it answered the start; None
    while the start's outcome is unknown (the finisher then looks for the message)."""
    state: Mapped[str] = mapped_column(Text, server_default="open")
    """open, finished (a message of record replaced it) or dropped (nothing was shown)."""
    shown: Mapped[str] = mapped_column(Text, server_default="")
    """What the stream has shown so far, as the customer sees it: the finisher replaces it only if it differs."""
    started_at: Mapped[datetime] = _now()
    shown_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """When the stream last showed something: its finisher waits out the platform's pace from there."""


class Outbox(Base):
    """Web API calls owed to Slack, written in the same transaction as what caused them, sent in id order per
    conversation. A post carries its outbox id in Slack message metadata, so a post whose answer was lost in a
    crash is found in the thread instead of being sent twice."""

    __tablename__ = "outbox"
    __table_args__ = (
        Index("ix_outbox_unsent", "id", postgresql_where="done_at IS NULL"),
        Index("ix_outbox_unsent_by_conversation", "conversation_id", "id", postgresql_where="done_at IS NULL"),
        Index("ix_outbox_given_up", "id", postgresql_where="outcome = 'given_up'"),
        Index("ix_outbox_posted", "channel", "result_ts", postgresql_where="result_ts IS NOT NULL"),
        Index(
            "ix_outbox_done_held",
            "done_at",
            postgresql_where="done_at IS NOT NULL AND (result_ts IS NULL OR text IS NOT NULL)",
        ),
        Index("ix_outbox_author", "author"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    conversation_id: Mapped[int | None] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(Text)
    """The delivery it holds (`agents.db.deliveries`: post, reaction, case, relay, reminder, ...)."""
    channel: Mapped[str] = mapped_column(Text)
    thread_ts: Mapped[str | None] = mapped_column(Text)
    target_ts: Mapped[str | None] = mapped_column(Text)
    """The message a reaction goes on."""
    text: Mapped[str | None] = mapped_column(Text)
    reaction: Mapped[str | None] = mapped_column(Text)
    escalation_id: Mapped[int | None] = mapped_column(ForeignKey("escalations.id", ondelete="CASCADE"))
    author: Mapped[str | None] = mapped_column(Text)
    """The Slack user a relayed message is attributed to."""
    source_ts: Mapped[str | None] = mapped_column(Text)
    """The staff message a relay copies, so edits and deletions of it reach the copy."""
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    attempted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """After a transient failure, not before this (exponential backoff); later rows of the conversation wait."""
    done_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """When the row stopped being owed: see `outcome`."""
    outcome: Mapped[str | None] = mapped_column(Text)
    """sent, skipped or given_up (`agents.db.deliveries.Outcome`); None while owed."""
    result_ts: Mapped[str | None] = mapped_column(Text)
    uploaded: Mapped[list[str] | None] = mapped_column(JSONB)
    """A file relay's uploaded file ids, recorded before they are shared (`bot.delivery.shares`): looked for, not
    uploaded again, after an unknown outcome."""
    sources: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB(none_as_null=True))
    """An agent's answer: the knowledge it was grounded in (`agents.db.deliveries.Source`), [] for none; NULL for
    every other row (a notice, a relay), which no channel labels as AI-made (SQL's NULL, not JSON's null, however
    the row is written)."""
    last_error: Mapped[str | None] = mapped_column(Text)
    erases: Mapped[int | None] = mapped_column(BigInteger)
    """An erase row's target: the outbox row whose post it deletes (`agents.db.deliveries.Erase`)."""
    created_at: Mapped[datetime] = _now()


class KnowledgeCollection(Base):
    """A named set of documents, embedded by one embedder: querying it with another is refused."""

    __tablename__ = "kb_collections"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    embedder: Mapped[str] = mapped_column(Text)
    dim: Mapped[int | None] = mapped_column(Integer)
    """None until the embedder has answered: the passages are stored, searched by full text, embedded later."""
    language: Mapped[str | None] = mapped_column(Text)
    """The language the operator declared for its documents (agents.language.Language); None: each detected."""
    languages: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=sql("'{}'"))
    """The languages of its documents (a superset, never shrunk): a question's full text is searched in each."""
    created_at: Mapped[datetime] = _now()


class KnowledgeDocument(Base):
    __tablename__ = "kb_documents"
    __table_args__ = (UniqueConstraint("collection", "source"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    collection: Mapped[str] = mapped_column(ForeignKey("kb_collections.name", ondelete="CASCADE"))
    source: Mapped[str] = mapped_column(Text)
    """Path or URL the document came from: the re-ingest key."""
    title: Mapped[str] = mapped_column(Text)
    content_hash: Mapped[str] = mapped_column(Text)
    superseded: Mapped[bool] = mapped_column(Boolean, server_default=sql("false"))
    """The document says it no longer applies (agents.knowledge.documents.says_superseded): ranked lower."""
    language: Mapped[str | None] = mapped_column(Text)
    """The language its full text is stemmed in (declared for the collection, else detected, else English); None:
    stored before migration 0029, in English without accent folding, redone at its next ingestion."""
    ingested_at: Mapped[datetime] = _now()


class KnowledgeChunk(Base):
    """A passage: its document's title, its section heading, text, embedding and full-text vector.

    `embedding` has no fixed dimension (collections differ); `dim` selects the partial HNSW index built for
    that dimension on `embedding::vector(dim)`; both are NULL while no embedder works (full-text search only).
    `tsv` is generated by Postgres from title, heading and text."""

    __tablename__ = "kb_chunks"
    __table_args__ = (
        # fastupdate off (migration 0023): searched with every message, written at ingestion only.
        Index("ix_kb_chunks_tsv", "tsv", postgresql_using="gin", postgresql_with={"fastupdate": "off"}),
        Index("ix_kb_chunks_collection", "collection"),
        Index("ix_kb_chunks_unembedded", "collection", postgresql_where=sql("dim IS NULL")),
        Index("ix_kb_chunks_identifiers", "identifiers", postgresql_using="gin", postgresql_with={"fastupdate": "off"}),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    document_id: Mapped[int] = mapped_column(ForeignKey("kb_documents.id", ondelete="CASCADE"), index=True)
    collection: Mapped[str] = mapped_column(Text)
    ordinal: Mapped[int] = mapped_column(Integer)
    title: Mapped[str] = mapped_column(Text)
    heading: Mapped[str | None] = mapped_column(Text)
    text: Mapped[str] = mapped_column(Text)
    dim: Mapped[int | None] = mapped_column(Integer)
    embedding: Mapped[Any] = mapped_column(Vector(), nullable=True)
    identifiers: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=sql("'{}'"))
    """The model numbers, part and error codes the passage names, normalised (agents.knowledge.identifiers)."""
    tsv: Mapped[Any] = mapped_column(TSVECTOR, nullable=False)
    """Title and heading (weight A) and text (B), accent-folded, in the document's language's text-search
    configuration; written at ingestion (agents.knowledge.store.TSV)."""


class SendLease(Base):
    """Which process sends a conversation's outbox rows (in order), until when; 0 stands for rows of no
    conversation."""

    __tablename__ = "send_leases"

    conversation_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    owner: Mapped[str] = mapped_column(Text)
    until: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Pause(Base):
    """The bot is paused for conversations whose key matches `scope` (a LIKE pattern): their customers get a
    person instead of an agent."""

    __tablename__ = "pauses"

    scope: Mapped[str] = mapped_column(Text, primary_key=True)
    label: Mapped[str] = mapped_column(Text)
    """How admins see it: a channel mention, or "everywhere"."""
    paused_by: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class AdminAction(Base):
    """One admin command, refused ones included."""

    __tablename__ = "admin_actions"
    __table_args__ = (Index("ix_admin_actions_created", "created_at"), Index("ix_admin_actions_user", "user_id"))

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    user_id: Mapped[str] = mapped_column(Text)
    channel_id: Mapped[str | None] = mapped_column(Text)
    command: Mapped[str] = mapped_column(Text)
    """The first word: the subcommand ("pause"), or what was typed instead of one."""
    arguments: Mapped[str] = mapped_column(Text, server_default="")
    allowed: Mapped[bool] = mapped_column(Boolean)
    ok: Mapped[bool | None] = mapped_column(Boolean)
    """None while it runs, and for good if it never finished (the process died)."""
    result: Mapped[str] = mapped_column(Text, server_default="")
    created_at: Mapped[datetime] = _now()


class RateCounter(Base):
    """One customer's or one channel's use of the agents in the current minute and UTC day (agents.limits):
    one row each, updated in place by every turn, read by primary key at every turn's start."""

    __tablename__ = "rate_counters"

    scope: Mapped[str] = mapped_column(Text, primary_key=True)
    """user (`name` is the message's author) or channel (`name` is the conversation key's channel part)."""
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    minute: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    answered: Mapped[int] = mapped_column(Integer, server_default="0")
    """Messages an agent answered in `minute`."""
    day: Mapped[date] = mapped_column(Date)
    tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    """Prompt and completion tokens of the LLM calls of `day` (UTC)."""
    told_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """The customer was told of a limit; no second notice before then (the end of that limit's window)."""


class TeamsServiceUrl(Base):
    """Where a Teams conversation's Bot Connector service is: its id without `;messageid=` (a channel, a chat), or
    `tenant:<id>` for any conversation of a tenant that has not written yet (the staff channel's first case)."""

    __tablename__ = "teams_service_urls"

    conversation: Mapped[str] = mapped_column(Text, primary_key=True)
    service_url: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=sql("now()"))


class AnswerFeedback(Base):
    """A person's 👍 or 👎 on one of the bot's answers (a posted message), the last click kept."""

    __tablename__ = "answer_feedback"
    __table_args__ = (
        UniqueConstraint("channel", "message_ts", "user_id"),
        Index("ix_answer_feedback_conversation", "conversation_id"),
        Index("ix_answer_feedback_updated", "updated_at"),
        Index("ix_answer_feedback_user", "user_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    outbox_id: Mapped[int | None] = mapped_column(ForeignKey("outbox.id", ondelete="SET NULL"))
    """The post that showed the answer."""
    message_id: Mapped[int | None] = mapped_column(ForeignKey("messages.id", ondelete="SET NULL"))
    """The assistant message the answer came from, and `agent` the agent that wrote it."""
    agent: Mapped[str | None] = mapped_column(Text)
    channel: Mapped[str] = mapped_column(Text)
    message_ts: Mapped[str] = mapped_column(Text)
    user_id: Mapped[str] = mapped_column(Text)
    rating: Mapped[str] = mapped_column(Text)
    """good or bad (`bot.feedback.Rating`)."""
    action_ts: Mapped[str] = mapped_column(Text)
    """Slack's time of the click kept: an older click arriving late does not overwrite a newer one."""
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class Csat(Base):
    """The customer's satisfaction with a resolved case: asked once (`asked_at`), rated 1 to 5 or not at all."""

    __tablename__ = "csat"
    __table_args__ = (
        UniqueConstraint("escalation_id"),
        CheckConstraint("rating BETWEEN 1 AND 5", name="ck_csat_rating"),
        Index("ix_csat_customer", "customer", "asked_at"),
        Index("ix_csat_resolved_by", "resolved_by"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    escalation_id: Mapped[int] = mapped_column(ForeignKey("escalations.id", ondelete="CASCADE"))
    conversation_id: Mapped[int] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    customer: Mapped[str] = mapped_column(Text)
    """Who is asked, and who alone may answer (a Slack user id)."""
    agent: Mapped[str] = mapped_column(Text)
    trigger: Mapped[str] = mapped_column(Text)
    resolved_by: Mapped[str | None] = mapped_column(Text)
    rating: Mapped[int | None] = mapped_column(Integer)
    asked_at: Mapped[datetime] = _now()
    rated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    comment: Mapped[str | None] = mapped_column(Text)
    """What the customer wrote in the modal that follows their rating (other people's text: escaped where shown)."""


class Forgotten(Base):
    """A person forgotten (`agents.personal`): when, who asked, and how many rows of each table it changed; never
    whom."""

    __tablename__ = "forgotten"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    requested_by: Mapped[str] = mapped_column(Text)
    """The admin's platform id, or `cli:<login>`."""
    counts: Mapped[dict[str, Any]] = mapped_column(server_default="{}")
    forgotten_at: Mapped[datetime] = _now()


class RetentionLog(Base):
    """How many rows of one kind a retention run erased (bot.retention), and when: never which."""

    __tablename__ = "retention_log"
    __table_args__ = (Index("ix_retention_log_ran_at", "ran_at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    kind: Mapped[str] = mapped_column(Text)
    """`bot.retention.Kind`."""
    erased: Mapped[int] = mapped_column(Integer)
    ran_at: Mapped[datetime] = _now()
