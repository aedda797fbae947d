"""Tests for the Slack emulator, driven through the real slack_sdk AsyncWebClient and a tiny recording "bot"."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest
from aiohttp import web
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from bot.playground.slack_emulator import BOT_ID, BOT_USER_ID, SLACK_RATE_LIMITS, Fault, SlackEmulator

pytestmark = pytest.mark.services  # every test serves the emulator

SECRET = "test-signing-secret"


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes
    valid: bool

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def form(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(self.body.decode()).items()}


class RecordingBot:
    """Stands in for the bot's /slack/events endpoint: records and verifies every request, answers 200."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.verifier = SignatureVerifier(SECRET)
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/slack/events", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/slack/events"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = dict(request.headers)
        self.received.append(Received(headers, body, self.verifier.is_valid_request(body, headers)))
        if request.content_type == "application/json" and json.loads(body).get("type") == "url_verification":
            return web.json_response({"challenge": json.loads(body)["challenge"]})
        return web.Response(text="")

    def events(self) -> list[dict[str, Any]]:
        return [r.json["event"] for r in self.received if r.headers.get("Content-Type") == "application/json"]


@pytest.fixture
async def emu() -> AsyncIterator[SlackEmulator]:
    async with SlackEmulator() as emulator:
        yield emulator


@pytest.fixture
async def bot() -> AsyncIterator[RecordingBot]:
    recorder = RecordingBot()
    await recorder.start()
    yield recorder
    assert recorder.runner is not None
    await recorder.runner.cleanup()


@pytest.fixture
async def live(bot: RecordingBot) -> AsyncIterator[SlackEmulator]:
    async with SlackEmulator(events_url=bot.url) as emulator:
        yield emulator


def client(emu: SlackEmulator, **kwargs: Any) -> AsyncWebClient:
    return AsyncWebClient(token="xoxb-test", base_url=emu.api_url, **kwargs)


# -- Web API ---------------------------------------------------------------------------------------------------


async def test_auth_test(emu: SlackEmulator) -> None:
    resp = await client(emu).auth_test()
    assert (resp["user_id"], resp["bot_id"], resp["team_id"]) == (BOT_USER_ID, BOT_ID, "T0001")
    assert resp["url"] == "https://driftwing.slack.com/"
    assert emu.calls_to("auth.test")[0].error is None


async def test_thread_post_and_replies_with_metadata(emu: SlackEmulator) -> None:
    web_client = client(emu)
    root = await web_client.chat_postMessage(channel="C_SUPPORT", text="Ticket opened")
    metadata = {"event_type": "helpdesk_turn", "event_payload": {"conversation_id": 7}}
    reply = await web_client.chat_postMessage(
        channel="C_SUPPORT", text="On it", thread_ts=root["ts"], metadata=metadata, blocks=[{"type": "divider"}]
    )
    assert reply["channel"] == "C_SUPPORT"
    assert reply["ts"] > root["ts"]
    assert reply["message"]["bot_id"] == BOT_ID

    with_meta = await web_client.conversations_replies(channel="C_SUPPORT", ts=root["ts"], include_all_metadata=True)
    messages = with_meta["messages"]
    assert [m["ts"] for m in messages] == [root["ts"], reply["ts"]]
    assert messages[0]["reply_count"] == 1
    assert messages[1]["thread_ts"] == root["ts"]
    assert messages[1]["metadata"] == metadata
    assert messages[1]["blocks"] == [{"type": "divider"}]
    plain = await web_client.conversations_replies(channel="C_SUPPORT", ts=reply["ts"])
    assert [m["ts"] for m in plain["messages"]] == [root["ts"], reply["ts"]]
    assert "metadata" not in plain["messages"][1]

    assert [m.text for m in emu.posts("C_SUPPORT", root["ts"])] == ["Ticket opened", "On it"]
    assert [m.ts for m in emu.thread("C_SUPPORT", root["ts"])] == [root["ts"], reply["ts"]]
    history = await web_client.conversations_history(channel="C_SUPPORT")
    assert [m["ts"] for m in history["messages"]] == [root["ts"]]


