"""Teams' side of a conversation with the bot: what people do in Teams, built as the activities Teams sends and
delivered through the emulator with a token it signed (timed, for the benchmarks), and what the bot did, read
from the emulator's record of its Bot Connector calls (followed incrementally by a `Watcher`).

Every helper returns a `Sent`; `send=False` builds it without delivering (`deliver` sends it later, for a
burst). The shapes follow activities Teams delivers (Microsoft's samples and recorded payloads): a channel
post's conversation id names its reply chain (`;messageid=`), and a reply in that chain carries no `replyToId`;
a person's message comes with its HTML rendering as a `text/html` attachment."""

from __future__ import annotations

import asyncio
import html
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fakes.teams_api import BOT_NAME, ConnectorCall, ConversationType, Message, Op, TeamsEmulator, TeamsUser
from fakes.teams_identity import TokenKind

APP_ID = "5f0c8c2e-7b1d-4c1e-9a57-3c2d1e0f4a6b"
"""The bot's Microsoft app id (its Entra app registration's client id)."""
APP_PASSWORD = "test-teams-client-secret"
TENANT_ID = "8e1f4c3a-2b6d-4e9f-8a7c-1d2e3f4a5b6c"
BOT_ID = f"28:{APP_ID}"
"""The bot as a member of conversations (`recipient.id`)."""
CUSTOMER = "29:casey"
STAFF = "29:sam"
_SDK_CONNECTION = "CONNECTIONS__SERVICE_CONNECTION__SETTINGS__"


def emulator(**options: Any) -> TeamsEmulator:
    """The Teams emulator for the bot's app registration (not started)."""
    return TeamsEmulator(app_id=APP_ID, app_password=APP_PASSWORD, tenant_id=TENANT_ID, **options)


def teams_config(teams: TeamsEmulator) -> dict[str, str]:
    """The bot's Teams credentials under the Agents SDK's own variable names. A bot process needs
    `teams.env()` as well (the proxy and CA through which it reaches the emulated sign-in hosts)."""
    return {
        f"{_SDK_CONNECTION}CLIENTID": teams.app_id,
        f"{_SDK_CONNECTION}CLIENTSECRET": teams.login.app_password,
        f"{_SDK_CONNECTION}TENANTID": teams.tenant_id,
    }


def user_aad(teams: TeamsEmulator, user: str) -> str:
    return teams.user(user).aad_object_id


def teams_settings(teams: TeamsEmulator) -> dict[str, str]:
    """The same, as the bot's settings by field name (for a bot in this process), with the emulator's Bot
    Connector as the service a tenant that has not written yet is reached at."""
    return {
        "teams_app_id": teams.app_id,
        "teams_app_password": teams.login.app_password,
        "teams_tenant_id": teams.tenant_id,
        "teams_service_url": teams.service_url,
    }


@dataclass
class Sent:
    """An activity delivered to the bot (or built, not yet delivered); times are time.monotonic()."""

    activity: dict[str, Any] = field(repr=False)
    token: TokenKind = TokenKind.VALID
    scheduled: float = 0.0
    sent: float = 0.0
    acked: float = 0.0
    status: int = 0
    """0 when not delivered yet or no HTTP answer came (see error)."""
    error: str | None = None

    @property
    def id(self) -> str:
        return str(self.activity["id"])

    @property
    def conversation_id(self) -> str:
        """As the activity carries it (a channel's with `;messageid=` of the reply chain)."""
        return str(self.activity["conversation"]["id"])

    @property
    def root(self) -> str | None:
        """The reply chain in a channel (the post's own id for a new post); None in chats."""
        _, _, root = self.conversation_id.partition(";messageid=")
        return root or None

    @property
    def ack_ms(self) -> float:
        return (self.acked - self.sent) * 1000


async def deliver(teams: TeamsEmulator, sent: Sent) -> Sent:
    """Send the activity to the bot with `sent.token`; a failed request is recorded, not raised."""
    delivery = await teams.deliver(sent.activity, token=sent.token)
    sent.sent, sent.acked = delivery.sent, delivery.sent + delivery.elapsed_s
    sent.status, sent.error = delivery.status, delivery.error
    return sent


