"""Tests for the Teams emulator, driven through the Agents SDK's own, unmodified code: its JWT validator (keys
fetched over HTTPS through the emulator's proxy), MsalAuth (MSAL's client credentials) and ConnectorClient; and
the harness's activities, delivered to a tiny bot that checks their tokens as the SDK does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import jwt
import pytest
import requests
from aiohttp import web
from microsoft_agents.activity import (
    Activity,
    Attachment,
    ChannelAccount,
    ConversationParameters,
)
from microsoft_agents.authentication.msal import MsalAuth
from microsoft_agents.hosting.core.authorization import AgentAuthConfiguration, JwtTokenValidator
from microsoft_agents.hosting.core.authorization.jwt_token_validator import _JwkClientManager
from microsoft_agents.hosting.core.connector.client import ConnectorClient

from fakes.teams_api import CARD_TYPE, Op, TeamsEmulator, UserRole
from fakes.teams_identity import CONNECTOR_SCOPE, TokenKind
from harness import teams as h

RESOURCE = "https://api.botframework.com"


def validator() -> JwtTokenValidator:
    return JwtTokenValidator(AgentAuthConfiguration(client_id=h.APP_ID, tenant_id=h.TENANT_ID))


def msal(secret: str = h.APP_PASSWORD) -> MsalAuth:
    return MsalAuth(AgentAuthConfiguration(client_id=h.APP_ID, tenant_id=h.TENANT_ID, client_secret=secret))


async def connector(teams: TeamsEmulator) -> ConnectorClient:
    token = await msal().get_access_token(RESOURCE, [CONNECTOR_SCOPE])
    return ConnectorClient(teams.service_url, token)


class RecordingBot:
    """Stands in for the bot's /api/messages: checks each request's token with the SDK's validator (401 when
    refused, as the bot must answer) and records what it accepted."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/api/messages", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/api/messages"

    async def _handle(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        try:
            claims = await validator().validate_token(auth.removeprefix("Bearer "))
        except (ValueError, jwt.PyJWTError) as exc:
            self.refused.append(type(exc).__name__)
            return web.json_response({"error": str(exc)}, status=401)
        activity = await request.json()
        assert claims.claims["serviceurl"] == activity["serviceUrl"]
        self.received.append(activity)
        return web.Response(status=200)


@pytest.fixture
async def bot(teams: TeamsEmulator) -> AsyncIterator[RecordingBot]:
    recorder = RecordingBot()
    await recorder.start()
    teams.messaging_url = recorder.url
    yield recorder
    assert recorder.runner is not None
    await recorder.runner.cleanup()


# -- the sign-in side, through the SDK -------------------------------------------------------------------------


async def test_the_sdk_validator_accepts_the_emulators_token_and_refuses_broken_ones(
    teams: TeamsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK keeps the key sets it fetched for the whole process (a class attribute): a test that ran a Teams bot
    # before this one would leave them cached, and the fetch through the proxy checked below would not happen.
    monkeypatch.setattr(JwtTokenValidator, "_jwk_client_manager", _JwkClientManager())
    claims = await validator().validate_token(teams.login.channel_token(TokenKind.VALID, service_url="http://x/"))
    assert (claims.claims["aud"], claims.claims["iss"], claims.claims["serviceurl"]) == (
        h.APP_ID,
        "https://api.botframework.com",
        "http://x/",
    )
    assert "login.botframework.com:443" in teams.proxy.tunnels
    for kind in (TokenKind.FORGED, TokenKind.EXPIRED, TokenKind.WRONG_AUDIENCE, TokenKind.UNKNOWN_KID):
        token = teams.login.channel_token(kind, service_url=teams.service_url)
        with pytest.raises((ValueError, jwt.PyJWTError)):
            await validator().validate_token(token or "")
    keys = [k for host, path in teams.login.fetches if path.endswith("/keys") for k in [host]]
    assert set(keys) == {"login.botframework.com"}


async def test_a_later_emulator_in_the_same_process_is_reached_too(teams: TeamsEmulator) -> None:
    """urllib keeps the proxy it saw first for the whole process, and the SDK caches key sets per URL (PyJWT
    refetches one for an unknown kid only 30 s after the last fetch): a second emulator, with a CA of its own,
    started at once, must still be reached, trusted and its tokens accepted."""
    first = teams.proxy.port
    await validator().validate_token(teams.login.channel_token(TokenKind.VALID, service_url=teams.service_url))
    await teams.stop()
    async with h.emulator() as second:
        with pytest.MonkeyPatch.context() as patch:
            for name, value in second.env().items():
                patch.setenv(name, value)
            token = second.login.channel_token(TokenKind.VALID, service_url=second.service_url)
            assert (await validator().validate_token(token)).claims["serviceurl"] == second.service_url
        assert second.proxy.port == first
    await teams.start()


async def test_msal_gets_a_connector_token_and_a_wrong_secret_is_refused(teams: TeamsEmulator) -> None:
    token = await msal().get_access_token(RESOURCE, [CONNECTOR_SCOPE])
    assert teams.login.bearer_problem(token) is None
    claims = jwt.decode(token, options={"verify_signature": False})
    assert (claims["aud"], claims["appid"], claims["tid"]) == (RESOURCE, h.APP_ID, h.TENANT_ID)
    assert [i.token for i in teams.login.issued] == [token]

    with pytest.raises(ValueError, match="invalid_client"):
        await msal("not-the-secret").get_access_token(RESOURCE, [CONNECTOR_SCOPE])
    assert [r.error for r in teams.login.token_requests] == [None, "invalid_client"]
    assert {t for t in teams.proxy.tunnels} == {"login.microsoftonline.com:443"}


async def test_the_proxy_refuses_any_other_host(teams: TeamsEmulator) -> None:
    with pytest.raises(requests.exceptions.ProxyError):
        await asyncio.to_thread(requests.get, "https://example.com/", timeout=5)
    assert teams.proxy.refused == ["example.com:443"]


# -- the Bot Connector, through ConnectorClient ----------------------------------------------------------------


async def test_send_reply_update_delete_in_a_channel_reply_chain(teams: TeamsEmulator) -> None:
    client = await connector(teams)
    support = teams.channel_id("support")
    created = await client.conversations.create_conversation(
        ConversationParameters(
            is_group=True,
            channel_data={"channel": {"id": support}},
            activity=Activity(type="message", text="A new case"),
            tenant_id=h.TENANT_ID,
        )
    )
    assert created.id == f"{support};messageid={created.activity_id}"
    chain = created.id  # contains ':', ';', '@' and '=': must arrive intact
    card = {"type": "AdaptiveCard", "version": "1.5", "body": [], "actions": [{"type": "Action.Submit", "title": "x"}]}
    sent = await client.conversations.send_to_conversation(
        chain,
        Activity(
            type="message",
            text="**hi**",
            text_format="markdown",
            attachments=[Attachment(content_type=CARD_TYPE, content=card)],
        ),
    )
    reply = await client.conversations.reply_to_activity(chain, sent.id, Activity(type="message", text="reply"))
    await client.conversations.send_to_conversation(chain, Activity(type="typing"))
    updated = await client.conversations.update_activity(chain, sent.id, Activity(type="message", text="edited"))
    await client.conversations.delete_activity(chain, reply.id)
    await client.close()

    assert updated.id == sent.id
    posts = teams.posts(chain)
    assert [(p.id, p.root, p.text, p.deleted) for p in posts] == [
        (created.activity_id, created.activity_id, "A new case", False),
        (sent.id, created.activity_id, "edited", False),
        (reply.id, created.activity_id, "reply", True),
    ]
    assert posts[1].texts == ("**hi**", "edited") and posts[2].reply_to_id == sent.id
    assert teams.posts(support, root="another") == []
    assert [t.conversation_id for t in teams.typing_in(support)] == [chain]
    assert [c.op for c in teams.calls] == [Op.CREATE, Op.SEND, Op.REPLY, Op.SEND, Op.UPDATE, Op.DELETE]
    assert teams.calls[1].body["attachments"][0]["content"] == card


async def test_personal_chat_created_once_and_member_look_ups(teams: TeamsEmulator) -> None:
    teams.add_user("29:guest", "Gia Guest", email="gia@example.org", role=UserRole.GUEST)
    client = await connector(teams)
    parameters = ConversationParameters(
        members=[ChannelAccount(id="29:casey")], tenant_id=h.TENANT_ID, channel_data={"tenant": {"id": h.TENANT_ID}}
    )
    first = await client.conversations.create_conversation(parameters)
    again = await client.conversations.create_conversation(parameters)
    assert first.id == again.id == teams.personal_chat("29:casey").id and first.id.startswith("a:")

    guest = await client.conversations.get_conversation_member(first.id, "29:guest")
    extra = guest.model_extra or {}
    assert (guest.id, guest.name, guest.aad_object_id) == (
        "29:guest",
        "Gia Guest",
        teams.user("29:guest").aad_object_id,
    )
    assert (extra["email"], extra["userPrincipalName"], guest.tenant_id) == ("gia@example.org",) * 2 + (h.TENANT_ID,)
    assert extra["userRole"] == "guest"
    try:
        with pytest.raises(aiohttp.ClientResponseError) as missing:
            await client.conversations.get_conversation_member(first.id, "29:nobody")
        assert missing.value.status == 404
        assert teams.calls[-1].error == "MemberNotFoundInConversation"
        with pytest.raises(aiohttp.ClientResponseError) as unknown:
            await client.conversations.send_to_conversation("a:nope", Activity(type="message", text="x"))
        assert unknown.value.status == 404
    finally:
        await client.close()


async def raw(teams: TeamsEmulator, method: str, path: str, token: str | None, body: Any = None) -> Any:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, teams.service_url + path, json=body, headers=headers) as response,
    ):
        return response.status, dict(response.headers), await response.json()


