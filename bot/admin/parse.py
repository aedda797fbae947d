"""The text after `/support`, turned into one typed command or a usage error. Nothing here touches Slack or the
database. Slack escapes what it recognises (manifest: should_escape), so channels arrive as <#C123|name>, links
as <https://...|label>, and &, <, > in plain text as HTML entities."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs

Listing = Literal["open", "human", "recent"]
Change = Literal["handback", "close", "reset"]


@dataclass(frozen=True)
class ThreadRef:
    """A Slack message link: a customer thread, or a case message in the staff channel."""

    channel: str
    ts: str


@dataclass(frozen=True)
class CaseRef:
    escalation_id: int


Ref = ThreadRef | CaseRef


@dataclass(frozen=True)
class Help:
    topic: str | None = None


@dataclass(frozen=True)
class Status:
    pass


@dataclass(frozen=True)
class Agents:
    pass


@dataclass(frozen=True)
class Conversations:
    listing: Listing = "recent"


@dataclass(frozen=True)
class Show:
    ref: Ref


@dataclass(frozen=True)
class Escalations:
    pass


@dataclass(frozen=True)
class ChangeConversation:
    change: Change
    ref: Ref


@dataclass(frozen=True)
class Pause:
    channel: str | None
    """None: everywhere."""


@dataclass(frozen=True)
class Resume:
    channel: str | None


@dataclass(frozen=True)
class KbSearch:
    query: str


@dataclass(frozen=True)
class KbStats:
    pass


@dataclass(frozen=True)
class Stats:
    days: int = 7


@dataclass(frozen=True)
class Tools:
    """The audit trail of the agents' tool calls over the last `days`."""

    days: int = 1


@dataclass(frozen=True)
class Forget:
    """Erase everything held about one person (`agents.personal`)."""

    user: str


Command = (
    Help
    | Status
    | Agents
    | Conversations
    | Show
    | Escalations
    | ChangeConversation
    | Pause
    | Resume
    | KbSearch
    | KbStats
    | Stats
    | Tools
    | Forget
)


@dataclass(frozen=True)
class UsageError:
    problem: str
    usage: str
    """The usage line of the subcommand it concerns (or the whole list)."""


USAGE: dict[str, tuple[str, str]] = {
    "help": ("help", "this list"),
    "status": ("status", "database, LLM provider, tool sources, backlog, open cases, version, uptime"),
    "agents": ("agents", "the roster and who may hand off to whom"),
    "conversations": ("conversations [open|human|recent]", "recent conversations (default: recent)"),
    "show": ("show <thread link>", "one conversation: state, agent, last messages, handoffs"),
    "escalations": ("escalations", "open cases with their age and owner"),
    "handback": ("handback <thread link>", "end the human takeover; the last AI agent answers again"),
    "close": ("close <thread link>", "close the conversation (and its case); the next message starts afresh"),
    "reset": ("reset <thread link>", "back to triage with the context cleared"),
    "pause": ("pause [#channel]", "stop answering there (everywhere without a channel); customers get a person"),
    "resume": ("resume [#channel]", "answer again there (everywhere without a channel)"),
    "kb": ("kb search <query> | kb stats", "search the knowledge base, or count its documents"),
    "stats": ("stats [days]", "conversations, handoffs, escalations, time to claim, LLM usage (default 7 days)"),
    "tools": ("tools [days]", "tool calls by tool and source, failures, timings, and the last 10 (default 1 day)"),
    "forget": (
        "forget @person",
        "erase everything held about them: conversations, cases, files' text, the bot's posts",
    ),
}
MAX_DAYS = 365
_LINK = re.compile(r"^https?://[^/\s]+/archives/(?P<channel>[A-Z0-9_]+)/p(?P<ts>\d{7,})(?:\?(?P<query>\S*))?$")
# A bare id is accepted too when it looks like one (Slack's have digits); "#general" is not: only its id is unique.
_CHANNEL = re.compile(r"^<#(?P<id>[CG][A-Z0-9_]+)(?:\|[^>]*)?>$|^(?P<raw>[CG](?=[A-Z_]*\d)[A-Z0-9_]{6,})$")
_TOKEN = re.compile(r"<[^>]*>|[^\s<]+")
_MENTION = re.compile(r"^<@(?P<id>[^|>\s]+)(?:\|[^>]*)?>$")
_KB_SEARCH = re.compile(r"^\s*kb\s+search\s+(?P<query>.+)$", re.IGNORECASE | re.DOTALL)
_CASE = re.compile(r"^(?:#|case:?)?(?P<id>\d{1,12})$", re.IGNORECASE)


