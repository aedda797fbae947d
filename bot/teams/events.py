"""The Teams edge: an authenticated activity becomes a typed value here (the same values the Slack edge makes, with
`platform=TEAMS`), and nothing past this module sees an activity.

Conversations: a personal chat with the bot is one conversation, as is a group chat; in a team channel, a post that
mentions the bot starts one and its reply chain continues it. In the staff channel (TEAMS_STAFF_CHANNEL_ID), the
reply chain of a case's card is the case's thread, and pressing its buttons is a `CaseAction`. In a personal chat,
an admin's message that reads as a `/support` command is an `AdminMessage`. Teams' own 👍/👎 under an answer (the
feedback loop, an `invoke` named `message/submitAction`) is a `FeedbackClick`, recorded as Slack's buttons are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agents.address import DM, Platform
from bot.admin.parse import USAGE
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
from bot.feedback import FeedbackClick, Rating
from bot.teams.html import incoming_text
from bot.teams.messenger import CHAIN, is_channel

ACTION_KEY = "helpdesk_action"
"""Where a card button's data names its action (`bot.teams.adaptive_card` puts it there)."""
ADMIN_PREFIXES = ("/support",)
SUBMIT_ACTION = "message/submitAction"
"""The invoke Teams sends when a person rates a message that has the feedback loop."""
REACTIONS = {"like": Rating.GOOD, "dislike": Rating.BAD}


@dataclass(frozen=True)
class TeamsPolicy:
    app_id: str
    tenant: str
    """Ours: colleagues are members of it, and never guests."""
    bot_name: str
    staff_channel: str | None
    """The Teams staff channel, when staff work in Teams."""
    admins: frozenset[str]
    """Entra object ids allowed to use the /support commands."""

    @property
    def bot_id(self) -> str:
        return f"28:{self.app_id}"


@dataclass(frozen=True)
class AdminMessage:
    """A message to the bot in a personal chat that is a /support command (only acted on for admins)."""

    conversation: str
    user: str
    aad_object_id: str | None
    text: str
    """The command without its `/support` prefix."""


@dataclass(frozen=True)
class Parsed:
    """What one activity is, and how to store it."""

    delivery: Delivery
    incoming: Incoming | CaseAction | AdminMessage | FeedbackClick
    conversation: str
    """The activity's conversation id (with `;messageid=` in a channel)."""
    service_url: str
    tenant: str | None
    continues_only: bool = False
    """A reply in a channel chain that does not mention the bot: it only continues a conversation."""


def _get(value: Any, *path: str) -> Any:
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _text_of(body: Mapping[str, Any], policy: TeamsPolicy) -> str:
    return incoming_text(
        str(body.get("text") or ""), bot_names=(policy.bot_name, _get(body, "recipient", "name") or "")
    )


def mentions_bot(body: Mapping[str, Any], policy: TeamsPolicy) -> bool:
    for entity in body.get("entities") or []:
        if _get(entity, "type") == "mention" and _get(entity, "mentioned", "id") in (policy.bot_id, policy.app_id):
            return True
    return False


def delivery_of(body: Mapping[str, Any]) -> Delivery:
    """The delivery's id, for deduplication: Teams redelivers an activity with its id, which is unique in its
    conversation; an edit carries the edited message's id, so its text tells two edits apart."""
    kind = str(body.get("type"))
    conversation = str(_get(body, "conversation", "id") or "")
    event_id = f"teams:{conversation}:{body.get('id')}:{kind}"
    if kind == "messageUpdate":
        event_id += ":" + hashlib.sha256(str(body.get("text") or "").encode()).hexdigest()[:16]
    return Delivery(event_id, kind, _get(body, "conversation", "tenantId") or _get(body, "channelData", "tenant", "id"))


