"""The Slack edge: Events API payloads become typed values here, and nothing past this module sees a dict."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agents.address import Platform
from agents.attachments import FileRef
from bot.channels.incoming import (
    CaseAction,
    CustomerMessage,
    Delivery,
    Ignored,
    Incoming,
    StaffDelete,
    StaffEdit,
    StaffReply,
)

# A file share still carries the customer's words; a broadcast thread reply is a thread reply.
_DELIVERED_SUBTYPES = frozenset({None, "file_share", "thread_broadcast"})


def case_action_of(body: Mapping[str, Any]) -> CaseAction | None:
    actions = body.get("actions") or []
    if not actions or not isinstance(actions[0], Mapping):
        return None
    try:
        escalation_id = int(actions[0].get("value") or "")
    except ValueError:
        return None
    user = body.get("user") or {}
    action_id = str(actions[0].get("action_id"))
    channel, team = _id_of(body.get("channel")), _id_of(body.get("team"))
    return CaseAction(action_id, escalation_id, str(user.get("id")), channel, team, user.get("team_id"))


def _id_of(value: Any) -> str | None:
    """The id of a `{"id": ...}` object of a payload."""
    found = value.get("id") if isinstance(value, Mapping) else None
    return None if found is None else str(found)


@dataclass(frozen=True)
class Policy:
    """Which messages the bot answers."""

    bot_user_id: str | None
    staff_channel: str | None
    channels: frozenset[str] = frozenset()
    """Channels served; empty means every channel the bot is in, except the staff channel."""
    answer_bots: bool = False


def trigger_of(body: Mapping[str, Any]) -> Delivery | None:
    """A slash command or interaction, identified by its trigger_id (unique per user action), or None. Its key
    shares the event ids' table, prefixed, so that the two never meet."""
    trigger = body.get("trigger_id")
    if not isinstance(trigger, str) or not trigger:
        return None
    kind = "slash_command" if "command" in body else str(body.get("type") or "interaction")
    team = body.get("team_id") or _id_of(body.get("team"))
    return Delivery(f"trigger:{trigger}", kind, None if team is None else str(team))


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


def _classify_staff(event: Mapping[str, Any], channel: str, team: str) -> Incoming:
    """Staff channel traffic: only colleagues' messages in case threads matter (bots never: no relay loops)."""
    subtype = event.get("subtype")
    inner = event.get("message") if subtype == "message_changed" else event.get("previous_message")
    message: Mapping[str, Any] = (
        inner if subtype in ("message_changed", "message_deleted") and isinstance(inner, Mapping) else event
    )
    ts, thread = message.get("ts"), message.get("thread_ts")
    if message.get("bot_id") or message.get("bot_profile") or event.get("bot_id"):
        return Ignored("bot message in the staff channel")
    if not isinstance(ts, str) or not isinstance(thread, str) or thread == ts:
        return Ignored("staff channel, not in a case thread")
    match subtype:
        case "message_changed":
            return StaffEdit(channel, thread, ts, str(message.get("text") or ""))
        case "message_deleted":
            return StaffDelete(channel, thread, str(event.get("deleted_ts") or ts))
        case None | "file_share" | "thread_broadcast" if isinstance(message.get("user"), str):
            text = str(message.get("text") or "").strip()
            own = message.get("user_team") or message.get("source_team") or message.get("team")
            files = files_of(message)
            own_team = None if own is None else str(own)
            reply = StaffReply(
                channel, thread, ts, str(message["user"]), text, team, Platform.SLACK, own_team, files=files
            )
            return reply if text or files else Ignored("no text")
    return Ignored(f"staff channel subtype {subtype}")


def classify(envelope: Mapping[str, Any], policy: Policy) -> Incoming:
    """Decide what one event_callback envelope is: a customer's message to answer, a colleague's message in a
    case thread, or something to ignore."""
    event = envelope.get("event")
    if not isinstance(event, Mapping):
        return Ignored("no event")
    kind = event.get("type")
    if kind not in ("message", "app_mention"):
        return Ignored(f"event type {kind}")
    team = str(envelope.get("team_id") or event.get("team") or "T?")
    if kind == "message" and policy.staff_channel and event.get("channel") == policy.staff_channel:
        return _classify_staff(event, policy.staff_channel, team)
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
    files = files_of(event)
    if not text and not files:
        return Ignored("no text")
    # A direct message is a thread too: the agent messaging experience (the manifests' agent_view) shows each of a
    # customer's conversations with the app as a thread of its own, answered (and streamed, and titled) in it.
    thread_ts = event.get("thread_ts") or ts
    user_team = str(event.get("user_team") or team)
    shared = envelope.get("is_ext_shared_channel") is True and not is_dm
    return CustomerMessage(
        team, channel, str(thread_ts), ts, user, text, is_dm, user_team, Platform.SLACK, files=files, shared=shared
    )


def files_of(event: Mapping[str, Any]) -> tuple[FileRef, ...]:
    """The files of a message event that can be downloaded. A file Slack only lists (`file_access: check_file_info`,
    shared from another workspace) has no `url_private` in the event; it is left out rather than guessed at."""
    found = []
    for raw in event.get("files") or ():
        if not isinstance(raw, Mapping) or not isinstance(raw.get("url_private"), str):
            continue
        if raw.get("is_external") or raw.get("mode") == "external":
            continue  # a remote file (Google Drive, ...): its url_private is another server's, not Slack's
        size = raw.get("size") if isinstance(raw.get("size"), int) else None
        name = str(raw.get("name") or raw.get("title") or raw.get("id") or "file")
        mime = str(raw.get("mimetype") or "application/octet-stream")
        found.append(FileRef(str(raw.get("id")), name, mime, size, raw["url_private"]))
    return tuple(found)
