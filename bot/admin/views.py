"""Block Kit for `/support` answers. Every answer is ephemeral: a `Reply` of fallback text and blocks.

Messages, names, reasons, passages and provider errors are other people's text: `_quote` makes each inert before it
enters an answer, so an admin's view of a conversation never pings a channel or hides a link's target."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agents.address import Address
from agents.agent import Roster
from agents.identity import Author
from agents.knowledge.store import Hit, KnowledgeStatus
from agents.markup.limits import HEADER_TEXT, clip
from agents.markup.text import escape, inert
from agents.toolsets import SourceStatus
from bot.admin.parse import USAGE, UsageError
from bot.admin.queries import (
    CaseRow,
    ConversationDetail,
    ConversationRow,
    CsatLine,
    Health,
    Score,
    ToolAudit,
    ToolCallLine,
    ToolTally,
    Usage,
)
from bot.retention import KindStatus
from escalation.desk import ActionResult
from escalation.machine import Mode

MAX_TEXT = 2900  # a section's text may hold 3,000 characters
MAX_FIELD = 1900  # a section field 2,000
MAX_BLOCKS = 45  # a message 50
RATING_ICON = {"good": "👍", "bad": "👎"}
MODE: dict[str, str] = {
    Mode.BOT: "🤖 with the bot",
    Mode.AWAITING_HUMAN: "⏳ waiting for a person",
    Mode.HUMAN: "🧑 with a person",
    Mode.CLOSED: "✔️ closed",
}


@dataclass(frozen=True)
class Reply:
    text: str
    blocks: list[dict[str, Any]]


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": clip(text, MAX_TEXT)}}


def _sections(lines: Sequence[str], *, more: str = "") -> list[dict[str, Any]]:
    """Lines packed into as few sections as fit, never cut mid-line (a cut can break a <link|label>); what does
    not fit in the message is counted in a last line instead."""
    blocks: list[dict[str, Any]] = []
    chunk: list[str] = []
    for i, line in enumerate(lines):
        if chunk and len("\n".join([*chunk, line])) > MAX_TEXT:
            blocks.append(_section("\n".join(chunk)))
            chunk = []
            if len(blocks) == MAX_BLOCKS - 3:
                return [*blocks, _context(f"…and {len(lines) - i} more{more}.")]
        chunk.append(line)
    return [*blocks, _section("\n".join(chunk))] if chunk else blocks


def _fields(texts: Sequence[str]) -> dict[str, Any]:
    return {"type": "section", "fields": [{"type": "mrkdwn", "text": clip(t, MAX_FIELD)} for t in texts[:10]]}


def _fields_reply(title: str, fields: Sequence[str], *more: dict[str, Any]) -> Reply:
    texts = [*(f.replace("\n", " ") for f in fields), *(b["text"]["text"] for b in more)]
    return Reply(clip(f"{title}: " + " | ".join(texts), MAX_TEXT), [_header(title), _fields(fields), *more])


def _header(text: str) -> dict[str, Any]:
    return {"type": "header", "text": {"type": "plain_text", "text": clip(text, HEADER_TEXT), "emoji": True}}


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": clip(text, MAX_TEXT)}]}


def _reply(title: str, *body: dict[str, Any] | list[dict[str, Any]]) -> Reply:
    blocks = [b for part in body for b in (part if isinstance(part, list) else [part])]
    text = " ".join(b["text"]["text"] for b in blocks if b["type"] == "section" and "text" in b)
    return Reply(clip(f"{title}: {text}", MAX_TEXT), [_header(title), *blocks])


def ago(at: datetime | None, now: datetime | None = None) -> str:
    if at is None:
        return "never"
    return duration((now or datetime.now(UTC)) - at)


def duration(seconds: Any) -> str:
    if seconds is None:
        return "n/a"
    s = seconds.total_seconds() if hasattr(seconds, "total_seconds") else float(seconds)
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def where(key: str, domain: str | None) -> str:
    """A conversation key as mrkdwn: its channel and a link to its thread."""
    address = Address.parse(key)
    if address is None:
        return f"`{key}`"
    channel, thread = address.channel, address.thread
    if thread is None:
        return f"direct message `{channel}`"
    if domain is None:
        return f"<#{channel}> thread `{thread}`"
    return f"<#{channel}> · <{message_link(domain, channel, thread)}|thread>"


def message_link(domain: str, channel: str, ts: str) -> str:
    return f"https://{domain}.slack.com/archives/{channel}/p{ts.replace('.', '')}"


def _quote(text: str, limit: int = 160) -> str:
    """Someone else's text on one line, inert (no mention, no disguised link) and at most `limit` characters."""
    return clip(inert(" ".join(text.split())), limit)