async def test_form_encoded_json_fields_are_parsed(emu: SlackEmulator) -> None:
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "hi"}}]
    resp = await client(emu).api_call("chat.postMessage", data={"channel": "C_STAFF", "blocks": json.dumps(blocks)})
    assert resp["message"]["blocks"] == blocks
    assert emu.posts("C_STAFF")[0].blocks == blocks


async def test_errors(emu: SlackEmulator) -> None:
    web_client = client(emu)
    with pytest.raises(SlackApiError) as excinfo:
        await web_client.chat_postMessage(channel="C_NOPE", text="hello")
    assert excinfo.value.response["error"] == "channel_not_found"
    with pytest.raises(SlackApiError) as excinfo:
        await web_client.api_call("bogus.method")
    assert excinfo.value.response["error"] == "unknown_method"
    assert [(c.method, c.error) for c in emu.calls] == [
        ("chat.postMessage", "channel_not_found"),
        ("bogus.method", "unknown_method"),
    ]
    async with aiohttp.ClientSession() as session, session.post(emu.api_url + "auth.test") as raw:
        assert (raw.status, await raw.json()) == (200, {"ok": False, "error": "not_authed"})


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def button(text: str) -> dict[str, Any]:
    return {"type": "button", "action_id": "a", "value": "1", "text": {"type": "plain_text", "text": text}}


@pytest.mark.parametrize(
    ("blocks", "problem"),
    [
        ([section("x")] * 51, "more than 50 blocks"),
        ([{"type": "header", "text": {"type": "plain_text", "text": "h" * 151}}], "header: text of 151 characters"),
        ([{"type": "header", "text": {"type": "mrkdwn", "text": "h"}}], "header: text that is not a plain_text"),
        ([section("s" * 3001)], "section: text of 3001 characters"),
        ([section("")], "section: text of 0 characters"),
        ([{"type": "section", "fields": [{"type": "mrkdwn", "text": "f"}] * 11}], "section: more than 10 fields"),
        ([{"type": "section", "fields": [{"type": "mrkdwn", "text": "f" * 2001}]}], "section: field text of 2001"),
        ([{"type": "context", "elements": [{"type": "mrkdwn", "text": "c" * 3001}]}], "context: text of 3001"),
        ([{"type": "context", "elements": [{"type": "mrkdwn", "text": "c"}] * 11}], "context: not 1 to 10 elements"),
        ([{"type": "actions", "elements": [button("b" * 76)]}], "actions: button text of 76 characters"),
        ([{"type": "actions", "elements": [button("b") | {"value": "v" * 2001}]}], "actions: button value over"),
        ([{"type": "divider", "block_id": "i" * 256}], "divider: block_id over 255"),
        ([{"type": "video"}], "video: a block type the emulator does not know"),
    ],
)
async def test_messages_over_block_kit_limits_are_refused_like_slack(
    emu: SlackEmulator, blocks: list[dict[str, Any]], problem: str
) -> None:
    """Posting, updating and posting ephemerally all answer `invalid_blocks`, and nothing is stored."""
    web_client = client(emu)
    posted = await web_client.chat_postMessage(channel="C_STAFF", text="ok", blocks=[section("ok")])
    calls = (
        web_client.chat_postMessage(channel="C_STAFF", text="fallback", blocks=blocks),
        web_client.chat_update(channel="C_STAFF", ts=posted["ts"], text="fallback", blocks=blocks),
        web_client.chat_postEphemeral(channel="C_STAFF", user="U_STAFF", text="fallback", blocks=blocks),
    )
    for call in calls:
        with pytest.raises(SlackApiError) as refused:
            await call
        assert refused.value.response["error"] == "invalid_blocks"
    assert [why.startswith(problem) for _, why in emu.rejected] == [True] * 3
    assert [m.text for m in emu.posts("C_STAFF")] == ["ok"] and emu.ephemerals == []


async def test_text_over_40000_characters_is_refused(emu: SlackEmulator) -> None:
    with pytest.raises(SlackApiError) as refused:
        await client(emu).chat_postMessage(channel="C_STAFF", text="x" * 40_001)
    assert refused.value.response["error"] == "msg_too_long"
    await client(emu).chat_postMessage(channel="C_STAFF", text="x" * 40_000)