async def test_the_connector_wants_the_bots_own_token(teams: TeamsEmulator) -> None:
    chat = teams.personal_chat("29:casey").id
    path, message = f"v3/conversations/{chat}/activities", {"type": "message", "text": "hi"}
    channel_token = teams.login.channel_token(TokenKind.VALID, service_url=teams.service_url)
    for token in (None, "garbage", channel_token, teams.login.access_token(lifetime_s=-600)):
        status, _, body = await raw(teams, "POST", path, token, message)
        assert (status, body["error"]["code"]) == (401, "Unauthorized")
    assert teams.posts(chat) == [] and [c.status for c in teams.calls] == [401] * 4
    status, _, body = await raw(teams, "POST", path, teams.login.access_token(), {"type": "message"})
    assert (status, body["error"]["code"]) == (400, "BadArgument")


async def test_faults_drops_and_holds(teams: TeamsEmulator) -> None:
    chat, token = teams.personal_chat("29:casey").id, teams.login.access_token()
    path = f"v3/conversations/{chat}/activities"
    teams.fail_next(Op.SEND, status=429, text="first")
    teams.fail_next(Op.SEND, status=503, retry_after=7)
    status, headers, body = await raw(teams, "POST", path, token, {"type": "message", "text": "other"})
    assert (status, headers.get("Retry-After")) == (503, "7")  # the 429 waits for its own text
    status, headers, body = await raw(teams, "POST", path, token, {"type": "message", "text": "first"})
    assert (status, headers["Retry-After"], body["error"]["code"]) == (429, "1", "Throttled")
    assert teams.posts(chat) == [] and all(c.injected for c in teams.calls)

    teams.drop_next(Op.SEND)
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await raw(teams, "POST", path, token, {"type": "message", "text": "lost answer"})
    assert [p.text for p in teams.posts(chat)] == ["lost answer"] and teams.calls[-1].dropped

    teams.hold(Op.SEND)
    held = asyncio.create_task(raw(teams, "POST", path, token, {"type": "message", "text": "held"}))
    await teams.wait_for(lambda: len(teams.posts(chat)) == 2)
    assert not held.done()
    teams.release(Op.SEND)
    assert (await held)[0] == 201