def _code(text: str, limit: int = 80) -> str:
    """Machine text (a tool's name, a system's error output) shown verbatim: on one line, escaped, and in a code span
    so that its `*`, `_` and `~` format nothing; a backtick of its own, which would close the span, is shown as ˋ."""
    flat = " ".join(text.split()).replace("`", "ˋ")
    return f"`{escape(clip(flat, limit))}`" if flat else "` `"


def _ms(ms: float) -> str:
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def _utc(when: datetime) -> datetime:
    """The database's times are aware; a naive one (a source's own clock) is taken to be UTC already."""
    return when.astimezone(UTC) if when.tzinfo else when


def help_reply(topic: str | None = None) -> Reply:
    names = [topic] if topic else list(USAGE)
    lines = [f"`/support {USAGE[n][0]}`  {USAGE[n][1]}" for n in names]
    return _reply(
        "/support",
        _section("\n".join(lines)),
        _context("Thread links: a message's ⋯ → *Copy link*. Case numbers work too."),
    )


def usage_reply(error: UsageError) -> Reply:
    usage = f"Usage: `{error.usage}`" if error.usage else "Try `/support help` for the list."
    return _reply("/support", _section(f"{error.problem}\n{usage}"))


def refusal_reply(user: str) -> Reply:
    return _reply(
        "/support",
        _section(
            "Sorry, `/support` is only for the people who run this bot. If you should have access, ask an admin "
            f"to add your user ID (`{user}`) to `ADMIN_USER_IDS`."
        ),
    )


def result_reply(title: str, result: ActionResult) -> Reply:
    return _reply(title, _section(("✅ " if result.ok else "⚠️ ") + result.message))


def forget_reply(counts: Mapping[str, int]) -> Reply:
    """What a forget changed, per table; never whom (the reply is recorded with the command)."""
    if not counts:
        return _reply("Forget", _section("Nothing was held about that person."))
    lines = [f"• {table}: {n}" for table, n in counts.items()]
    return _reply(
        "Forget",
        _section("✅ Forgotten. Rows changed or deleted:\n" + "\n".join(lines)),
        _context("The bot's posts in their conversations and the staff channel are being deleted."),
    )


def knowledge_field(status: KnowledgeStatus | str) -> str:
    """How knowledge search runs; when not by vector everywhere, why and what to do, in the admin's words."""
    if isinstance(status, str):
        return f"*Knowledge*\n{status}"
    dims = f", {status.dim} dims" if status.dim else ""
    lines = [f"*Knowledge*\n{status.search} search ({status.embedder}{dims})"]
    if status.unembedded:
        lines.append(f"{status.unembedded} passage(s) without vectors yet (found by full text meanwhile)")
    # Provider error messages are untrusted text: escaped, so they cannot become links or mentions.
    lines += [f"⚠️ {clip(escape(' '.join(problem.split())), 600)}" for problem in status.problems[:3]]
    return "\n".join(lines)