async def test_expected_token() -> None:
    async with SlackEmulator(bot_token="xoxb-right") as emu:
        with pytest.raises(SlackApiError) as excinfo:
            await client(emu).auth_test()
        assert excinfo.value.response["error"] == "invalid_auth"
        ok = await AsyncWebClient(token="xoxb-right", base_url=emu.api_url).auth_test()
        assert ok["ok"]


async def test_reactions(emu: SlackEmulator) -> None:
    web_client = client(emu)
    posted = await web_client.chat_postMessage(channel="C_SUPPORT", text="hi")
    await web_client.reactions_add(channel="C_SUPPORT", timestamp=posted["ts"], name="eyes")
    with pytest.raises(SlackApiError) as excinfo:
        await web_client.reactions_add(channel="C_SUPPORT", timestamp=posted["ts"], name="eyes")
    assert excinfo.value.response["error"] == "already_reacted"
    thread = await web_client.conversations_replies(channel="C_SUPPORT", ts=posted["ts"])
    assert thread["messages"][0]["reactions"] == [{"name": "eyes", "users": [BOT_USER_ID], "count": 1}]
    await web_client.reactions_remove(channel="C_SUPPORT", timestamp=posted["ts"], name="eyes")
    with pytest.raises(SlackApiError) as excinfo:
        await web_client.reactions_remove(channel="C_SUPPORT", timestamp=posted["ts"], name="eyes")
    assert excinfo.value.response["error"] == "no_reaction"
    assert emu.posts("C_SUPPORT")[0].reactions == {}


async def test_rate_limit_is_retried_after_retry_after(emu: SlackEmulator) -> None:
    emu.fail_next("chat.postMessage", status=429, retry_after=1)
    web_client = client(emu, retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=1)])
    resp = await web_client.chat_postMessage(channel="C_SUPPORT", text="eventually")
    assert resp["ok"]
    first, second = emu.calls_to("chat.postMessage")
    assert (first.injected, first.error, second.failed) == (True, "ratelimited", False)
    assert second.at - first.at >= 0.95
    assert [m.text for m in emu.posts("C_SUPPORT")] == ["eventually"]  # the failed call posted nothing


async def test_fail_next_without_retry_raises(emu: SlackEmulator) -> None:
    emu.fail_next("chat.update", status=500, error="fatal_error", times=2)
    web_client = client(emu, retry_handlers=[])
    posted = await web_client.chat_postMessage(channel="C_SUPPORT", text="v1")
    for _ in range(2):
        with pytest.raises(SlackApiError):
            await web_client.chat_update(channel="C_SUPPORT", ts=posted["ts"], text="v2")
    await web_client.chat_update(channel="C_SUPPORT", ts=posted["ts"], text="v2")
    post = emu.posts("C_SUPPORT")[0]
    assert (post.text, post.edited) == ("v2", True)


async def test_hold_answers_only_after_release(emu: SlackEmulator) -> None:
    emu.hold("chat.postMessage")
    pending = asyncio.create_task(client(emu).chat_postMessage(channel="C_SUPPORT", text="accepted"))
    await emu.wait_for(lambda: emu.posts("C_SUPPORT"))
    await asyncio.sleep(0.1)
    assert not pending.done()
    emu.release("chat.postMessage")
    resp = await asyncio.wait_for(pending, 5)
    assert resp["ts"] == emu.posts("C_SUPPORT")[0].ts


async def test_drop_next_performs_the_call_and_loses_its_answer(emu: SlackEmulator) -> None:
    emu.drop_next("chat.postMessage", channel="C_STAFF")
    web_client = client(emu, retry_handlers=[])
    await web_client.chat_postMessage(channel="C_SUPPORT", text="answered")  # another channel: not dropped
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await web_client.chat_postMessage(channel="C_STAFF", text="landed unanswered")
    await web_client.chat_postMessage(channel="C_STAFF", text="answered again")
    assert [m.text for m in emu.posts("C_STAFF")] == ["landed unanswered", "answered again"]
    assert [c.dropped for c in emu.calls_to("chat.postMessage")] == [False, True, False]