async def _send(teams: TeamsEmulator, activity: dict[str, Any], token: TokenKind | str, send: bool) -> Sent:
    sent = Sent(activity, TokenKind(token), scheduled=time.monotonic())
    return await deliver(teams, sent) if send else sent


async def redeliver(teams: TeamsEmulator, sent: Sent) -> Sent:
    """The same activity (same id) again, validly signed: what the channel does when it got no answer."""
    return await deliver(teams, Sent(sent.activity, scheduled=time.monotonic()))


# -- activities ------------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _mention(teams: TeamsEmulator) -> dict[str, Any]:
    return {"type": "mention", "text": f"<at>{BOT_NAME}</at>", "mentioned": {"id": teams.bot_id, "name": BOT_NAME}}


def _tenant(teams: TeamsEmulator) -> dict[str, Any]:
    return {"tenant": {"id": teams.tenant_id}}


def _channel_data(teams: TeamsEmulator, channel: str) -> dict[str, Any]:
    team = teams.conversations[channel].team_id
    ids = {"teamsChannelId": channel, "teamsTeamId": team, "channel": {"id": channel}, "team": {"id": team}}
    return ids | _tenant(teams)


def _message(
    teams: TeamsEmulator,
    user: TeamsUser,
    conversation: dict[str, Any],
    channel_data: dict[str, Any],
    text: str,
    *,
    mention_bot: bool,
    id: str | None = None,
) -> dict[str, Any]:
    """A message a person wrote, as Teams delivers it (a mention of the bot is `<at>` text plus an entity)."""
    client = {
        "type": "clientInfo",
        "locale": user.locale,
        "country": "US",
        "platform": "Web",
        "timezone": "Europe/Berlin",
    }
    entities = [_mention(teams), client] if mention_bot else [client]
    body = f"<at>{BOT_NAME}</at> {text}" if mention_bot else text
    return {
        "type": "message",
        "id": id or teams.new_activity_id(),
        "timestamp": _now(),
        "localTimestamp": _now(),
        "serviceUrl": teams.service_url,
        "channelId": "msteams",
        "from": user.account(),
        "conversation": conversation | {"tenantId": teams.tenant_id},
        "recipient": {"id": teams.bot_id, "name": BOT_NAME},
        "textFormat": "plain",
        "text": body,
        "attachments": [{"contentType": "text/html", "content": f"<p>{html.escape(body)}</p>"}],
        "entities": entities,
        "channelData": channel_data,
        "locale": user.locale,
    }


def channel(teams: TeamsEmulator, name_or_id: str) -> str:
    """A channel's id, from its id or its name (`"support"`, `"#staff"`); it must be known to the emulator."""
    channel_id = name_or_id if name_or_id.startswith("19:") else teams.channel_id(name_or_id.lstrip("#").lower())
    if channel_id not in teams.conversations:
        raise KeyError(f"the emulator has no channel {name_or_id!r}")
    return channel_id


async def personal(
    teams: TeamsEmulator,
    text: str,
    *,
    user: str = CUSTOMER,
    token: TokenKind | str = TokenKind.VALID,
    send: bool = True,
) -> Sent:
    """A message in the user's 1:1 chat with the bot (no mention needed there)."""
    chat = teams.personal_chat(user)
    conversation = {"conversationType": str(ConversationType.PERSONAL), "id": chat.id}
    activity = _message(teams, teams.user(user), conversation, _tenant(teams), text, mention_bot=False)
    return await _send(teams, activity, token, send)


async def channel_post(
    teams: TeamsEmulator,
    channel_name: str,
    text: str,
    *,
    user: str = CUSTOMER,
    mention_bot: bool = True,
    token: TokenKind | str = TokenKind.VALID,
    send: bool = True,
) -> Sent:
    """A new post in a team channel: it starts its own reply chain (the conversation id names the post)."""
    post_id = teams.new_activity_id()
    activity = _in_channel(teams, channel_name, post_id, post_id, text, user=user, mention_bot=mention_bot)
    return await _send(teams, activity, token, send)