def status_reply(
    health: Health | str,
    *,
    llm: str,
    knowledge: KnowledgeStatus | str,
    staff_channel: str | None = None,
    version: str,
    uptime_s: float,
    started: datetime,
    sources: Sequence[SourceStatus] | str = (),
    retention: Sequence[KindStatus] | str = (),
) -> Reply:
    running = f"*Version*\n{version}, up {duration(uptime_s)} (since {started:%Y-%m-%d %H:%M} UTC)"
    tools = [sources_field(sources)] if sources else []
    if isinstance(health, str):
        fields = [
            f"*Database*\n⚠️ down: {health}",
            f"*LLM provider*\n{llm}",
            knowledge_field(knowledge),
            running,
            *tools,
        ]
        return Reply(
            "Status: " + " | ".join(f.replace("\n", " ") for f in fields), [_header("Status"), _fields(fields)]
        )
    backlog = f"{health.pending_messages} message(s) waiting"
    if health.oldest_pending_s is not None:
        backlog += f", the oldest for {duration(health.oldest_pending_s)}"
    llm_recent = f"last 15 min: {health.llm_calls_15m} call(s), {health.llm_failures_15m} failed"
    if health.offline_answers_15m:
        llm_recent += f"; {health.offline_answers_15m} answered offline"
    pauses = ", ".join(f"{label} (by <@{who}>)" for label, who in health.pauses) or "none"
    fields = [
        f"*Database*\nok, {health.database_ms:.0f} ms",
        f"*LLM provider*\n{llm}\n{llm_recent}",
        knowledge_field(knowledge),
        f"*Inbox*\n{backlog}; {health.unsent_outbox} outbox call(s) unsent",
        f"*Escalations*\n{health.open_cases} open, {health.unclaimed_cases} unclaimed; staff channel "
        + (f"⚠️ {escape(staff_channel)}" if staff_channel else "ok"),
        f"*Paused*\n{pauses}",
        f"*Rate limits*\n{health.held_back} customer(s) over a limit now",
        running,
        failures_field(health),
        *tools,
    ]
    # A section of its own: a message's fields are ten at most, and a line per kind reads better at full width.
    return _fields_reply("Status", fields, *([_section(retention_field(retention))] if retention else []))


def retention_field(kinds: Sequence[KindStatus] | str) -> str:
    """Each kind's period, what is held of it now, and what retention erased in the last day."""
    if isinstance(kinds, str):
        return f"*Retention*\n{kinds}"
    lines = ["*Retention*"]
    for k in kinds:
        period = f"{k.days} days" if k.days else "kept for ever"
        held = f"{k.held:,} {k.kind.unit}(s) held"
        lines.append(f"{k.kind.label} ({period}): {held}, {k.erased_last_day:,} erased in the last 24 h")
    return "\n".join(lines)


SOURCE_KIND = {"mcp": "MCP", "http": "HTTP"}


def sources_field(sources: Sequence[SourceStatus] | str) -> str:
    """One line per source of the operator's tools (MCP servers, HTTP endpoints): up with what it offers, or down
    with why and what the bot does about it, in the source's own words (escaped: an error may quote the system)."""
    if isinstance(sources, str):
        return f"*Tool sources*\n⚠️ {escape(sources)}"
    return "*Tool sources*\n" + "\n".join(source_line(s) for s in sources)


def source_line(status: SourceStatus) -> str:
    kind = SOURCE_KIND.get(status.kind, escape(status.kind))
    detail = escape(" ".join(status.detail.split()))
    if status.up:
        return f"{kind} {_code(status.name, 60)}: ✅ {clip(detail, 300)}"
    # The source says why it is down; "down" and since when are added only when its words do not already say so.
    if not detail.lower().startswith("down"):
        since = f" since {_utc(status.since):%H:%M} UTC" if status.since else ""
        detail = f"down{since}: {detail}"
    return f"{kind} {_code(status.name, 60)}: ⚠️ {clip(detail, 300)}"


def failures_field(health: Health) -> str:
    """What failed for good: Slack calls given up and messages set aside, counted, with the latest few."""
    if not health.given_up and not health.set_aside:
        return "*Failures*\nnone"
    lines = [f"*Failures*\n{health.given_up} Slack call(s) given up, {health.set_aside} message(s) set aside"]
    lines += [
        f"• {kind} in `{key or '-'}`: {clip(escape(error), 80)} ({when:%d %b %H:%M})"
        for kind, key, error, when in health.recent_give_ups
    ]
    lines += [
        f"• message {mid} in `{key}` set aside after {n} tries ({when:%d %b %H:%M})"
        for mid, key, n, when in health.recent_set_aside
    ]
    return "\n".join(lines)


