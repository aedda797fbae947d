"""The bot's own messages coming back: Slack sends an app every message of the channels it is in, its own posts, edits
and deletions too, several per answer. Those are dismissed here on the signed body, before Bolt parses, authorises and
routes it, which costs more than everything else such a request does. Whatever is not surely an echo goes on to Bolt,
whose own self-event check then decides as before."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from bot.slack.app import Authorisation


class Echoes:
    """Tells an event of the bot's own message from everything else, once Slack has said who the bot is."""

    def __init__(self, authorisation: Authorisation) -> None:
        self.authorisation = authorisation

    def dismissed(self, body: str) -> bool:
        """Whether `body` (signed; an Events API request) is a `message` event of a message the bot wrote: posted,
        edited or deleted. Bolt's rule for self events, on message events only: the event's `bot_id` is ours, or its
        author (the event's `user`, else its edited or deleted message's) is the bot user."""
        identity = self.authorisation.known
        if identity is None or not identity.bot_id or not identity.bot_user_id:
            return False
        # Every message of ours carries our bot id; nearly nothing else does (a customer's text that names it is
        # parsed, and let through): the rest never gets parsed here.
        if identity.bot_id not in body:
            return False
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):  # a form body (a click, a command), or no JSON at all: Bolt's to judge
            return False
        if not isinstance(payload, dict) or payload.get("type") != "event_callback":
            return False
        event = payload.get("event")
        if not isinstance(event, dict) or event.get("type") != "message":
            return False
        return event.get("bot_id") == identity.bot_id or _author(event) == identity.bot_user_id


def _author(event: Mapping[str, Any]) -> object:
    """Who wrote the message an event is about, as Bolt reads it: the event's own user, or the edited (or deleted)
    message's."""
    if "user" in event:
        return event["user"]
    for key in ("message", "previous_message"):
        inner = event.get(key)
        if isinstance(inner, Mapping):
            return inner.get("user")
    return None