async def test_a_429_reaches_the_sdk_client_as_an_error(teams: TeamsEmulator) -> None:
    client = await connector(teams)
    teams.fail_next(Op.REPLY, status=429, retry_after=3)
    chat = teams.personal_chat("29:casey").id
    try:
        with pytest.raises(aiohttp.ClientResponseError) as throttled:
            await client.conversations.reply_to_activity(chat, "1", Activity(type="message", text="x"))
    finally:
        await client.close()
    assert throttled.value.status == 429 and throttled.value.headers is not None
    assert throttled.value.headers["Retry-After"] == "3"


# -- activities delivered to the bot (harness.teams) -----------------------------------------------------------


async def test_activities_arrive_signed_and_shaped_as_teams_sends_them(teams: TeamsEmulator, bot: RecordingBot) -> None:
    dm = await h.personal(teams, "where is my order?")
    post = await h.channel_post(teams, "support", "my drone will not start")
    reply = await h.channel_reply(teams, "support", post.id, "any news?")
    group = await h.group_chat(teams, "19:chat1@thread.v2", "hello all")
    assert [s.status for s in (dm, post, reply, group)] == [200] * 4 and all(s.ack_ms > 0 for s in (dm, post))

    personal, channel, in_chain, chat = bot.received
    assert personal["conversation"]["conversationType"] == "personal" and personal["conversation"]["id"].startswith(
        "a:"
    )
    assert personal["text"] == "where is my order?" and personal["recipient"]["id"] == h.BOT_ID
    assert personal["from"]["aadObjectId"] == teams.user(h.CUSTOMER).aad_object_id
    support = teams.channel_id("support")
    assert channel["conversation"]["id"] == f"{support};messageid={channel['id']}" == post.conversation_id
    assert channel["text"] == "<at>Helpdesk</at> my drone will not start"
    assert channel["entities"][0] == {
        "type": "mention",
        "text": "<at>Helpdesk</at>",
        "mentioned": {"id": h.BOT_ID, "name": "Helpdesk"},
    }
    data = channel["channelData"]
    assert (data["teamsChannelId"], data["channel"]["id"], data["tenant"]["id"]) == (support, support, h.TENANT_ID)
    assert data["team"]["id"] == data["teamsTeamId"] == teams.team_id
    assert in_chain["conversation"]["id"] == post.conversation_id and "replyToId" not in in_chain
    assert not any(e["type"] == "mention" for e in in_chain["entities"])
    assert chat["conversation"]["conversationType"] == "groupChat" and chat["conversation"]["isGroup"] is True
    assert [m.text for m in teams.messages(post.conversation_id)] == [channel["text"], "any news?"]

    edited = await h.edit(teams, reply, "any news at all?")
    deleted = await h.delete(teams, dm)
    assert (edited.status, deleted.status) == (200, 200)
    edit, gone = bot.received[-2:]
    assert (edit["type"], edit["id"], edit["channelData"]["eventType"]) == ("messageUpdate", reply.id, "editMessage")
    assert (gone["type"], gone["id"], gone["channelData"]["eventType"]) == ("messageDelete", dm.id, "softDeleteMessage")
    assert teams.message(reply.conversation_id, reply.id).texts == ("any news?", "any news at all?")  # type: ignore[union-attr]
    assert teams.message(dm.conversation_id, dm.id).deleted  # type: ignore[union-attr]

    again = await h.redeliver(teams, dm)
    assert (again.status, bot.received[-1]["id"]) == (200, dm.id)


