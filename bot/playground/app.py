"""`python -m bot playground`: the whole bot on this machine, with a small Slack-like workspace in a browser.

Three local servers in one process: the Slack emulator (`slack_emulator.py`, the Web API the bot calls and
the Events API that calls the bot), the real bot behind its `/slack/events` endpoint, and the page. The page
never talks to the bot: what a person does on it becomes what Slack would send (a signed message event, a
signed button click, a signed slash command), delivered by the emulator, and what the page shows is the
emulator's workspace plus a read-only view of the audit trail (`bot/playground/state.py`).
"""

from __future__ import annotations

import logging
import secrets
import socket
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import BaseModel, Field, SecretStr, ValidationError

from bot.compose import Bot, running_bot
from bot.declaration.build import declared, test_customer
from bot.playground.slack_emulator import DeliveryResult, Msg, SlackEmulator
from bot.playground.state import recent_conversations
from bot.runtime import event_loop
from bot.server import until_signalled, web_app
from bot.settings import Settings

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
ADMIN_USER = "U_ADMIN"
ROLES = {"customer": "U_CUSTOMER", "staff": "U_STAFF", "admin": ADMIN_USER}
STAFF_CHANNEL = "C_STAFF"
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Ephemeral:
    """A message only one user sees: a slash command's answer, a response_url post, a chat.postEphemeral."""

    user: str
    channel: str
    ts: str
    text: str
    source: str
    thread_ts: str | None = None
    blocks: list[dict[str, Any]] | None = None
    in_channel: bool = False
    """response_type in_channel: Slack would show it to everyone; the playground marks it instead."""


@dataclass
class Playground:
    url: str
    slack: SlackEmulator
    bot: Bot
    settings: Settings
    brand: str = "Helpdesk"
    """The declaration's brand: the page's title."""
    acks: deque[Ephemeral] = field(default_factory=lambda: deque(maxlen=500))
    """Answers shown only to whoever acted: slash command acks, and what Slack reports when a request failed."""
    _response_stamps: list[str] = field(default_factory=list)

    @property
    def brain(self) -> str:
        if not self.settings.llm_configured:
            return "Offline mode: answers are help-article passages (OPENAI_API_KEY or OPENAI_BASE_URL: LLM agents)."
        where = self.settings.openai_base_url or "OpenAI"
        return f"LLM provider: {self.settings.openai_model} at {where}"

    def ephemerals(self, user: str) -> list[Ephemeral]:
        # response_url posts carry no timestamp: each is stamped when the page first sees it, which is within
        # a poll of when it arrived.
        log = self.slack.response_log
        self._response_stamps += [_stamp() for _ in range(len(log) - len(self._response_stamps))]
        out = [a for a in self.acks if a.user == user]
        for response, ts in zip(log, self._response_stamps, strict=True):
            if response.user == user:
                out.append(_ephemeral_of(response.body, user, response.channel, ts, response.source))
        out += [
            Ephemeral(e.user, e.channel, e.message_ts, e.text, "chat.postEphemeral", e.thread_ts, e.blocks)
            for e in self.slack.ephemerals
            if e.user == user
        ]
        return sorted(out, key=lambda e: e.ts)


def _stamp() -> str:
    return f"{time.time():.6f}"


def _ephemeral_of(body: Any, user: str, channel: str, ts: str, source: str) -> Ephemeral:
    if not isinstance(body, dict):
        return Ephemeral(user, channel, ts, str(body), source)
    blocks = body.get("blocks") if isinstance(body.get("blocks"), list) else None
    in_channel = body.get("response_type") == "in_channel"
    return Ephemeral(user, channel, ts, str(body.get("text") or ""), source, None, blocks, in_channel)


def _failure(what: str, result: DeliveryResult, user: str, channel: str, thread_ts: str | None = None) -> Ephemeral:
    """What Slack would show when the app refused a request: here, a note only the person who acted sees."""
    return Ephemeral(user, channel, _stamp(), f"{what} failed: the app answered HTTP {result.status}", what, thread_ts)


def _ack_answer(command: str, result: DeliveryResult, user: str, channel: str) -> Ephemeral | None:
    """What Slack shows the user for a slash command's HTTP answer: its body, or the failure."""
    if result.status != 200:
        return Ephemeral(user, channel, _stamp(), f"{command} failed: the app answered HTTP {result.status}", command)
    if not result.body.strip():
        return None
    try:
        body = result.json()
    except ValueError:
        return Ephemeral(user, channel, _stamp(), result.body, command)
    return _ephemeral_of(body, user, channel, _stamp(), command)


