"""The Slack edge: Events API payloads become typed values here, and nothing past this module sees a dict."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# A file share still carries the customer's words; a broadcast thread reply is a thread reply.
_DELIVERED_SUBTYPES = frozenset({None, "file_share", "thread_broadcast"})


@dataclass(frozen=True)
class CustomerMessage:
    team: str
    channel: str
    thread_ts: str
    """The thread's root: the conversation is (team, channel, thread_ts), since a ts is unique per channel.
    `DM` for direct messages, which are one conversation per DM channel."""
    ts: str
    user: str
    text: str
    is_dm: bool

    @property
    def conversation_key(self) -> str:
        return conversation_key(self.team, self.channel, self.thread_ts)


@dataclass(frozen=True)
class Ignored:
    reason: str


@dataclass(frozen=True)
class Policy:
    """Which messages the bot answers."""

    bot_user_id: str | None
    staff_channel: str | None
    channels: frozenset[str] = frozenset()
    """Channels served; empty means every channel the bot is in, except the staff channel."""
    answer_bots: bool = False


DM = "dm"
"""The thread part of a direct message's key: a DM is one conversation, answered without threads."""


def conversation_key(team: str, channel: str, thread_ts: str) -> str:
    return f"slack:{team}:{channel}:{thread_ts}"


def parse_conversation_key(key: str) -> tuple[str, str, str | None] | None:
    """(team, channel, thread to reply in: None for a direct message) of a Slack conversation key."""
    parts = key.split(":")
    if len(parts) != 4 or parts[0] != "slack":
        return None
    return parts[1], parts[2], None if parts[3] == DM else parts[3]


@dataclass(frozen=True)
class Delivery:
    """What identifies one Events API delivery, whatever its event."""

    event_id: str
    event_type: str
    team_id: str | None


def delivery_of(envelope: Mapping[str, Any]) -> Delivery:
    event = envelope.get("event")
    event = event if isinstance(event, Mapping) else {}
    # Slack always sends event_id; the fallback only keeps a malformed delivery from crashing the inbox.
    event_id = envelope.get("event_id") or f"{event.get('channel')}:{event.get('ts')}:{event.get('type')}"
    team = envelope.get("team_id")
    return Delivery(str(event_id), str(event.get("type")), None if team is None else str(team))


def _strip_mention(text: str, bot_user_id: str | None) -> str:
    if bot_user_id:
        text = re.sub(rf"<@{re.escape(bot_user_id)}(\|[^>]*)?>", "", text)
    return text.strip()


def classify(envelope: Mapping[str, Any], policy: Policy) -> CustomerMessage | Ignored:
    """Decide what one event_callback envelope is: a customer's message to answer, or something to ignore."""
    event = envelope.get("event")
    if not isinstance(event, Mapping):
        return Ignored("no event")
    kind = event.get("type")
    if kind not in ("message", "app_mention"):
        return Ignored(f"event type {kind}")
    if event.get("subtype") not in _DELIVERED_SUBTYPES:
        return Ignored(f"subtype {event.get('subtype')}")
    if event.get("hidden"):
        return Ignored("hidden")
    user = event.get("user")
    from_bot = bool(event.get("bot_id") or event.get("bot_profile"))
    if from_bot and (not policy.answer_bots or user == policy.bot_user_id):
        return Ignored("bot message")
    if not isinstance(user, str) or user == policy.bot_user_id:
        return Ignored("own or anonymous message")
    channel, ts = event.get("channel"), event.get("ts")
    if not isinstance(channel, str) or not isinstance(ts, str):
        return Ignored("no channel or ts")
    if channel == policy.staff_channel:
        return Ignored("staff channel")
    is_dm = event.get("channel_type") == "im" or channel.startswith("D")
    if policy.channels and channel not in policy.channels and not is_dm:
        return Ignored("channel not served")
    text = _strip_mention(str(event.get("text") or ""), policy.bot_user_id)
    if not text:
        return Ignored("no text")
    team = envelope.get("team_id") or event.get("team") or "T?"
    thread_ts = DM if is_dm else event.get("thread_ts") or ts
    return CustomerMessage(str(team), channel, str(thread_ts), ts, user, text, is_dm)