async def test_card_action_and_broken_tokens(teams: TeamsEmulator, bot: RecordingBot) -> None:
    client = await connector(teams)
    staff = teams.channel_id("staff")
    created = await client.conversations.create_conversation(
        ConversationParameters(
            is_group=True,
            channel_data={"channel": {"id": staff}},
            tenant_id=h.TENANT_ID,
            activity=Activity(type="message", text="case 7"),
        )
    )
    await client.close()
    card = teams.posts(staff)[0]
    clicked = await h.card_action(teams, card, {"action": "claim", "case": 7})
    assert clicked.status == 200
    click = bot.received[-1]
    assert (click["value"], click["replyToId"], click.get("text")) == ({"action": "claim", "case": 7}, card.id, None)
    assert click["conversation"]["id"] == created.id and click["from"]["id"] == h.STAFF
    assert teams.messages(staff) == [card]  # a button press is not a message in the channel

    refused = [await h.personal(teams, "sneaky", token=kind) for kind in TokenKind if kind != TokenKind.VALID]
    assert [s.status for s in refused] == [401] * 5
    # none, forged, expired, wrong audience, unknown kid: what the SDK's validator raises for each
    assert bot.refused == [
        "DecodeError",
        "InvalidSignatureError",
        "ExpiredSignatureError",
        "ValueError",
        "PyJWKClientError",
    ]
    assert teams.messages(teams.personal_chat(h.CUSTOMER).id) == []  # Teams never had them


async def test_watcher_times_activity_to_reply(teams: TeamsEmulator, bot: RecordingBot) -> None:
    watcher = h.Watcher(teams)
    said = await h.personal(teams, "hello?")
    client = await connector(teams)
    await client.conversations.reply_to_activity(said.conversation_id, said.id, Activity(type="message", text="hi!"))
    await client.conversations.send_to_conversation(said.conversation_id, Activity(type="typing"))
    await client.close()
    assert await watcher.until(lambda: watcher.posted_at("hi!") is not None, 5, "the reply")
    answer = watcher.reply_to(said)
    assert answer is not None and answer.text == "hi!" and answer.at >= said.sent
    assert list(watcher.posts) == ["hi!"] and not watcher.failed
    assert json.loads(json.dumps(said.activity)) == said.activity