# --- what the page sends: untrusted JSON, checked here ------------------------------------------------------


class _Say(BaseModel):
    user: str
    channel: str
    text: str = Field(min_length=1, max_length=4000)
    thread_ts: str | None = None


class _Click(BaseModel):
    user: str
    channel: str
    message_ts: str
    action_id: str
    value: str
    block_id: str = "b"
    element: Literal["button", "feedback_buttons"] = "button"


class _Command(BaseModel):
    user: str
    channel: str
    command: str = Field(pattern=r"^/[a-z0-9_-]+$")
    text: str = Field(default="", max_length=4000)


def _msg_json(msg: Msg, slack: SlackEmulator) -> dict[str, Any]:
    return {
        "ts": msg.ts,
        "user": msg.user,
        "text": msg.text,
        "thread_ts": msg.thread_ts,
        "bot": msg.bot_id is not None,
        "username": msg.username,
        "icon_url": msg.icon_url,
        "icon_emoji": msg.icon_emoji,
        "blocks": msg.blocks,
        "reactions": {name: list(users) for name, users in msg.reactions.items()},
        "edited": msg.edited,
        # A streamed answer: "in_progress" while it grows (the page polls faster then), "expired" when Slack ended
        # it on its own and it was never finished.
        "streaming": slack.stream_state(msg.channel, msg.ts),
        "tasks": [{"title": t.title, "status": t.status} for t in msg.tasks],
    }