def parse(body: Mapping[str, Any], policy: TeamsPolicy) -> Parsed:
    """What an authenticated activity (`body`, already checked to be an Activity) is."""
    delivery = delivery_of(body)
    conversation = str(_get(body, "conversation", "id") or "")
    service_url = str(body.get("serviceUrl") or "")
    tenant = delivery.team_id
    sender = body.get("from") or {}
    user, aad = str(_get(sender, "id") or ""), _get(sender, "aadObjectId")
    base, _, root = conversation.partition(CHAIN)

    def parsed(
        incoming: Incoming | CaseAction | AdminMessage | FeedbackClick, *, continues_only: bool = False
    ) -> Parsed:
        return Parsed(delivery, incoming, conversation, service_url, tenant, continues_only)

    kind = body.get("type")
    if user in (policy.bot_id, policy.app_id) or _get(sender, "role") == "bot":
        return parsed(Ignored("the bot's own activity"))
    channel = _get(body, "channelData", "channel", "id") or base
    staff = policy.staff_channel is not None and is_channel(conversation) and channel == policy.staff_channel
    value = body.get("value")
    if kind == "message" and isinstance(value, Mapping) and ACTION_KEY in value:
        return parsed(_case_action(value, user, channel, tenant, _get(sender, "tenantId") or tenant))
    if kind == "invoke" and body.get("name") == SUBMIT_ACTION:
        return parsed(_feedback(body, base, user))
    if staff:
        return parsed(_staff(body, kind, channel, root, user, tenant, policy))
    if kind != "message":
        return parsed(Ignored(f"activity type {kind}"))
    text = _text_of(body, policy)
    conversation_type = _get(body, "conversation", "conversationType")
    ours = tenant == policy.tenant
    admin = ours and aad in policy.admins
    if conversation_type == "personal" and (command := _admin_command(text, admin=admin)) is not None:
        return parsed(AdminMessage(conversation, user, aad, _with_mentions(command, body, policy)))
    if not text:
        return parsed(Ignored("no text"))
    name = _get(sender, "name")
    own_tenant = str(_get(sender, "tenantId") or tenant or "")
    message_id = str(body.get("id") or "")
    locale = str(body["locale"]) if body.get("locale") else None  # the writer's Teams client's language
    if is_channel(conversation):
        # A channel post starts a conversation only when it mentions the bot; a reply continues one.
        chain = root or message_id
        mentioned = mentions_bot(body, policy)
        if not mentioned and not root:
            return parsed(Ignored("channel post that does not mention the bot"))
        message = CustomerMessage(
            str(tenant), channel, chain, message_id, user, text, False, own_tenant, Platform.TEAMS, name, locale=locale
        )
        return parsed(message, continues_only=not mentioned)
    # A personal chat is one conversation; so is a group chat, which a mention starts (with the permission to read
    # the chat, everything said there reaches the bot).
    personal = conversation_type == "personal"
    message = CustomerMessage(
        str(tenant), base, DM, message_id, user, text, personal, own_tenant, Platform.TEAMS, name, locale=locale
    )
    return parsed(message, continues_only=not personal and not mentions_bot(body, policy))


def _admin_command(text: str, *, admin: bool) -> str | None:
    """The /support command a personal-chat message is, if it is one: written with `/support` (anyone: refused and
    recorded unless an admin), or, from an admin, as a bare subcommand (`status`), as the app's command menu sends
    it. A customer's "help" stays a customer's message."""
    words = text.split(maxsplit=1)
    first = words[0].lower() if words else ""
    if first in ADMIN_PREFIXES:
        return words[1] if len(words) > 1 else ""
    if admin and first in USAGE:
        return text
    return None


def _with_mentions(command: str, body: Mapping[str, Any], policy: TeamsPolicy) -> str:
    """An admin's command with each person it mentions as the commands' mention, `<@id>` (`bot.admin.parse`): Teams
    writes a mention as `<at>Name</at>` in the text (read as `@Name`), and the person's id only in its `mention`
    entity. Without the name, which the recorded command would keep after a forget (the sweep replaces ids). Longer
    names first, so that `@Casey` does not take `@Casey Customer`'s place."""
    mentions = []
    for entity in body.get("entities") or []:
        person = _get(entity, "mentioned", "id")
        if _get(entity, "type") == "mention" and person and person not in (policy.bot_id, policy.app_id):
            shown = incoming_text(str(_get(entity, "text") or ""), bot_names=())
            if shown.startswith("@"):
                mentions.append((shown, str(person)))
    for shown, person in sorted(mentions, key=lambda m: -len(m[0])):
        command = command.replace(shown, f"<@{person}>", 1)
    return command


def _feedback(body: Mapping[str, Any], conversation: str, user: str) -> FeedbackClick | Ignored:
    """A 👍/👎 on a message of the bot's: `replyToId` names the message (the outbox's post of the answer)."""
    value = body.get("value")
    reaction = _get(value, "actionValue", "reaction")
    message = body.get("replyToId") or _get(body, "channelData", "legacy", "replyToId")
    if _get(value, "actionName") != "feedback" or reaction not in REACTIONS or not message:
        return Ignored("a submit action that is no feedback")
    rated = str(body.get("timestamp") or "")
    return FeedbackClick(conversation, str(message), user, REACTIONS[reaction], rated)


def _case_action(
    value: Mapping[str, Any], user: str, channel: str, tenant: str | None, own: str | None
) -> Incoming | CaseAction:
    try:
        escalation_id = int(str(value.get("value") or ""))
    except ValueError:
        return Ignored("a card action without a case")
    return CaseAction(str(value[ACTION_KEY]), escalation_id, user, channel, tenant, own)


def _staff(
    body: Mapping[str, Any], kind: Any, channel: str, root: str, user: str, tenant: str | None, policy: TeamsPolicy
) -> Incoming:
    """Staff channel traffic: colleagues' messages in a case's reply chain, and their edits and deletions."""
    message_id = str(body.get("id") or "")
    if not root or root == message_id:
        return Ignored("staff channel, not in a case's reply chain")
    match kind, _get(body, "channelData", "eventType"):
        case "messageUpdate", _:
            return StaffEdit(channel, root, message_id, _text_of(body, policy))
        case "messageDelete", _:
            return StaffDelete(channel, root, message_id)
        case "message", _:
            text = _text_of(body, policy)
            if not text:
                return Ignored("no text")
            own = _get(body, "from", "tenantId") or tenant
            return StaffReply(
                channel, root, message_id, user, text, str(tenant), Platform.TEAMS, own, _get(body, "from", "name")
            )
    return Ignored(f"staff channel activity {kind}")