def agents_reply(roster: Roster) -> Reply:
    lines = []
    for agent in roster.agents.values():
        entry = " (entry)" if agent.name == roster.entry else ""
        # Its tools as they are now (an MCP server's as last listed), where each runs, and which ask the customer first.
        own = [t for t in roster.tools_of(agent.name) if not _moves(t.name)]
        tools = (
            ", ".join(
                _code(t.name)
                + (f" ({_code(t.source)})" if t.source != "python" else "")
                + (" (asks first)" if t.acts else "")
                for t in own
            )
            or "none"
        )
        to = ", ".join(f"*{t}*" for t in agent.handoffs) or "nobody"
        lines.append(f"*{agent.name}*{entry}: {_quote(agent.description, 140)}\n   hands off to {to} · tools: {tools}")
    return _reply(
        "Agents", _sections(lines), _context("Every agent can also escalate to a person (escalate_to_human).")
    )


def _moves(name: str) -> bool:
    """The transfer and escalation tools every roster adds: said once, not listed per agent."""
    return name.startswith("transfer_to_") or name == "escalate_to_human"


def conversations_reply(listing: str, total: int, rows: Sequence[ConversationRow], domain: str | None) -> Reply:
    if not rows:
        return _reply(f"Conversations: {listing}", _section("None."))
    lines = [
        f"{where(r.key, domain)} · {MODE.get(r.mode, r.mode)} · *{r.agent}* · {r.messages} msg · "
        f"{ago(r.updated_at)} ago"
        for r in rows
    ]
    shown = f"the {len(rows)} most recently active of {total}" if total > len(rows) else f"{total}"
    return _reply(f"Conversations: {listing}", _sections(lines), _context(f"Showing {shown}."))


def detail_reply(detail: ConversationDetail, domain: str | None) -> Reply:
    row = detail.row
    head = (
        f"{where(row.key, domain)}\n*State:* {MODE.get(row.mode, row.mode)} · *agent:* {row.agent} · "
        f"{row.messages} message(s) · {detail.tool_runs} tool call(s) · started {ago(detail.created_at)} ago"
    )
    if detail.history_from:
        head += "\n_Reset by an admin: earlier messages are out of the agents' context._"
    icons = {"user": "👤", "assistant": "🤖", "staff": "🧑‍💼", "tool": "🔧"}
    lines = [
        f"{icons.get(line.role, '•')} *{escape(line.who or line.role)}*: {_quote(line.text, 200)}"
        for line in detail.lines
    ]
    handoffs = [f"{f} → {t}" + (f" ({_quote(r, 80)})" if r else "") for f, t, r, _ in detail.handoffs]
    feedback = [
        f"{RATING_ICON.get(f.rating, f.rating)} <@{f.user}> on {escape(f.agent or '?')}'s answer, {ago(f.at)} ago"
        for f in detail.feedback
    ]
    csat = [
        f"case #{c.case}: " + (f"rated {c.rating}/5" if c.rating else "asked, not rated") + _comment(c, 300)
        for c in detail.csat
    ]
    return _reply(
        "Conversation",
        _section(head),
        _sections(["*Last messages*", *(lines or ["none"])]),
        _sections(["*Handoffs*", *(handoffs or ["none"])]),
        _sections(["*Cases*", *(case_line(c, domain) for c in detail.cases)]) if detail.cases else [],
        _sections(["*Feedback*", *feedback, *csat]) if feedback or csat else [],
    )


def case_line(case: CaseRow, domain: str | None) -> str:
    owner = f"<@{case.claimed_by}>" if case.claimed_by else "unclaimed"
    link = (
        f" · <{message_link(domain, case.case_channel, case.case_ts)}|case>"
        if domain and case.case_channel and case.case_ts
        else ""
    )
    return f"*#{case.id}* {case.status} · {ago(case.created_at)} old · {owner} · {_quote(case.reason, 100)}{link}"


def cases_reply(total: int, cases: Sequence[CaseRow], domain: str | None) -> Reply:
    if not cases:
        return _reply("Open escalations", _section("None: nobody is waiting for a person."))
    lines = [f"{case_line(c, domain)}\n   {where(c.conversation_key, domain)}" for c in cases]
    shown = f"the oldest {len(cases)} of {total}" if total > len(cases) else f"all {total}"
    return _reply(f"Open escalations: {total}", _sections(lines, more=" cases"), _context(f"Showing {shown}."))


