"""The outbox's calls in Microsoft Teams (`bot.channels.messenger.Messenger`), through the Bot Connector API with the
Microsoft 365 Agents SDK's client (`ConnectorClient`) and its client credentials (`MsalAuth`).

What Teams allows, and so what this promises: a post is answered with its id, or refused (429, 4xx), or its
outcome is unknown (5xx other than 503, a lost answer). The Bot Connector API reads no messages back, so an unknown
outcome cannot be looked up (`finds_posts` is False in `bot.teams.channel`): the sender never posts it again (see
`bot.delivery.sender`).

In a personal chat an answer can be streamed (`stream`, driven by `bot.teams.streaming`): a preview whose final
message is the answer of record (`finish_preview`), or, when Teams no longer takes the stream, a post.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from aiohttp import ClientConnectorError, ClientResponseError, ClientSession, ClientTimeout, ConnectionTimeoutError
from microsoft_agents.activity import Activity, ChannelAccount, ConversationParameters, Entity
from microsoft_agents.hosting.core.authorization import AccessTokenProviderBase
from microsoft_agents.hosting.core.connector.client import ConnectorClient
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from agents.address import Platform
from agents.db import models as m
from bot.channels.messenger import PreviewRef, Refused, Where
from bot.teams.cards import adaptive_card
from bot.teams.citations import labelled
from bot.teams.text import from_mrkdwn
from escalation.views import Message

log = logging.getLogger(__name__)

BOT_FRAMEWORK = "https://api.botframework.com"
SCOPES = [f"{BOT_FRAMEWORK}/.default"]
CHAIN = ";messageid="
"""A channel's conversation id with this and a post's id addresses the post's reply chain."""


def is_channel(conversation: str) -> bool:
    """A team channel (posts with reply chains), not a personal or group chat."""
    base = conversation.split(CHAIN, 1)[0]
    return base.endswith("@thread.tacv2") or base.endswith("@thread.skype")


def is_personal(conversation: str) -> bool:
    """The bot's 1:1 chat with a person (`a:…`), the only place Teams streams; channels and group chats are `19:…`."""
    return not conversation.split(CHAIN, 1)[0].startswith("19:")


def in_chain(channel: str, root: str | None) -> str:
    return f"{channel}{CHAIN}{root}" if root else channel


def _around(where: Where, message_id: str) -> str:
    """The conversation a message is changed in: in a channel its reply chain (its own, for a chain's root)."""
    return in_chain(where.channel, where.thread or message_id) if is_channel(where.channel) else where.channel


class ServiceUrls:
    """Where each conversation's Bot Connector service is. Learned from authenticated activities (stored, so other
    processes and later restarts know it too); `default` for a tenant that has not written yet."""

    def __init__(self, engine: AsyncEngine, *, default: str) -> None:
        self.engine = engine
        self.default = default
        self._known: dict[str, str] = {}

    async def remember(self, conversation: str, tenant: str | None, service_url: str) -> None:
        keys = [conversation.split(CHAIN, 1)[0], *([f"tenant:{tenant}"] if tenant else [])]
        fresh = [key for key in keys if self._known.get(key) != service_url]
        if not fresh:
            return
        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO teams_service_urls (conversation, service_url) VALUES (:c, :u) "
                    "ON CONFLICT (conversation) DO UPDATE SET service_url = :u, updated_at = now() "
                    "WHERE teams_service_urls.service_url <> :u"
                ),
                [{"c": key, "u": service_url} for key in fresh],
            )
        self._known.update(dict.fromkeys(fresh, service_url))

    async def of(self, conversation: str, tenant: str | None) -> str:
        keys = [conversation.split(CHAIN, 1)[0], *([f"tenant:{tenant}"] if tenant else [])]
        for key in keys:
            if key in self._known:
                return self._known[key]
        async with self.engine.connect() as conn:
            rows = dict(
                (
                    await conn.execute(
                        select(m.TeamsServiceUrl.conversation, m.TeamsServiceUrl.service_url).where(
                            m.TeamsServiceUrl.conversation.in_(keys)
                        )
                    )
                ).all()
            )
        for key in keys:
            if key in rows:
                self._known[key] = rows[key]
                return rows[key]
        return self.default