def page_app(pg: Playground) -> web.Application:
    slack = pg.slack

    def known(user: str, channel: str) -> None:
        if user not in slack.users or channel not in slack.channels:
            raise web.HTTPBadRequest(text="unknown user or channel")

    async def parsed(request: web.Request, model: type[M]) -> M:
        try:
            value = model.model_validate_json(await request.read())
        except ValidationError as exc:
            raise web.HTTPBadRequest(text=exc.json()) from exc
        return value

    async def index(_: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    async def workspace(request: web.Request) -> web.Response:
        user = request.query.get("user", ROLES["customer"])
        users = {
            u.id: {"name": u.name, "real_name": u.real_name, "is_bot": u.is_bot, "is_admin": u.is_admin}
            for u in slack.users.values()
        }
        return web.json_response(
            {
                "brain": pg.brain,
                "brand": pg.brand,
                "offline": not pg.settings.llm_configured,
                "roles": ROLES,
                "users": users,
                "channels": [{"id": c.id, "name": c.name} for c in slack.channels.values() if not c.is_im],
                "messages": {c: [_msg_json(m, slack) for m in slack.messages(c)] for c in slack.channels},
                "ephemerals": [e.__dict__ for e in pg.ephemerals(user)],
            }
        )

    async def conversations(_: web.Request) -> web.Response:
        views = await recent_conversations(pg.bot.db.sessions)
        # The database outlives the in-memory workspace: earlier runs' conversations have no thread to show.
        here = [v for v in views if v.channel and v.thread_ts and slack.message(v.channel, v.thread_ts)]
        return web.json_response([v.to_json() for v in here])

    async def say(request: web.Request) -> web.Response:
        body = await parsed(request, _Say)
        known(body.user, body.channel)
        said = await slack.user_says(body.channel, body.text, user=body.user, thread_ts=body.thread_ts)
        if said.result.status != 200:
            pg.acks.append(_failure("Your message", said.result, body.user, body.channel, body.thread_ts))
        return web.json_response({"ts": said.ts, "status": said.result.status})

    async def click(request: web.Request) -> web.Response:
        body = await parsed(request, _Click)
        known(body.user, body.channel)
        result = await slack.click(
            body.action_id,
            body.value,
            message_ts=body.message_ts,
            channel=body.channel,
            user=body.user,
            block_id=body.block_id,
            element=body.element,
        )
        if result.status != 200:
            pg.acks.append(_failure("The button", result, body.user, body.channel))
        return web.json_response({"status": result.status})

    async def command(request: web.Request) -> web.Response:
        body = await parsed(request, _Command)
        known(body.user, body.channel)
        result = await slack.slash_command(body.command, body.text, user=body.user, channel=body.channel)
        answer = _ack_answer(body.command, result, body.user, body.channel)
        if answer is not None:
            pg.acks.append(answer)
        return web.json_response({"status": result.status})

    @web.middleware
    async def same_origin(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Only this page may use the API. Another site open in the browser could otherwise POST to it (a form
        or fetch needs no CORS for that), and a DNS-rebound name could read it: check Host on every request,
        and Origin and the JSON content type on every POST."""
        port = pg.url.rsplit(":", 1)[-1]
        if request.host not in (f"127.0.0.1:{port}", f"localhost:{port}"):
            raise web.HTTPForbidden(text="unexpected Host")
        if request.method == "POST":
            origin = request.headers.get("Origin")
            if origin is not None and origin not in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
                raise web.HTTPForbidden(text="cross-origin request")
            if request.content_type != "application/json":
                raise web.HTTPUnsupportedMediaType(text="send JSON")
        return await handler(request)

    app = web.Application(middlewares=[same_origin])
    app.router.add_get("/", index)
    app.router.add_static("/static", STATIC)
    app.router.add_get("/api/workspace", workspace)
    app.router.add_get("/api/conversations", conversations)
    app.router.add_post("/api/say", say)
    app.router.add_post("/api/click", click)
    app.router.add_post("/api/command", command)
    return app


def playground_settings(settings: Settings, slack: SlackEmulator, *, token: str) -> Settings:
    """The user's settings (database, provider, texts) with Slack pointed at the emulator."""
    admins = ",".join(part for part in (settings.admin_user_ids, ADMIN_USER) if part)
    return settings.model_copy(
        update={
            "slack_bot_token": SecretStr(token),
            "slack_signing_secret": SecretStr(slack.signing_secret),
            "slack_app_token": None,
            "slack_api_url": slack.api_url,
            "staff_channel_id": STAFF_CHANNEL,
            "slack_channels": "",
            "admin_user_ids": admins,
        }
    )


async def _listen(app: web.Application, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner, int(runner.addresses[0][1])


@asynccontextmanager
async def running_playground(settings: Settings, *, port: int | None = None) -> AsyncIterator[Playground]:
    """Emulator, bot and page, all on 127.0.0.1; `port` 0 picks a free one for the page."""
    token = f"xoxb-playground-{secrets.token_hex(8)}"
    async with SlackEmulator(signing_secret=secrets.token_hex(16), bot_token=token) as slack:
        slack.add_user(ADMIN_USER, "alex", "Alex Admin", is_admin=True)
        # The customer is the declaration's test customer: the sample's has orders that can be looked up and refunded.
        declaration = declared(settings)[1]
        customer = test_customer(declaration)
        slack.add_user(ROLES["customer"], "casey", customer.name or "Casey Customer", email=customer.email)
        bot_settings = playground_settings(settings, slack, token=token)
        async with running_bot(bot_settings) as bot:
            bot_runner, bot_port = await _listen(web_app(bot), 0)
            bot.url = f"http://127.0.0.1:{bot_port}"
            slack.events_url = f"{bot.url}/slack/events"
            try:
                pg = Playground("", slack, bot, bot_settings, declaration.spec.brand.name)
                page_runner, page_port = await _listen(page_app(pg), settings.playground_port if port is None else port)
                pg.url = f"http://127.0.0.1:{page_port}"
                try:
                    yield pg
                finally:
                    await page_runner.cleanup()
            finally:
                await bot_runner.cleanup()


def _port_taken(port: int) -> str | None:
    """Why the page cannot listen on `port`, or None. Checked before Postgres starts and the sample is embedded
    (a minute on a first run), not after."""
    if port == 0:
        return None
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


async def playground(settings: Settings) -> int:
    if (taken := _port_taken(settings.playground_port)) is not None:
        print(f"Cannot listen on 127.0.0.1:{settings.playground_port} ({taken}); set PLAYGROUND_PORT.")
        return 2
    if settings.database_url:
        # The playground's outbox sender would send another bot's queued Slack calls to the emulator, and its
        # /support pause would pause that bot: it keeps to its own embedded database.
        log.warning("the playground ignores DATABASE_URL: it uses the embedded Postgres in DATA_DIR")
        settings = settings.model_copy(update={"database_url": None})
    async with running_playground(settings) as pg:
        print(f"Playground: open {pg.url} in a browser. No Slack workspace needed; Ctrl-C stops it.", flush=True)
        print(pg.brain, flush=True)
        log.info("on the %s event loop", event_loop.name())
        await until_signalled()
    return 0