async def channel_reply(
    teams: TeamsEmulator,
    channel_name: str,
    root: str,
    text: str,
    *,
    user: str = CUSTOMER,
    mention_bot: bool = False,
    token: TokenKind | str = TokenKind.VALID,
    send: bool = True,
) -> Sent:
    """A reply in the reply chain of post `root` (which the conversation id names; Teams sends no replyToId)."""
    activity = _in_channel(teams, channel_name, teams.new_activity_id(), root, text, user=user, mention_bot=mention_bot)
    return await _send(teams, activity, token, send)


def _in_channel(
    teams: TeamsEmulator, channel_name: str, id: str, root: str, text: str, *, user: str, mention_bot: bool
) -> dict[str, Any]:
    channel_id = channel(teams, channel_name)
    conversation = {"isGroup": True, "conversationType": "channel", "id": f"{channel_id};messageid={root}"}
    data = _channel_data(teams, channel_id)
    return _message(teams, teams.user(user), conversation, data, text, mention_bot=mention_bot, id=id)


async def group_chat(
    teams: TeamsEmulator,
    chat: str,
    text: str,
    *,
    user: str = CUSTOMER,
    mention_bot: bool = True,
    token: TokenKind | str = TokenKind.VALID,
    send: bool = True,
) -> Sent:
    """A message in a group chat (`19:...@thread.v2`, added to the emulator when new)."""
    if chat not in teams.conversations:
        teams.add_group_chat(chat)
    conversation = {"isGroup": True, "conversationType": str(ConversationType.GROUP_CHAT), "id": chat}
    activity = _message(teams, teams.user(user), conversation, _tenant(teams), text, mention_bot=mention_bot)
    return await _send(teams, activity, token, send)


def _change(original: Sent, kind: str, event: str) -> dict[str, Any]:
    """The activity Teams sends when a person changes their message: same id and conversation."""
    activity = original.activity
    kept = ("id", "serviceUrl", "channelId", "from", "conversation", "recipient", "locale")
    channel_data = dict(activity.get("channelData") or {}) | {"eventType": event}
    return {k: activity[k] for k in kept} | {"type": kind, "timestamp": _now(), "channelData": channel_data}


async def edit(teams: TeamsEmulator, original: Sent, text: str, *, send: bool = True) -> Sent:
    """The person edits their message (`messageUpdate`, eventType editMessage, the whole new text)."""
    mention_bot = any(e.get("type") == "mention" for e in original.activity.get("entities") or [])
    body = f"<at>{BOT_NAME}</at> {text}" if mention_bot else text
    rendering = [{"contentType": "text/html", "content": f"<p>{html.escape(body)}</p>"}]
    fields = {"textFormat": "plain", "text": body, "attachments": rendering, "entities": original.activity["entities"]}
    return await _send(teams, _change(original, "messageUpdate", "editMessage") | fields, TokenKind.VALID, send)


async def delete(teams: TeamsEmulator, original: Sent, *, send: bool = True) -> Sent:
    """The person deletes their message (`messageDelete`, eventType softDeleteMessage, no text)."""
    return await _send(teams, _change(original, "messageDelete", "softDeleteMessage"), TokenKind.VALID, send)


async def card_action(
    teams: TeamsEmulator, card: Message, data: dict[str, Any], *, user: str = STAFF, send: bool = True
) -> Sent:
    """A press of an Adaptive Card `Action.Submit` button on the bot's post `card`: a message with the button's
    data as `value`, no text, `replyToId` the card's id, in the card's conversation (and reply chain)."""
    conversation = teams.conversations[card.conversation_id]
    conversation_id = card.conversation_id if card.root is None else f"{card.conversation_id};messageid={card.root}"
    shape: dict[str, Any] = {"conversationType": str(conversation.type), "id": conversation_id}
    shape["tenantId"] = teams.tenant_id
    if conversation.type != ConversationType.PERSONAL:
        shape["isGroup"] = True
    channel_data = _channel_data(teams, conversation.id) if conversation.type == ConversationType.CHANNEL else {}
    channel_data = (channel_data or _tenant(teams)) | {"source": {"name": "message"}, "legacy": {"replyToId": card.id}}
    activity = {
        "type": "message",
        "id": teams.new_activity_id(),
        "timestamp": _now(),
        "localTimestamp": _now(),
        "serviceUrl": teams.service_url,
        "channelId": "msteams",
        "from": teams.user(user).account(),
        "conversation": shape,
        "recipient": {"id": teams.bot_id, "name": BOT_NAME},
        "replyToId": card.id,
        "value": data,
        "entities": [{"type": "clientInfo", "locale": "en-US", "country": "US", "platform": "Web"}],
        "channelData": channel_data,
        "locale": "en-US",
    }
    return await _send(teams, activity, TokenKind.VALID, send)