async def test_users_info_permalink_ephemeral_and_conversation_info(emu: SlackEmulator) -> None:
    web_client = client(emu)
    user = (await web_client.users_info(user="U_CUSTOMER"))["user"]
    assert (user["real_name"], user["is_bot"]) == ("Casey Customer", False)
    assert user["profile"]["image_72"].startswith("https://")
    with pytest.raises(SlackApiError) as excinfo:
        await web_client.users_info(user="U_GHOST")
    assert excinfo.value.response["error"] == "user_not_found"

    root = emu.add_message("C_SUPPORT", "help")
    reply = await web_client.chat_postMessage(channel="C_SUPPORT", text="sure", thread_ts=root.ts)
    link = (await web_client.chat_getPermalink(channel="C_SUPPORT", message_ts=root.ts))["permalink"]
    assert link == f"https://driftwing.slack.com/archives/C_SUPPORT/p{root.ts.replace('.', '')}"
    reply_link = (await web_client.chat_getPermalink(channel="C_SUPPORT", message_ts=reply["ts"]))["permalink"]
    assert reply_link.endswith(f"?thread_ts={root.ts}&cid=C_SUPPORT")

    eph = await web_client.chat_postEphemeral(channel="C_STAFF", user="U_STAFF", text="only you")
    assert emu.ephemerals[0].message_ts == eph["message_ts"]
    assert emu.posts("C_STAFF") == []
    channel = (await web_client.conversations_info(channel="C_STAFF"))["channel"]
    assert (channel["name"], channel["is_im"], channel["is_member"]) == ("staff", False, True)


async def test_ts_strictly_increasing_and_wait_for_timeout(emu: SlackEmulator) -> None:
    stamps = [emu.add_message("C_SUPPORT", str(i)).ts for i in range(200)]
    assert stamps == sorted(set(stamps)) and all(len(ts.split(".")[1]) == 6 for ts in stamps)
    with pytest.raises(TimeoutError, match=r"not met within 0\.05s"):
        await emu.wait_for(lambda: emu.posts("C_STAFF"), timeout=0.05)


# -- Event delivery ---------------------------------------------------------------------------------------------


async def test_user_says_with_mention_delivers_message_and_app_mention(live: SlackEmulator, bot: RecordingBot) -> None:
    said = await live.user_says("C_SUPPORT", "<@UBOT> where is my order?")
    assert said.result.status == 200 and said.mention_result is not None
    assert all(r.valid for r in bot.received)
    message, mention = bot.events()
    assert (message["type"], mention["type"]) == ("message", "app_mention")
    assert message["ts"] == mention["ts"] == said.ts
    assert message["channel_type"] == "channel" and message["user"] == "U_CUSTOMER"
    event_ids = [r.json["event_id"] for r in bot.received]
    assert event_ids == [said.event_id, said.mention_event_id] and event_ids[0] != event_ids[1]
    assert [m.text for m in live.messages("C_SUPPORT")] == ["<@UBOT> where is my order?"]

    plain = await live.user_says("C_SUPPORT", "thanks", thread_ts=said.ts, files=[{"id": "F1"}])
    assert plain.mention_result is None
    last = bot.events()[-1]
    assert (last["thread_ts"], last["subtype"], last["files"]) == (said.ts, "file_share", [{"id": "F1"}])


async def test_bot_posts_are_echoed(live: SlackEmulator, bot: RecordingBot) -> None:
    web_client = client(live)
    posted = await web_client.chat_postMessage(channel="C_SUPPORT", text="Hello!")
    echo = await live.wait_for(lambda: next((e for e in bot.events() if e.get("ts") == posted["ts"]), None))
    assert (echo["bot_id"], echo["user"], echo["text"]) == (BOT_ID, BOT_USER_ID, "Hello!")
    assert "subtype" not in echo
    await web_client.chat_update(channel="C_SUPPORT", ts=posted["ts"], text="Hello again")
    await web_client.chat_delete(channel="C_SUPPORT", ts=posted["ts"])
    await live.wait_for(lambda: len(bot.events()) == 3)
    changed, deleted = bot.events()[1:]
    assert (changed["subtype"], changed["message"]["text"]) == ("message_changed", "Hello again")
    assert (deleted["subtype"], deleted["deleted_ts"]) == ("message_deleted", posted["ts"])
    assert live.posts("C_SUPPORT") == []