def kb_hits_reply(query: str, hits: Sequence[Hit]) -> Reply:
    if not hits:
        return _reply("Knowledge base", _section(f"Nothing found for _{_quote(query, 100)}_."))
    lines = [
        f"*{i}.* {escape(h.citation)} · `{h.collection}` · score {h.score:.3f}\n>{_quote(h.text, 220)}"
        for i, h in enumerate(hits, 1)
    ]
    return _reply("Knowledge base", _section(f"Top {len(hits)} for _{_quote(query, 100)}_:"), _sections(lines))


def kb_stats_reply(stats: Sequence[dict[str, object]]) -> Reply:
    if not stats:
        return _reply("Knowledge base", _section("Empty. Add documents with `python -m bot kb ingest <folder>`."))
    lines = [
        f"*{s['collection']}*: {s['documents']} document(s), {s['chunks']} chunk(s) · {s['embedder']} ({s['dim']} dim)"
        for s in stats
    ]
    return _reply("Knowledge base", _sections(lines))


def usage_stats_reply(u: Usage) -> Reply:
    rate = f"{u.escalations / u.conversations:.0%}" if u.conversations else "n/a"
    pairs = ", ".join(f"{f} → {t}: {n}" for f, t, n in u.handoffs) or "none"
    triggers = ", ".join(f"{t}: {n}" for t, n in u.escalations_by_trigger)
    cached = "cache not reported" if u.cached_tokens is None else f"{u.cached_tokens:,} cached"
    tokens = f"{u.prompt_tokens:,} prompt ({cached}) + {u.completion_tokens:,} completion"
    limited = sum(n for _, n in u.rate_limited)
    by_limit = ", ".join(f"{limit}: {n}" for limit, n in u.rate_limited)
    fields = [
        f"*Conversations*\n{u.conversations} active, {u.new_conversations} new",
        f"*Messages*\n{u.customer_messages} from customers, {u.staff_messages} from staff"
        + (f"\n{limited} not answered, over a rate limit ({by_limit})" if limited else ""),
        f"*Escalations*\n{u.escalations} ({rate} of conversations)" + (f"\n{triggers}" if triggers else ""),
        f"*Median time*\nto claim {duration(u.median_to_claim_s)}, to first human reply "
        f"{duration(u.median_to_first_reply_s)}",
        f"*LLM*\n{u.llm_calls} call(s), {u.llm_failures} failed\n{tokens} tokens"
        + (f"\n{u.offline_answers} answered offline" if u.offline_answers else ""),
    ]
    title = f"Last {u.days} day{'s' if u.days != 1 else ''}"
    return _fields_reply(
        title, [*fields, feedback_field(u), csat_field(u)], _section(f"*Handoffs*\n{pairs}"), *satisfaction(u)
    )


TALLIES_SHOWN = 60
"""Tools listed by `/support tools` (all are counted): about three sections, leaving room for the latest calls."""


def tools_reply(audit: ToolAudit) -> Reply:
    """The audit trail of the tools the agents called: per tool and source, how often, how often it failed and how
    long it took; then the latest calls with who asked. Names and outputs come from the operator's systems and are
    shown as code; who asked is the platform's verified author, whose name is escaped."""
    title = f"Tool calls: last {audit.days} day{'s' if audit.days != 1 else ''}"
    if not audit.tallies:
        return _reply(title, _section("No tool calls in the period."))
    summary = f"*{audit.calls}* call(s), {audit.failures} failed, {len(audit.tallies)} tool(s)"
    tallies = [_tally_line(t) for t in audit.tallies[:TALLIES_SHOWN]]
    if len(audit.tallies) > TALLIES_SHOWN:
        tallies.append(f"…and {len(audit.tallies) - TALLIES_SHOWN} more tool(s), called less often.")
    latest = [_call_line(c) for c in audit.recent]
    return _reply(
        title,
        _section(summary),
        _sections(tallies),
        _section(f"*The last {len(latest)} call(s)*"),
        _sections(latest),
        _context(
            "Times in UTC. Who asked: the author of the message, as the platform verified it. The model's "
            "arguments are not shown."
        ),
    )


def _tally_line(t: ToolTally) -> str:
    failed = f"⚠️ {t.failures} failed" if t.failures else "0 failed"
    return (
        f"{_code(t.tool, 64)} · {escape(t.source)} · {t.calls} call(s), {failed} · "
        f"p50 {_ms(t.p50_ms)}, p95 {_ms(t.p95_ms)}"
    )