class TeamsMessenger:
    platform = Platform.TEAMS

    def __init__(
        self,
        *,
        credentials: AccessTokenProviderBase,
        urls: ServiceUrls,
        tenant: str,
        bot_id: str,
        bot_name: str,
        feedback_loop: bool = True,
    ) -> None:
        self.credentials = credentials
        self.feedback_loop = feedback_loop
        """Teams' 👍/👎 under each agent's answer (recorded by `bot.feedback`, as Slack's buttons)."""
        self.urls = urls
        self.tenant = tenant
        self.bot = ChannelAccount(id=bot_id, name=bot_name)
        self._sessions: dict[str, ClientSession] = {}
        self._warm = asyncio.Lock()
        self._warmed = False

    async def close(self) -> None:
        await asyncio.gather(*(session.close() for session in self._sessions.values()))
        self._sessions.clear()

    async def client(self, conversation: str) -> ConnectorClient:
        """A client for the conversation's service with a fresh token. A failure here (Entra, the database) comes
        before any request, so it is a certain refusal: the post is not in doubt."""
        try:
            url = await self.urls.of(conversation, self.tenant)
            token = await self._token()
        except Exception as exc:
            raise Refused("service_unavailable", retry_after=None) from exc
        session = self._sessions.get(url)
        if session is None or session.closed:
            base = url if url.endswith("/") else url + "/"
            # A call that hangs must not outlive the send lease unseen: it ends as an unknown outcome instead.
            session = ClientSession(
                base_url=base,
                headers={"Accept": "application/json", "Content-Type": "application/json"},
                timeout=ClientTimeout(total=20),
            )
            self._sessions[url] = session
        return ConnectorClient(url, token, session=session)

    async def _token(self) -> str:
        """The SDK's client credentials (MSAL caches the token until it nears expiry). MSAL's client is built at
        the first call, and building it reads Entra's configuration synchronously: that first call runs on a
        thread of its own, so the event loop (and every acknowledgement) never waits for Entra."""
        if not self._warmed:
            async with self._warm:
                if not self._warmed:
                    await asyncio.to_thread(
                        lambda: asyncio.run(self.credentials.get_access_token(BOT_FRAMEWORK, SCOPES))
                    )
                    self._warmed = True
        return str(await self.credentials.get_access_token(BOT_FRAMEWORK, SCOPES))

    def activity(self, message: Message) -> Activity:
        """A message as Teams shows it: our views' Slack mrkdwn turned into Teams markdown, blocks into an Adaptive
        Card; a relay shows whose words they are in its text (a bot cannot post under another name in Teams). An
        agent's answer carries the AI label, its citations and Teams' feedback control (`bot.teams.citations`)."""
        words = message.text if message.native else from_mrkdwn(message.text)
        if message.shown_as is not None:
            words = f"**{from_mrkdwn(message.shown_as.name)}**: {words}"
        if message.blocks:
            card = adaptive_card(message.blocks, fallback=message.text)
            activity = Activity(type="message", summary=words[:200], attachments=[card])
        else:
            activity = Activity(type="message", text=words, text_format="markdown")
        if message.ai:
            marked, label = labelled(words, message.sources)
            activity.entities = [label]
            if not message.blocks:
                activity.text = marked
            if self.feedback_loop:
                activity.channel_data = {"feedbackLoopEnabled": True}
        return activity

    async def post(self, where: Where, message: Message, *, outbox_id: int) -> str:
        activity = self.activity(message)
        client = await self.client(where.channel)
        if where.thread is None and is_channel(where.channel):
            # A new post in a channel (a case): Teams makes it the root of a reply chain, which is the case's thread.
            created = await _refusing(
                client.conversations.create_conversation(
                    ConversationParameters(
                        is_group=True,
                        bot=self.bot,
                        tenant_id=self.tenant,
                        channel_data={"channel": {"id": where.channel}, "tenant": {"id": self.tenant}},
                        activity=activity,
                    )
                ),
                has_card=bool(message.blocks),
            )
            posted = created.activity_id or str(created.id).split(CHAIN, 1)[-1]
        else:
            sent = await _refusing(
                client.conversations.send_to_conversation(in_chain(where.channel, where.thread), activity),
                has_card=bool(message.blocks),
            )
            posted = sent.id
        if not posted:
            raise RuntimeError("Teams answered without the new message's id")
        return str(posted)

    async def stream(self, where: Where, text: str, *, kind: str, sequence: int, stream_id: str | None) -> str:
        """One `typing` activity of a stream in a personal chat: `informative` (a progress line) or `streaming` (the
        answer so far, which must contain what the stream showed before); without `stream_id` it starts a stream.
        Returns the stream's id (the first activity's). Raises `Refused` as a post does (403: the stream is over or
        not allowed; 429: faster than one a second)."""
        info: dict[str, object] = {"streamType": kind, "streamSequence": sequence}
        if stream_id is not None:
            info["streamId"] = stream_id
        activity = Activity(type="typing", text=text, entities=[_stream_info(info)], channel_data=info)
        client = await self.client(where.channel)
        sent = await _refusing(client.conversations.send_to_conversation(where.channel, activity))
        if not (sent.id or stream_id):
            raise RuntimeError("Teams answered a stream's start without its id")
        return str(sent.id or stream_id)

    async def finish_preview(self, preview: PreviewRef, where: Where, message: Message, *, outbox_id: int) -> str:
        """The stream's final message, `message` as it would be posted (an answer with its AI label, citations and
        Teams' feedback control; a notice without), in place of what the stream showed. A stream whose start went
        unanswered, or that Teams ended (its two minutes passed, the person stopped it), cannot be finished: the
        message is posted instead."""
        if preview.stream_id is None:
            return await self.post(where, message, outbox_id=outbox_id)
        activity = self.activity(message)
        info: dict[str, object] = {"streamId": preview.stream_id, "streamType": "final"} | (activity.channel_data or {})
        activity.entities = [_stream_info(info), *(activity.entities or [])]
        activity.channel_data = info
        client = await self.client(where.channel)
        if preview.shown_at is not None:
            # Teams takes one activity a second per stream: the final waits out the rest of the second since the
            # last update rather than being refused and waiting a whole one.
            since_s = (datetime.now(UTC) - preview.shown_at).total_seconds()
            await asyncio.sleep(max(0.0, STREAM_PACE_S - since_s))
        for attempt in range(2):
            final = client.conversations.send_to_conversation(where.channel, activity)
            try:
                sent = await _refusing(final, has_card=bool(message.blocks))
                return str(sent.id or preview.stream_id)
            except Refused as exc:
                if exc.error == _REFUSED[403]:
                    log.info("the stream in %s is over (%s): the answer is posted", where.channel, exc.__cause__)
                    return await self.post(where, message, outbox_id=outbox_id)
                # The last update went out less than a second ago: waiting it out here costs less than a retry.
                if exc.error != "ratelimited" or attempt or (exc.retry_after or 0) > _FINAL_WAIT_S:
                    raise
                await asyncio.sleep(exc.retry_after or 1.0)
        raise AssertionError("unreachable")

    async def find(self, where: Where, *, outbox_id: int, since: datetime) -> str | None:
        raise NotImplementedError("the Bot Connector API reads no messages back")

    async def update(self, where: Where, message_id: str, message: Message) -> None:
        activity = self.activity(message)
        activity.id = message_id
        client = await self.client(where.channel)
        conversation = _around(where, message_id)
        update = client.conversations.update_activity(conversation, message_id, activity)
        await _refusing(update, has_card=bool(message.blocks), missing="message_not_found")

    async def delete(self, where: Where, message_id: str) -> None:
        client = await self.client(where.channel)
        conversation = _around(where, message_id)
        await _refusing(client.conversations.delete_activity(conversation, message_id), missing="message_not_found")

    async def react(self, channel: str, message_id: str, name: str, *, add: bool) -> None:
        """A bot cannot react to a message in Teams: nothing to do (reactions are never queued for Teams
        customers; a colleague's note in a Teams staff channel simply gets none)."""

    async def typing(self, where: Where) -> None:
        client = await self.client(where.channel)
        await _refusing(
            client.conversations.send_to_conversation(in_chain(where.channel, where.thread), Activity(type="typing"))
        )

    async def notice(self, where: Where, user: str, text: str) -> None:
        """Teams has no message only one person sees in a channel: it goes to the person's chat with the bot."""
        await self.direct(user, text)

    async def direct(self, user: str, text: str) -> None:
        client = await self.client(f"tenant:{self.tenant}")  # a new chat: its tenant's service
        created = await _refusing(
            client.conversations.create_conversation(
                ConversationParameters(
                    is_group=False,
                    bot=self.bot,
                    members=[ChannelAccount(id=user)],
                    tenant_id=self.tenant,
                    channel_data={"tenant": {"id": self.tenant}},
                )
            )
        )
        message = Activity(type="message", text=from_mrkdwn(text), text_format="markdown")
        await _refusing(client.conversations.send_to_conversation(str(created.id), message))