async def test_forged_and_stale_signatures_and_retry_headers(live: SlackEmulator, bot: RecordingBot) -> None:
    event = {"type": "message", "channel": "C_SUPPORT", "user": "U_CUSTOMER", "text": "x", "ts": "1.000001"}
    await live.deliver_event(event, signature="v0=" + "0" * 64)
    await live.deliver_event(event, timestamp=1_000_000)
    await live.deliver_event(event, retry_num=1, retry_reason="http_timeout")
    forged, stale, retried = bot.received
    assert not forged.valid and not stale.valid and retried.valid
    assert (retried.headers["X-Slack-Retry-Num"], retried.headers["X-Slack-Retry-Reason"]) == ("1", "http_timeout")


async def test_slash_command_click_and_url_verification(live: SlackEmulator, bot: RecordingBot) -> None:
    result = await live.slash_command("/takeover", "C_SUPPORT 1700000000.000100")
    assert result.status == 200
    command = bot.received[-1]
    assert command.valid and command.headers["Content-Type"] == "application/x-www-form-urlencoded"
    form = command.form
    assert (form["command"], form["user_id"], form["channel_id"]) == ("/takeover", "U_STAFF", "C_STAFF")
    async with aiohttp.ClientSession() as session:
        await session.post(form["response_url"], json={"text": "Taken over", "response_type": "ephemeral"})
    assert live.responses == [{"text": "Taken over", "response_type": "ephemeral"}]
    assert [(r.user, r.channel, r.source) for r in live.response_log] == [("U_STAFF", "C_STAFF", "/takeover")]
    too_many = [{"type": "section", "text": {"type": "mrkdwn", "text": "x"}}] * 51
    long_field = [{"type": "section", "fields": [{"type": "mrkdwn", "text": "x" * 2001}]}]
    async with aiohttp.ClientSession() as session:
        for blocks in (too_many, long_field):
            async with session.post(form["response_url"], json={"blocks": blocks}) as refused:
                assert refused.status == 400 and await refused.text() == "invalid_blocks"
    assert [problem for _, problem in live.rejected] == [
        "more than 50 blocks",
        "section: field text of 2001 characters (1 to 2000)",
    ]
    assert len(live.responses) == 1

    posted = await client(live).chat_postMessage(channel="C_STAFF", text="Approve refund?")
    await live.click("approve_refund", "42", message_ts=posted["ts"])
    clicked = next(r for r in bot.received if "payload=" in r.body.decode())
    payload = json.loads(clicked.form["payload"])
    assert clicked.valid and payload["type"] == "block_actions"
    assert payload["actions"][0]["action_id"] == "approve_refund" and payload["actions"][0]["value"] == "42"
    assert payload["container"]["message_ts"] == posted["ts"] and payload["message"]["text"] == "Approve refund?"

    verification = await live.url_verification("abc123")
    assert verification.json() == {"challenge": "abc123"}