def usage(name: str) -> str:
    return f"/support {USAGE[name][0]}"


def _unwrap(token: str) -> str:
    """<https://...|label> or <https://...> as Slack escapes it, or the bare text; entities decoded."""
    if token.startswith("<") and token.endswith(">"):
        token = token[1:-1].split("|", 1)[0]
    return html.unescape(token)


def parse_ref(token: str) -> Ref | None:
    token = _unwrap(token.strip())
    if case := _CASE.match(token):
        return CaseRef(int(case["id"]))
    link = _LINK.match(token)
    if link is None:
        return None
    digits = link["ts"]
    ts = f"{digits[:-6]}.{digits[-6:]}"
    # A reply's link names its thread in the query; a top-level message is its own thread.
    thread = parse_qs(link["query"] or "").get("thread_ts", [ts])[0]
    return ThreadRef(link["channel"], thread)


def parse_channel(token: str) -> str | None:
    found = _CHANNEL.match(token.strip())
    return None if found is None else found["id"] or found["raw"]


def parse(text: str) -> Command | UsageError:
    words = _TOKEN.findall(text)  # a <link|with a label> stays one word
    if not words:
        return Help()
    name, args = words[0].lower(), words[1:]
    if name not in USAGE:
        return UsageError(f"I don't know the subcommand `{words[0]}`.", "")
    match name, args:
        case "help", []:
            return Help()
        case "help", [topic] if topic.lower() in USAGE:
            return Help(topic.lower())
        case "status", []:
            return Status()
        case "agents", []:
            return Agents()
        case "conversations", [] | ["open" | "human" | "recent"]:
            return Conversations(args[0] if args else "recent")
        case "escalations", []:
            return Escalations()
        case "show" | "handback" | "close" | "reset", [token]:
            ref = parse_ref(token)
            if ref is None:
                return UsageError(f"`{_unwrap(token)}` is not a Slack message link or a case number.", usage(name))
            return Show(ref) if name == "show" else ChangeConversation(name, ref)
        case "pause" | "resume", [] | [_]:
            channel = parse_channel(args[0]) if args else None
            if args and channel is None:
                problem = f"`{args[0]}` is not a channel. Pick it with Slack's `#` autocomplete."
                return UsageError(problem, usage(name))
            return Pause(channel) if name == "pause" else Resume(channel)
        case "kb", ["stats"]:
            return KbStats()
        case "kb", ["search", _, *_]:
            found = _KB_SEARCH.match(text)
            assert found is not None
            return KbSearch(html.unescape(" ".join(found["query"].split())))
        case "stats" | "tools", []:
            return Stats() if name == "stats" else Tools()
        case "stats" | "tools", [days] if days.isdigit() and 1 <= int(days) <= MAX_DAYS:
            return Stats(int(days)) if name == "stats" else Tools(int(days))
        case "stats" | "tools", _:
            return UsageError(f"The number of days must be between 1 and {MAX_DAYS}.", usage(name))
        case "forget", [person]:
            mention = _MENTION.match(person)
            if mention is None:
                return UsageError(f"`{_unwrap(person)}` is not a person. Mention them with `@`.", usage(name))
            return Forget(mention["id"])
    return UsageError("That doesn't look right.", usage(name))