STREAM_PACE_S = 1.05
"""Teams takes one activity a second per stream (a little more, for the clocks between us)."""
_FINAL_WAIT_S = 2.0
"""A stream's final message refused as too fast is sent again after Teams' Retry-After up to this long."""


def _stream_info(fields: dict[str, object]) -> Entity:
    return Entity.model_validate({"type": "streaminfo"} | fields)


_REFUSED = {
    400: "invalid_arguments",
    401: "not_authed",
    403: "not_in_channel",
    404: "channel_not_found",
    413: "msg_too_long",
}
"""Bot Connector answers that say the call was not done, in the sender's vocabulary
(`bot.channels.messenger.Refused`)."""


async def _refusing(call: Any, *, has_card: bool = False, missing: str = "channel_not_found") -> Any:
    try:
        return await call
    except (ClientConnectorError, ConnectionTimeoutError) as exc:  # no connection, so no request: nothing was done
        raise Refused("service_unavailable") from exc
    except ClientResponseError as exc:
        retry_after = _seconds(exc.headers.get("Retry-After") if exc.headers else None)
        if exc.status == 429:
            raise Refused("ratelimited", retry_after=retry_after or 1.0) from exc
        if exc.status == 503 and retry_after is not None:  # "not now": nothing was done
            raise Refused("service_unavailable", retry_after=retry_after) from exc
        if exc.status == 400 and has_card:
            raise Refused("invalid_blocks") from exc
        if exc.status == 404:
            raise Refused(missing) from exc
        if exc.status in _REFUSED:
            raise Refused(_REFUSED[exc.status]) from exc
        raise  # 5xx: Teams may have done it; the outcome is unknown


def _seconds(value: str | None) -> float | None:
    try:
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None