def _call_line(c: ToolCallLine) -> str:
    outcome = f"✅ {_ms(c.duration_ms)}" if c.ok else f"⚠️ failed after {_ms(c.duration_ms)}"
    what = f"{_code(c.tool, 64)} · {escape(c.source)} · *{escape(c.agent)}*"
    line = f"{_utc(c.at):%d %b %H:%M} · {what} · {asker(c.asker)} · {outcome}"
    if not c.ok:
        line += f": {_code((c.failure or '') + ('…' if c.cut else ''), 90)}"
    return line


def asker(author: Author | None) -> str:
    """Who asked, for an admin: the name they had and the platform's id for them (the id is what to search for)."""
    if author is None:
        return "asker unknown"
    who = f"{_quote(author.name, 60)} " if author.name else ""
    return f"asked by {who}{_code(author.user, 60)}"


def feedback_field(u: Usage) -> str:
    return f"*Answer feedback*\n👍 {u.good} · 👎 {u.bad}"


def _comment(line: CsatLine, limit: int) -> str:
    """The customer's comment, quoted inert (their words must not ping anyone or hide a link)."""
    return f"\n>{_quote(line.comment, limit)}" if line.comment else ""


def csat_field(u: Usage) -> str:
    overall = u.csat
    rated = f"{overall.mean:.1f}/5 from {overall.rated} rating(s)" if overall else "no ratings"
    return f"*CSAT*\n{rated}, {u.csat_asked} asked"


def satisfaction(u: Usage) -> list[dict[str, Any]]:
    """Feedback by agent, and CSAT by agent, escalation trigger and colleague (only what has numbers)."""

    def scores(title: str, rows: Sequence[Score], name: Callable[[str], str] = escape) -> str:
        return f"*CSAT by {title}*: " + ", ".join(f"{name(r.name)} {r.mean:.1f} ({r.rated})" for r in rows)

    lines = []
    if u.feedback:
        lines.append(
            "*Feedback by agent*: " + ", ".join(f"{escape(t.name)} 👍 {t.good} 👎 {t.bad}" for t in u.feedback)
        )
    if u.csat_by_agent:
        lines.append(scores("agent", u.csat_by_agent))
        lines.append(scores("trigger", u.csat_by_trigger))
        lines.append(scores("staff member", u.csat_by_staff, lambda user: f"<@{user}>" if user != "?" else user))
    if u.csat_comments:
        lines.append("*Latest CSAT comments*")
        lines += [f"{c.rating}/5 from <@{c.customer}> on case #{c.case}{_comment(c, 200)}" for c in u.csat_comments]
    return [_section("\n".join(lines))] if lines else []


def home_blocks(
    usage: Usage, health: Health | str, *, llm: str, knowledge: KnowledgeStatus | str
) -> list[dict[str, Any]]:
    """The App Home of admins and staff: the last day's numbers and the bot's state (`/support stats` and
    `status` in brief)."""
    if isinstance(health, str):
        cases, pauses = f"*Escalations*\n⚠️ database down: {escape(health)}", "*Paused*\nunknown"
    else:
        cases = (
            f"*Escalations*\n{usage.escalations} today · {health.open_cases} open, "
            f"{health.open_cases - health.unclaimed_cases} claimed"
        )
        pauses = "*Paused*\n" + (", ".join(label for label, _ in health.pauses) or "none")
    numbers = [
        f"*Conversations*\n{usage.conversations} active, {usage.new_conversations} new",
        cases,
        f"*Median time to claim*\n{duration(usage.median_to_claim_s)}",
        feedback_field(usage),
        csat_field(usage),
    ]
    state = [f"*LLM provider*\n{llm}", knowledge_field(knowledge), pauses]
    return [
        _header("Helpdesk today"),
        _fields(numbers),
        *satisfaction(usage),
        {"type": "divider"},
        _header("The bot"),
        _fields(state),
        _context("The last 24 hours. `/support help` lists what admins can do."),
    ]


def plain_home_blocks(note: str) -> list[dict[str, Any]]:
    """The App Home of someone neither staff nor admin: `note` (the home_note text, in their language)."""
    return [_header("Helpdesk"), _section(note)]