async def feedback(
    teams: TeamsEmulator, message: Message, reaction: str, *, user: str = CUSTOMER, send: bool = True
) -> Sent:
    """A 👍 (`like`) or 👎 (`dislike`) with Teams' feedback control under the bot's message: an `invoke` named
    `message/submitAction`, `replyToId` the message, the reaction and any words in `value.actionValue`."""
    conversation = teams.conversations[message.conversation_id]
    shape: dict[str, Any] = {"conversationType": str(conversation.type), "id": message.conversation_id}
    activity = {
        "type": "invoke",
        "name": "message/submitAction",
        "id": teams.new_activity_id(),
        "timestamp": _now(),
        "localTimestamp": _now(),
        "serviceUrl": teams.service_url,
        "channelId": "msteams",
        "from": teams.user(user).account(),
        "conversation": shape | {"tenantId": teams.tenant_id},
        "recipient": {"id": teams.bot_id, "name": BOT_NAME},
        "replyToId": message.id,
        "value": {"actionName": "feedback", "actionValue": {"reaction": reaction, "feedback": '{"feedbackText":""}'}},
        "channelData": _tenant(teams) | {"source": {"name": "message"}, "legacy": {"replyToId": message.id}},
        "locale": "en-US",
    }
    return await _send(teams, activity, TokenKind.VALID, send)


# -- what the bot did ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Post:
    """A message the bot posted (send, reply or a new channel post), the n-th call, at `at` (time.monotonic())."""

    n: int
    at: float
    op: Op
    conversation_id: str
    text: str


_POSTING = (Op.SEND, Op.REPLY, Op.CREATE)


def _posted_text(call: ConnectorCall) -> str | None:
    """The text of a message the call posted, or None (a typing indicator, a failure, anything else)."""
    if call.failed or call.op not in _POSTING:
        return None
    activity = call.body.get("activity") if call.op == Op.CREATE else call.body
    if not isinstance(activity, dict) or activity.get("type") != "message":
        return None
    return str(activity.get("text") or "")


@dataclass
class Watcher:
    """Follows the emulator's record of Bot Connector calls (a list that only grows) without reading it twice.
    Posts are kept by text: where every text sent is unique, a second post of one text is a duplicate."""

    teams: TeamsEmulator
    seen: int = 0
    posts: dict[str, list[Post]] = field(default_factory=dict)
    failed: Counter[str] = field(default_factory=Counter)
    """Failed calls by "op: status"."""

    def scan(self) -> None:
        calls = self.teams.calls
        for n in range(self.seen, len(calls)):
            call = calls[n]
            if call.failed:
                self.failed[f"{call.op}: {call.status}"] += 1
            elif call.op is not None and (text := _posted_text(call)) is not None:
                self.posts.setdefault(text, []).append(Post(n, call.at, call.op, call.conversation_id, text))
        self.seen = len(calls)

    def posted_at(self, text: str) -> float | None:
        posts = self.posts.get(text)
        return posts[0].at if posts else None

    def reply_to(self, sent: Sent) -> Message | None:
        """The bot's first message in `sent`'s chat (in its reply chain, in a channel) stored after `sent` was
        delivered: the end of an "activity sent -> reply recorded" latency."""
        after = [m for m in self.teams.posts(sent.conversation_id) if m.at >= sent.sent]
        return min(after, key=lambda m: m.at, default=None)

    async def until(self, done: Callable[[], bool], timeout_s: float, what: str, *, poll_s: float = 0.001) -> bool:
        """Scan until `done()`; False (with a warning) on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.scan()
            if done():
                return True
            if time.monotonic() >= deadline:
                print(f"WARNING: gave up waiting after {timeout_s:.0f} s for {what}", flush=True)
                return False
            await asyncio.sleep(poll_s)