async def test_views_open_exchanges_a_trigger_once_within_3_seconds_and_submissions_are_signed(
    live: SlackEmulator, bot: RecordingBot
) -> None:
    posted = await client(live).chat_postMessage(channel="C_SUPPORT", text="Rate us")
    modal = {
        "type": "modal",
        "callback_id": "rate",
        "private_metadata": "7",
        "title": {"type": "plain_text", "text": "Thanks"},
        "submit": {"type": "plain_text", "text": "Send"},
        "blocks": [
            {
                "type": "input",
                "block_id": "b",
                "optional": True,
                "label": {"type": "plain_text", "text": "Anything else?"},
                "element": {"type": "plain_text_input", "action_id": "a", "multiline": True, "max_length": 2000},
            }
        ],
    }

    async def trigger() -> str:
        await live.click("rate_1", "7", message_ts=posted["ts"], channel="C_SUPPORT", user="U_CUSTOMER")
        return str(json.loads(bot.received[-1].form["payload"])["trigger_id"])

    async def refusal(trigger_id: str, view: dict[str, Any]) -> str:
        with pytest.raises(SlackApiError) as refused:
            await client(live).views_open(trigger_id=trigger_id, view=view)
        return str(refused.value.response["error"])

    fresh = await trigger()
    no_submit = {k: v for k, v in modal.items() if k != "submit"}
    long_title = modal | {"title": {"type": "plain_text", "text": "x" * 25}}
    assert [await refusal(fresh, view) for view in (no_submit, long_title)] == ["invalid_arguments"] * 2
    opened = (await client(live).views_open(trigger_id=fresh, view=modal))["view"]
    assert live.modals[opened["id"]].user == "U_CUSTOMER" and opened["private_metadata"] == "7"
    assert await refusal(fresh, modal) == "exchanged_trigger_id"
    assert await refusal("123.abc", modal) == "invalid_trigger_id"
    live.trigger_lifetime_s = 0
    assert await refusal(await trigger(), modal) == "expired_trigger_id"

    await live.submit_view(opened["id"], {"b": {"a": "more tea"}})
    submitted = bot.received[-1]
    payload = json.loads(submitted.form["payload"])
    assert submitted.valid and payload["type"] == "view_submission" and payload["user"]["id"] == "U_CUSTOMER"
    assert payload["view"]["callback_id"] == "rate" and payload["view"]["private_metadata"] == "7"
    assert payload["view"]["state"]["values"] == {"b": {"a": {"type": "plain_text_input", "value": "more tea"}}}
    await live.submit_view(opened["id"])
    assert json.loads(bot.received[-1].form["payload"])["view"]["state"]["values"]["b"]["a"]["value"] is None


async def test_a_performed_fault_does_the_call_and_answers_an_error(emu: SlackEmulator) -> None:
    emu.fail_next("chat.postMessage", status=500, error="internal_error", performed=True)
    emu.fail_next("chat.postMessage", status=502, page=True, performed=True)
    web_client = client(emu, retry_handlers=[])
    with pytest.raises(SlackApiError) as json_error:
        await web_client.chat_postMessage(channel="C_SUPPORT", text="landed, then a 500")
    with pytest.raises(SlackApiError) as page_error:
        await web_client.chat_postMessage(channel="C_SUPPORT", text="landed, then a gateway's page")
    assert json_error.value.response["error"] == "internal_error"
    assert page_error.value.response.status_code == 502 and not page_error.value.response.data
    assert [m.text for m in emu.posts("C_SUPPORT")] == ["landed, then a 500", "landed, then a gateway's page"]
    assert [c.injected for c in emu.calls_to("chat.postMessage")] == [False, False]


async def test_weather_fails_the_calls_its_rule_picks(emu: SlackEmulator) -> None:
    emu.weather = lambda method, params: Fault(503, error="service_unavailable") if method == "chat.update" else None
    web_client = client(emu, retry_handlers=[])
    posted = await web_client.chat_postMessage(channel="C_SUPPORT", text="v1")
    with pytest.raises(SlackApiError):
        await web_client.chat_update(channel="C_SUPPORT", ts=posted["ts"], text="v2")
    emu.weather = None
    await web_client.chat_update(channel="C_SUPPORT", ts=posted["ts"], text="v2")
    assert emu.posts("C_SUPPORT")[0].text == "v2"


async def test_slack_rate_limits_allow_a_burst_then_one_a_second_per_channel() -> None:
    async with SlackEmulator(rate_limits=SLACK_RATE_LIMITS) as emu:
        web_client = client(emu, retry_handlers=[])
        for i in range(3):  # the burst
            await web_client.chat_postMessage(channel="C_SUPPORT", text=f"burst {i}")
        with pytest.raises(SlackApiError) as limited:
            await web_client.chat_postMessage(channel="C_SUPPORT", text="one too many")
        await web_client.chat_postMessage(channel="C_STAFF", text="another channel has its own")
        assert limited.value.response.status_code == 429
        assert limited.value.response.headers["Retry-After"] == "1"
        await asyncio.sleep(1.05)
        await web_client.chat_postMessage(channel="C_SUPPORT", text="a second later")
    assert [m.text for m in emu.posts("C_SUPPORT")] == ["burst 0", "burst 1", "burst 2", "a second later"]
