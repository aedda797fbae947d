"""A local Microsoft Teams for tests and benchmarks: the Bot Connector service, Microsoft's sign-in hosts, and
activities delivered to the bot as Teams sends them.

- The Bot Connector (Bot Framework REST v3, plain http on 127.0.0.1 at `service_url`) as the Agents SDK's
  `ConnectorClient` calls it: send, reply, update, delete, create conversation, member look-up. Every call needs
  a bearer token from the emulator's token endpoint for the bot's app id (401 otherwise) and is recorded; faults
  can be injected, answers dropped or held.
- The sign-in hosts (`fakes.teams_identity`), through an HTTPS proxy: a process with `env()` applied validates
  the emulator's activity tokens and gets its own token with the SDK's unmodified code.
- Streaming in personal chats (learn.microsoft.com, "Stream bot messages"; the Agents SDK's `StreamingResponse`):
  a `typing` activity with a `streaminfo` entity and no streamId starts a stream (its answer's id is the streamId),
  `typing` activities with the text so far (`streamType: streaming`, increasing `streamSequence`) continue it, a
  `message` with `streamType: final` ends it. Teams' limits hold: one activity a second per stream (429), each
  update containing the previous one (400), one open stream per chat, none in channels or group chats (403), and
  none after the stream's lifetime (`stream_lifetime_s`, 2 minutes) or its final message (403). `shown_in()` is
  what the user saw, over time.
- The AI label and citations on a message (one root `https://schema.org/Message` entity, at most 20 citations,
  each a `Claim` with a `DigitalDocument` appearance within Teams' documented lengths): anything else is 400.
- `deliver()` POSTs an activity to the bot's `messaging_url` with a token the emulator signed (or a broken one);
  `harness.teams` builds the activities.

Typical use::

    async with TeamsEmulator(app_id=APP_ID, app_password=APP_PASSWORD, tenant_id=TENANT_ID) as teams:
        monkeypatch.setenv(...)  # teams.env(), for a bot in this process
        delivery = await teams.deliver(activity)
        posts = await teams.wait_for(lambda: teams.posts(activity["conversation"]["id"]))
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from bot.playground.waiting import poll
from fakes.teams_identity import Certificates, LoginService, SignInHosts, TlsProxy, TokenKind

T = TypeVar("T")

TEAM_NAME = "Driftwing"
DOMAIN = "driftwing.test"
BOT_NAME = "Helpdesk"
CARD_TYPE = "application/vnd.microsoft.card.adaptive"
MESSAGE_SIZE_LIMIT = 28_000
"""Teams refuses a message larger than about 28 KB (413)."""
STREAM_INTERVAL_S = 1.0
"""Teams takes one activity a second per stream; a faster one is answered 429."""
STREAM_LIFETIME_S = 120.0
"""A stream not finished within two minutes is over: Teams answers 403 to its further activities."""
INFORMATIVE_LIMIT = 1000
"""An informative update's text is at most 1000 characters."""
STREAM_INFO = "streaminfo"
MESSAGE_ENTITY = "https://schema.org/Message"
"""The root message entity: the AI label and the citations (one per message)."""
MAX_CITATIONS = 20
CITATION_NAME = 80
CITATION_ABSTRACT = 160
_MESSAGE_ID = ";messageid="


class Op(StrEnum):
    """The Bot Connector operations the emulator serves (and faults can be injected into)."""

    SEND = "send"
    REPLY = "reply"
    UPDATE = "update"
    DELETE = "delete"
    CREATE = "create"
    MEMBER = "member"


class ConversationType(StrEnum):
    PERSONAL = "personal"
    CHANNEL = "channel"
    GROUP_CHAT = "groupChat"


class UserRole(StrEnum):
    USER = "user"
    GUEST = "guest"


class ErrorCode(StrEnum):
    """The error codes the Bot Connector answers with, in `{"error": {"code", "message"}}`."""

    BAD_ARGUMENT = "BadArgument"
    UNAUTHORIZED = "Unauthorized"
    FORBIDDEN = "Forbidden"
    CONVERSATION_NOT_FOUND = "ConversationNotFound"
    ACTIVITY_NOT_FOUND = "ActivityNotFoundInConversation"
    MEMBER_NOT_FOUND = "MemberNotFoundInConversation"
    TOO_BIG = "MessageSizeTooBig"
    THROTTLED = "Throttled"
    SERVICE_ERROR = "ServiceError"
    NOT_FOUND = "NotFound"
    STREAM_NOT_ALLOWED = "ContentStreamNotAllowed"


class StreamType(StrEnum):
    """A streaming activity's `streamType` (its `streaminfo` entity's, mirrored in `channelData`)."""

    INFORMATIVE = "informative"
    STREAMING = "streaming"
    FINAL = "final"


_FAULT_CODES = {429: ErrorCode.THROTTLED, 400: ErrorCode.BAD_ARGUMENT, 403: ErrorCode.FORBIDDEN}


class ConnectorError(Exception):
    def __init__(self, status: int, code: ErrorCode, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.retry_after = retry_after


def split_conversation_id(conversation_id: str) -> tuple[str, str | None]:
    """(the channel or chat, the reply chain's root or None): `19:x@thread.tacv2;messageid=1` -> (19:x..., "1")."""
    base, marker, root = conversation_id.partition(_MESSAGE_ID)
    return base, (root or None) if marker else None


@dataclass(frozen=True)
class TeamsUser:
    id: str
    """"29:..." as activities and the Bot Connector know them."""
    name: str
    aad_object_id: str
    email: str
    tenant_id: str
    role: UserRole = UserRole.USER
    locale: str = "en-US"
    """Their Teams client's language: each activity they send carries it."""

    def account(self) -> dict[str, Any]:
        """The sender (`from`) of an activity, as Teams writes it."""
        return {"id": self.id, "name": self.name, "aadObjectId": self.aad_object_id}

    def to_api(self) -> dict[str, Any]:
        """A TeamsChannelAccount, as the member look-up answers it."""
        given, _, surname = self.name.partition(" ")
        return self.account() | {
            "givenName": given,
            "surname": surname or None,
            "email": self.email,
            "userPrincipalName": self.email,
            "tenantId": self.tenant_id,
            "userRole": str(self.role),
        }


@dataclass(frozen=True)
class Conversation:
    id: str
    """The chat's or channel's id (no `;messageid=`)."""
    type: ConversationType
    name: str | None = None
    team_id: str | None = None
    """A channel's team (whose id is its General channel's)."""
    user: str | None = None
    """A personal chat's user."""


@dataclass(frozen=True)
class Message:
    """A message in Teams, the bot's or a person's; replaced (not mutated) on update or deletion."""

    id: str
    conversation_id: str
    root: str | None
    """A channel post's reply chain (its own id for the post that starts it); None in chats."""
    sender: str
    text: str
    activity: dict[str, Any] = field(repr=False)
    """The activity as last sent (by the bot) or delivered (to the bot)."""
    from_bot: bool = False
    reply_to_id: str | None = None
    history: tuple[str, ...] = ()
    """Earlier texts, oldest first (each update moves the current one here)."""
    deleted: bool = False
    at: float = field(default_factory=time.monotonic)

    @property
    def attachments(self) -> list[dict[str, Any]]:
        return list(self.activity.get("attachments") or [])

    @property
    def cards(self) -> list[dict[str, Any]]:
        """The Adaptive Cards attached (their `content`)."""
        return [a.get("content") or {} for a in self.attachments if a.get("contentType") == CARD_TYPE]

    @property
    def texts(self) -> tuple[str, ...]:
        return (*self.history, self.text)

    @property
    def updated(self) -> bool:
        return bool(self.history)


@dataclass(frozen=True)
class Typing:
    conversation_id: str
    at: float


@dataclass(frozen=True)
class Shown:
    """One accepted activity of a stream, as the user saw it: an informative line, the answer so far, or the final
    message (which stands as a message of the chat, with the streamId as its id)."""

    stream_id: str
    kind: StreamType
    sequence: int
    text: str
    at: float


@dataclass
class Stream:
    id: str
    conversation_id: str
    started: float
    last: float
    """When its last accepted activity arrived (the one-a-second limit counts from there)."""
    sequence: int
    text: str = ""
    """The answer streamed so far (informative lines aside)."""
    final: bool = False
    expired: bool = False
    """Not finished within `stream_lifetime_s`: Teams ended it, and answers 403 to it."""


@dataclass(frozen=True)
class ConnectorCall:
    op: Op | None
    """None for a request no operation matches."""
    conversation_id: str
    activity_id: str | None
    body: dict[str, Any]
    at: float
    status: int
    error: ErrorCode | None = None
    injected: bool = False
    """Answered by `fail_next()`, without performing the call."""
    dropped: bool = False
    """Performed, but the answer was lost (`drop_next()`)."""

    @property
    def failed(self) -> bool:
        return self.error is not None


@dataclass(frozen=True)
class Delivery:
    """An activity POSTed to the bot; `status` 0 when no HTTP answer came (see `error`)."""

    activity: dict[str, Any]
    token: TokenKind
    status: int
    body: str
    sent: float
    elapsed_s: float
    error: str | None = None


@dataclass(frozen=True)
class _Fault:
    status: int
    retry_after: int | None
    match: dict[str, str]


def _facts(conversation_id: str, activity_id: str | None, body: Mapping[str, Any]) -> dict[str, str]:
    """What `fail_next`/`drop_next` match on: the ids and the body's plain top-level fields."""
    plain = {k: str(v) for k, v in body.items() if isinstance(v, str | int | bool)}
    return plain | {"conversation_id": conversation_id, "activity_id": str(activity_id)}


def _error(status: int, code: ErrorCode, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"code": str(code), "message": message}}, status=status, headers=headers)


class TeamsEmulator:
    def __init__(
        self,
        *,
        app_id: str,
        app_password: str,
        tenant_id: str,
        messaging_url: str | None = None,
        port: int = 0,
        connection_limit: int = 100,
    ) -> None:
        self.app_id, self.tenant_id = app_id, tenant_id
        self.bot_id = f"28:{app_id}"
        self.messaging_url = messaging_url
        """The bot's `/api/messages`."""
        self.login = LoginService(app_id=app_id, app_password=app_password, tenant_id=tenant_id)
        self.calls: list[ConnectorCall] = []
        self.deliveries: list[Delivery] = []
        self.typing: list[Typing] = []
        """Plain typing indicators (a stream's `typing` activities are in `streams` and `shown`)."""
        self.streams: dict[str, Stream] = {}
        self.shown: list[Shown] = []
        self.stream_interval_s = STREAM_INTERVAL_S
        self.stream_lifetime_s = STREAM_LIFETIME_S
        """Shorten in a test to see what an expired stream does."""
        self.users: dict[str, TeamsUser] = {}
        self.conversations: dict[str, Conversation] = {}
        self._messages: dict[str, dict[str, Message]] = {}  # conversation -> id -> message, in id order
        self._faults: dict[Op, deque[_Fault]] = {}
        self._drops: list[tuple[Op, dict[str, str]]] = []
        self._holds: dict[Op, asyncio.Event] = {}
        self._last_id_ms = 0
        self._requested_port = port
        self._connection_limit = connection_limit
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        self._hosts: SignInHosts | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._port: int | None = None
        self.team_id = self.channel_id("general")
        self.add_channel(self.team_id, "General")
        self.add_channel(self.channel_id("support"), "Support")
        self.add_channel(self.channel_id("staff"), "Staff")
        self.add_user("29:casey", "Casey Customer")
        self.add_user("29:sam", "Sam Staff")

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="teams-emulator-")
        certificates = Certificates(Path(self._folder.name))
        certificates.write()
        self._hosts = SignInHosts(self.login, certificates)
        await asyncio.to_thread(self._hosts.start)
        connector = web.Application()
        connector.router.add_route("*", "/{prefix:.*}v3/{path:.*}", self._connector)
        runner = web.AppRunner(connector, handler_cancellation=True, shutdown_timeout=0.5, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self._requested_port).start()
        self._runner, self._port = runner, int(runner.addresses[0][1])
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._connection_limit), timeout=aiohttp.ClientTimeout(total=30)
        )

    async def stop(self) -> None:
        for event in self._holds.values():
            event.set()
        self._holds.clear()
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._hosts is not None:
            await asyncio.to_thread(self._hosts.stop)
        if self._folder is not None:
            self._folder.cleanup()
        self._runner, self._session, self._hosts, self._folder, self._port = None, None, None, None, None

    async def __aenter__(self) -> TeamsEmulator:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("TeamsEmulator is not started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def service_url(self) -> str:
        """The Bot Connector's base URL, as activities carry it (regional, with the tenant: like Teams')."""
        return f"{self.url}/amer/{self.tenant_id}/"

    @property
    def proxy(self) -> TlsProxy:
        """The HTTPS proxy to the sign-in hosts (its `tunnels` and `refused` record what it was asked)."""
        if self._hosts is None or self._hosts.proxy is None:
            raise RuntimeError("TeamsEmulator is not started")
        return self._hosts.proxy

    @property
    def ca_file(self) -> Path:
        if self._hosts is None:
            raise RuntimeError("TeamsEmulator is not started")
        return self._hosts.certificates.ca_file

    def env(self) -> dict[str, str]:
        """The environment a bot process needs to reach the sign-in hosts: through the proxy, trusting its CA.
        The Bot Connector (`service_url`) is plain http on 127.0.0.1, so it is reached directly."""
        ca = str(self.ca_file)
        proxy, direct = self.proxy.url, "127.0.0.1,localhost"
        return {
            "HTTPS_PROXY": proxy,
            "https_proxy": proxy,
            "NO_PROXY": direct,
            "no_proxy": direct,
            "SSL_CERT_FILE": ca,
            "REQUESTS_CA_BUNDLE": ca,
        }

    def reset(self) -> None:
        """Forget messages, recordings, faults and holds; users and conversations stay."""
        for event in self._holds.values():
            event.set()
        for store in (self.calls, self.deliveries, self.typing, self._drops, self.shown):
            store.clear()
        self._messages.clear()
        self.streams.clear()
        self._faults.clear()
        self._holds.clear()

    # -- the tenant ------------------------------------------------------------------------------------------

    def channel_id(self, name: str) -> str:
        """A channel's id in Teams' shape, stable per name."""
        return f"19:{hashlib.sha256(f'{self.tenant_id}:{name}'.encode()).hexdigest()[:32]}@thread.tacv2"

    def add_channel(self, id: str, name: str) -> Conversation:
        return self._add(Conversation(id, ConversationType.CHANNEL, name, team_id=self.team_id))

    def add_group_chat(self, id: str, name: str | None = None) -> Conversation:
        """A group chat (`19:...@thread.v2`)."""
        return self._add(Conversation(id, ConversationType.GROUP_CHAT, name))

    def personal_chat(self, user: str) -> Conversation:
        """The bot's 1:1 chat with a user (the same id every time, as in Teams)."""
        digest = hashlib.sha256(f"{self.app_id}:{user}".encode()).hexdigest()
        known = self.conversations.get(chat_id := f"a:1{digest[:48]}")
        return known or self._add(Conversation(chat_id, ConversationType.PERSONAL, user=user))

    def _add(self, conversation: Conversation) -> Conversation:
        self.conversations[conversation.id] = conversation
        return conversation

    def add_user(
        self,
        id: str,
        name: str,
        *,
        aad_object_id: str | None = None,
        email: str | None = None,
        tenant: str | None = None,
        role: UserRole | str = UserRole.USER,
    ) -> TeamsUser:
        """A person the member look-ups know; an Entra object id and an email are made up unless given."""
        aad = aad_object_id or str(uuid.uuid5(uuid.NAMESPACE_URL, f"teams-user:{id}"))
        mail = email or f"{name.split()[0].lower()}@{DOMAIN}"
        user = TeamsUser(id, name, aad, mail, tenant or self.tenant_id, UserRole(role))
        self.users[id] = user
        return user

    def user(self, id: str) -> TeamsUser:
        return self.users[id]

    # -- what happened ---------------------------------------------------------------------------------------

    def message(self, conversation_id: str, id: str) -> Message | None:
        return self._messages.get(split_conversation_id(conversation_id)[0], {}).get(id)

    def messages(self, conversation_id: str, root: str | None = None) -> list[Message]:
        """Everyone's messages in a chat or channel, deleted ones included; only reply chain `root`'s when it
        is given or the conversation id names it (`;messageid=`)."""
        base, named_root = split_conversation_id(conversation_id)
        chain = root or named_root
        stored = list(self._messages.get(base, {}).values())
        return stored if chain is None else [m for m in stored if m.root == chain]

    def posts(self, conversation_id: str, root: str | None = None) -> list[Message]:
        """The bot's messages (as `messages`), deleted ones included (see `Message.deleted`)."""
        return [m for m in self.messages(conversation_id, root) if m.from_bot]

    def typing_in(self, conversation_id: str) -> list[Typing]:
        base = split_conversation_id(conversation_id)[0]
        return [t for t in self.typing if split_conversation_id(t.conversation_id)[0] == base]

    def shown_in(self, conversation_id: str) -> list[Shown]:
        """What streams showed the user in a chat, in order."""
        base = split_conversation_id(conversation_id)[0]
        return [s for s in self.shown if self.streams[s.stream_id].conversation_id == base]

    def calls_to(self, op: Op | str) -> list[ConnectorCall]:
        return [c for c in self.calls if c.op == op]

    # -- fault injection -------------------------------------------------------------------------------------

    def fail_next(
        self, op: Op | str, *, status: int = 429, retry_after: int | None = None, times: int = 1, **match: str
    ) -> None:
        """The next `times` calls of `op` matching `match` (`conversation_id=`, `activity_id=`, or a plain field
        of the activity such as `type="typing"`) are answered `status` without being performed; a 429 carries
        Retry-After (`retry_after`, else 1 s), another status only when `retry_after` is given."""
        self._faults.setdefault(Op(op), deque()).extend([_Fault(status, retry_after, dict(match))] * times)

    def drop_next(self, op: Op | str, *, times: int = 1, **match: str) -> None:
        """The next `times` calls of `op` matching `match` are performed and recorded, then the connection is
        closed without an answer: the bot cannot tell whether Teams has the message."""
        self._drops += [(Op(op), dict(match))] * times

    def hold(self, op: Op | str) -> None:
        """Calls of `op` are performed and recorded, but not answered until `release(op)`."""
        self._holds.setdefault(Op(op), asyncio.Event())

    def release(self, op: Op | str) -> None:
        event = self._holds.pop(Op(op), None)
        if event is not None:
            event.set()

    # A polling deadline, not a cancellation scope, hence a plain ``timeout`` parameter.
    async def wait_for(self, predicate: Callable[[], T | bool | None], timeout: float = 30.0) -> T:  # noqa: ASYNC109
        def story() -> str:
            recent = [f"{c.op}({c.error or c.status})" for c in self.calls[-8:]]
            calls, deliveries = len(self.calls), len(self.deliveries)
            return f"teams emulator: {calls} Bot Connector calls, recent: {recent}; {deliveries} deliveries"

        return await poll(predicate, timeout, story)

    # -- the Bot Connector -----------------------------------------------------------------------------------

    def _route(self, method: str, parts: list[str]) -> tuple[Op | None, str, str | None]:
        """(operation, conversation id, activity or member id) of `v3/...`; the ids arrive URL-decoded."""
        match method, parts:
            case "POST", ["conversations"]:
                return Op.CREATE, "", None
            case "POST", ["conversations", conversation, "activities"]:
                return Op.SEND, conversation, None
            case "POST", ["conversations", conversation, "activities", activity]:
                return Op.REPLY, conversation, activity
            case "PUT", ["conversations", conversation, "activities", activity]:
                return Op.UPDATE, conversation, activity
            case "DELETE", ["conversations", conversation, "activities", activity]:
                return Op.DELETE, conversation, activity
            case "GET", ["conversations", conversation, "members", member]:
                return Op.MEMBER, conversation, member
        return None, parts[1] if len(parts) > 1 else "", None

    async def _connector(self, request: web.Request) -> web.StreamResponse:
        if f"/{request.match_info['prefix']}" != f"/amer/{self.tenant_id}/":
            return _error(404, ErrorCode.NOT_FOUND, "No such service URL.")
        op, conversation_id, target = self._route(request.method, request.match_info["path"].split("/"))
        body = await self._body(request)
        at = time.monotonic()
        auth = request.headers.get("Authorization", "")
        problem = self.login.bearer_problem(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else "none"
        if problem is not None:
            self.calls.append(ConnectorCall(op, conversation_id, target, body, at, 401, ErrorCode.UNAUTHORIZED))
            return _error(401, ErrorCode.UNAUTHORIZED, f"Authorization has been denied for this request ({problem}).")
        if op is None:
            self.calls.append(ConnectorCall(op, conversation_id, target, body, at, 404, ErrorCode.NOT_FOUND))
            return _error(404, ErrorCode.NOT_FOUND, f"No such operation: {request.method} {request.path}")
        facts = _facts(conversation_id, target, body)
        if (fault := self._take_fault(op, facts)) is not None:
            code = _FAULT_CODES.get(fault.status, ErrorCode.SERVICE_ERROR)
            after = fault.retry_after if fault.retry_after is not None else (1 if fault.status == 429 else None)
            headers = {} if after is None else {"Retry-After": str(after)}
            self.calls.append(ConnectorCall(op, conversation_id, target, body, at, fault.status, code, injected=True))
            return _error(fault.status, code, "Injected by the emulator.", headers)
        headers = {}
        try:
            status, answer = 200, self._perform(op, conversation_id, target, body)
            if op in (Op.SEND, Op.REPLY, Op.CREATE):
                status = 201
            error = None
        except ConnectorError as exc:
            status, error = exc.status, exc.code
            answer = {"error": {"code": str(exc.code), "message": exc.message}}
            headers = {} if exc.retry_after is None else {"Retry-After": str(exc.retry_after)}
        drop = self._take_drop(op, facts)
        self.calls.append(ConnectorCall(op, conversation_id, target, body, at, status, error, dropped=drop))
        if drop and request.transport is not None:
            request.transport.close()  # the answer is lost on the way back
            return web.Response()
        hold = self._holds.get(op)
        if hold is not None:
            await hold.wait()
        return web.json_response(answer, status=status, headers=headers)

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            return {"_malformed": True}
        return body if isinstance(body, dict) else {"_malformed": True}

    def _take_fault(self, op: Op, facts: Mapping[str, str]) -> _Fault | None:
        queue = self._faults.get(op, deque())
        fault = next((f for f in queue if all(facts.get(k) == v for k, v in f.match.items())), None)
        if fault is not None:
            queue.remove(fault)
        return fault

    def _take_drop(self, op: Op, facts: Mapping[str, str]) -> bool:
        drop = next((d for d in self._drops if d[0] == op and all(facts.get(k) == v for k, v in d[1].items())), None)
        if drop is not None:
            self._drops.remove(drop)
        return drop is not None

    def _perform(self, op: Op, conversation_id: str, target: str | None, body: dict[str, Any]) -> dict[str, Any]:
        match op:
            case Op.CREATE:
                return self._create(body)
            case Op.SEND | Op.REPLY:
                return self._send(conversation_id, target, body)
            case Op.UPDATE:
                return self._update(conversation_id, target or "", body)
            case Op.DELETE:
                self._delete(conversation_id, target or "")
                return {}
            case Op.MEMBER:
                return self._member(conversation_id, target or "")

    def _conversation(self, conversation_id: str) -> Conversation:
        conversation = self.conversations.get(split_conversation_id(conversation_id)[0])
        if conversation is None:
            raise ConnectorError(404, ErrorCode.CONVERSATION_NOT_FOUND, "Conversation not found.")
        return conversation

    def _send(self, conversation_id: str, reply_to: str | None, body: dict[str, Any]) -> dict[str, Any]:
        conversation = self._conversation(conversation_id)
        kind = body.get("type")
        if (info := _stream_info(body)) is not None:
            return self._stream(conversation, conversation_id, reply_to, body, info)
        if kind == "typing":
            self.typing.append(Typing(conversation_id, time.monotonic()))
            return {"id": self._next_id()}
        self._check_message(body)
        return {"id": self._store_bot_post(conversation, conversation_id, reply_to, body).id}

    def _stream(
        self,
        conversation: Conversation,
        conversation_id: str,
        reply_to: str | None,
        body: dict[str, Any],
        info: Mapping[str, Any],
    ) -> dict[str, Any]:
        """A streaming activity: it starts, continues or ends the stream its streaminfo names (see the module)."""
        now = time.monotonic()
        kind, sequence = _stream_type(info.get("streamType")), info.get("streamSequence")
        text = _str(body.get("text")) or ""
        if conversation.type != ConversationType.PERSONAL:
            raise ConnectorError(403, ErrorCode.STREAM_NOT_ALLOWED, "Content stream is not allowed.")
        if kind is None or (body.get("type") == "message") != (kind == StreamType.FINAL):
            raise ConnectorError(400, ErrorCode.BAD_ARGUMENT, "A stream's typing or final activity is malformed.")
        if kind == StreamType.INFORMATIVE and len(text) > INFORMATIVE_LIMIT:
            raise ConnectorError(400, ErrorCode.BAD_ARGUMENT, "An informative update is at most 1000 characters.")
        stream_id = _str(info.get("streamId"))
        if stream_id is None:
            if kind == StreamType.FINAL:
                raise ConnectorError(400, ErrorCode.BAD_ARGUMENT, "A final stream message needs its streamId.")
            if any(s.conversation_id == conversation.id and self._open(s, now) for s in self.streams.values()):
                raise ConnectorError(403, ErrorCode.STREAM_NOT_ALLOWED, "Only one stream per chat at a time.")
            stream = Stream(self._next_id(), conversation.id, now, now, _int(sequence))
            self.streams[stream.id] = stream
        else:
            stream = self._continued(conversation, stream_id, kind, sequence, now)
        if kind == StreamType.STREAMING:
            if not text.startswith(stream.text):
                raise ConnectorError(
                    400,
                    ErrorCode.BAD_ARGUMENT,
                    "Request streamed content should contain the previously streamed content.",
                )
            stream.text = text
        if kind == StreamType.FINAL:
            self._check_message(body)
            message = self._store_bot_post(conversation, conversation_id, reply_to, body, id=stream.id)
            stream.final, text = True, message.text
        stream.last, stream.sequence = now, max(stream.sequence, _int(sequence))
        self.shown.append(Shown(stream.id, kind, stream.sequence, text, now))
        return {"id": stream.id}

    def _open(self, stream: Stream, now: float) -> bool:
        if not stream.final and not stream.expired and now - stream.started > self.stream_lifetime_s:
            stream.expired = True
        return not stream.final and not stream.expired

    def _continued(
        self, conversation: Conversation, stream_id: str, kind: StreamType, sequence: object, now: float
    ) -> Stream:
        stream = self.streams.get(stream_id)
        if stream is None or stream.conversation_id != conversation.id:
            raise ConnectorError(400, ErrorCode.BAD_ARGUMENT, "No such stream in this conversation.")
        if not self._open(stream, now):
            why = "finished due to exceeded streaming time" if stream.expired else "already completed"
            raise ConnectorError(403, ErrorCode.STREAM_NOT_ALLOWED, f"Content stream {why}.")
        if now - stream.last < self.stream_interval_s:
            raise ConnectorError(429, ErrorCode.THROTTLED, "One streaming activity a second.", retry_after=1)
        if kind != StreamType.FINAL and _int(sequence) <= stream.sequence:  # the final's sequence is optional
            raise ConnectorError(400, ErrorCode.BAD_ARGUMENT, "streamSequence must increase.")
        return stream

    def _store_bot_post(
        self,
        conversation: Conversation,
        conversation_id: str,
        reply_to: str | None,
        body: dict[str, Any],
        *,
        id: str | None = None,
    ) -> Message:
        """A new message from the bot. In a channel it goes to the chain the conversation id names; without one,
        to the replied-to message's chain, else it starts a new post. A stream's final message takes the stream's
        id (`id`)."""
        new_id = id or self._next_id()
        root: str | None = None
        if conversation.type == ConversationType.CHANNEL:
            named = split_conversation_id(conversation_id)[1]
            replied = self.message(conversation.id, reply_to) if reply_to else None
            root = named or (replied.root if replied is not None else None) or new_id
        reply_to_id = reply_to or _str(body.get("replyToId"))
        activity = body | {"id": new_id, "conversation": {"id": conversation_id}}
        message = Message(new_id, conversation.id, root, self.bot_id, _str(body.get("text")) or "", activity)
        return self._store(replace(message, from_bot=True, reply_to_id=reply_to_id))

    def _check_message(self, body: Mapping[str, Any]) -> None:
        if body.get("type") != "message":
            raise ConnectorError(400, ErrorCode.BAD_ARGUMENT, f"Unsupported activity type {body.get('type')!r}.")
        attachments = body.get("attachments") or []
        if not body.get("text") and not attachments:
            raise ConnectorError(400, ErrorCode.BAD_ARGUMENT, "A message needs text or attachments.")
        for attachment in attachments:
            if (problem := _attachment_problem(attachment)) is not None:
                raise ConnectorError(400, ErrorCode.BAD_ARGUMENT, problem)
        if (problem := message_entity_problem(body.get("entities"))) is not None:
            raise ConnectorError(400, ErrorCode.BAD_ARGUMENT, problem)
        if len(json.dumps(body).encode()) > MESSAGE_SIZE_LIMIT:
            raise ConnectorError(413, ErrorCode.TOO_BIG, "Message size exceeds the limit.")

    def _own_post(self, conversation_id: str, activity_id: str) -> Message:
        conversation = self._conversation(conversation_id)
        message = self.message(conversation.id, activity_id)
        if message is None or message.deleted:
            raise ConnectorError(404, ErrorCode.ACTIVITY_NOT_FOUND, "Activity not found in conversation.")
        if not message.from_bot:
            raise ConnectorError(403, ErrorCode.FORBIDDEN, "A bot can change only its own messages.")
        return message

    def _update(self, conversation_id: str, activity_id: str, body: dict[str, Any]) -> dict[str, Any]:
        old = self._own_post(conversation_id, activity_id)
        self._check_message(body)
        activity = body | {"id": old.id, "conversation": old.activity.get("conversation")}
        text = _str(body.get("text")) or ""
        self._store(replace(old, text=text, activity=activity, history=(*old.history, old.text)))
        return {"id": old.id}

    def _delete(self, conversation_id: str, activity_id: str) -> None:
        self._store(replace(self._own_post(conversation_id, activity_id), deleted=True))

    def _member(self, conversation_id: str, member_id: str) -> dict[str, Any]:
        self._conversation(conversation_id)
        user = self.users.get(member_id) or next((u for u in self.users.values() if u.aad_object_id == member_id), None)
        if user is None:
            raise ConnectorError(404, ErrorCode.MEMBER_NOT_FOUND, "The member was not found in the conversation.")
        return user.to_api()

    def _user_by_member_id(self, id: str) -> TeamsUser | None:
        """A user by Teams id, or by `8:orgid:<Entra object id>` (what a bot that knows only that id uses)."""
        if id.startswith("8:orgid:"):
            return next((u for u in self.users.values() if u.aad_object_id == id.removeprefix("8:orgid:")), None)
        return self.users.get(id)

    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        channel_data: dict[str, Any] = body["channelData"] if isinstance(body.get("channelData"), dict) else {}
        members = body.get("members") or []
        if body.get("isGroup") and isinstance(channel_data.get("channel"), dict):
            channel = self._conversation(str(channel_data["channel"].get("id")))
            activity = body.get("activity")
            if channel.type != ConversationType.CHANNEL or not isinstance(activity, dict):
                raise ConnectorError(400, ErrorCode.BAD_ARGUMENT, "A new post needs a channel and an activity.")
            self._check_message(activity)
            post = self._store_bot_post(channel, channel.id, None, activity)
            return {"id": f"{channel.id}{_MESSAGE_ID}{post.id}", "activityId": post.id}
        if len(members) == 1 and isinstance(members[0], dict) and not body.get("isGroup"):
            user = self._user_by_member_id(str(members[0].get("id")))
            tenant = body.get("tenantId") or (channel_data.get("tenant") or {}).get("id")
            if user is None or tenant != user.tenant_id:
                raise ConnectorError(400, ErrorCode.BAD_ARGUMENT, "Unknown user or tenant for a 1:1 chat.")
            chat = self.personal_chat(user.id)
            activity = body.get("activity")
            if isinstance(activity, dict):
                self._check_message(activity)
                post = self._store_bot_post(chat, chat.id, None, activity)
                return {"id": chat.id, "activityId": post.id}
            return {"id": chat.id}
        raise ConnectorError(400, ErrorCode.BAD_ARGUMENT, "Only channel posts and 1:1 chats can be created.")

    # -- storage ---------------------------------------------------------------------------------------------

    def _next_id(self) -> str:
        # Teams' message ids are epoch milliseconds; ours are strictly increasing across the emulator.
        self._last_id_ms = max(int(time.time() * 1000), self._last_id_ms + 1)
        return str(self._last_id_ms)

    def _store(self, message: Message) -> Message:
        self._messages.setdefault(message.conversation_id, {})[message.id] = message
        return message

    # -- delivering activities to the bot --------------------------------------------------------------------

    def new_activity_id(self) -> str:
        return self._next_id()

    def observe(self, activity: Mapping[str, Any]) -> None:
        """Keep what a person did, as Teams would before telling the bot: a message is stored (in its reply
        chain), an edit replaces its text, a deletion marks it. Card submissions change nothing."""
        conversation_id = str(activity["conversation"]["id"])
        base, root = split_conversation_id(conversation_id)
        kind, text = activity.get("type"), _str(activity.get("text")) or ""
        old = self.message(base, str(activity.get("id")))
        if kind == "message" and activity.get("value") is None and old is None:
            chain = (root or str(activity["id"])) if self.conversations[base].type == ConversationType.CHANNEL else None
            sender = str(activity["from"]["id"])
            self._store(Message(str(activity["id"]), base, chain, sender, text, dict(activity)))
        elif kind == "messageUpdate" and old is not None:
            self._store(replace(old, text=text, activity=dict(activity), history=(*old.history, old.text)))
        elif kind == "messageDelete" and old is not None:
            self._store(replace(old, deleted=True))

    async def deliver(self, activity: dict[str, Any], *, token: TokenKind | str = TokenKind.VALID) -> Delivery:
        """POST `activity` to the bot's `messaging_url` with `token` (the emulator's signature, or a broken one).
        A request that got no answer is recorded, not raised."""
        if self.messaging_url is None:
            raise RuntimeError("TeamsEmulator.messaging_url is not set")
        if self._session is None:
            raise RuntimeError("TeamsEmulator is not started")
        kind = TokenKind(token)
        if kind == TokenKind.VALID:
            self.observe(activity)
        bearer = self.login.channel_token(kind, service_url=self.service_url)
        headers = {"Content-Type": "application/json"} | (
            {} if bearer is None else {"Authorization": f"Bearer {bearer}"}
        )
        sent = time.monotonic()
        status, text, error = 0, "", None
        try:
            async with self._session.post(self.messaging_url, data=json.dumps(activity), headers=headers) as response:
                status, text = response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = repr(exc)
        delivery = Delivery(activity, kind, status, text, sent, time.monotonic() - sent, error)
        self.deliveries.append(delivery)
        return delivery

    async def redeliver(self, delivery: Delivery) -> Delivery:
        """The same activity (same id) again, freshly signed: what the channel does when it saw no answer."""
        return await self.deliver(delivery.activity)


def _str(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _stream_type(value: object) -> StreamType | None:
    return StreamType(value) if isinstance(value, str) and value in tuple(StreamType) else None


def _stream_info(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The streaminfo entity of a streaming activity (the SDK's shape), else its `channelData` (the REST
    samples'); None for an activity that is no stream's."""
    for entity in body.get("entities") or []:
        if isinstance(entity, dict) and entity.get("type") == STREAM_INFO:
            return entity
    data = body.get("channelData")
    if isinstance(data, dict) and data.get("streamType") is not None:
        return data
    return None


def message_entity_problem(entities: Any) -> str | None:
    """What Teams refuses (400) in a message's root message entity, the one that carries the AI label and citations
    (learn.microsoft.com, "Bot messages with AI-generated content": a second root entity, one it cannot parse, more
    than 20 citations, an empty appearance). The documented maximums of a citation's fields (name 80 characters,
    abstract 160, three keywords of 28) are refused here too, so that a test fails where Teams would cut or drop."""
    roots = [e for e in entities or [] if isinstance(e, dict) and e.get("type") == MESSAGE_ENTITY]
    if len(roots) > 1:
        return "Multiple root message entities found under entities array."
    if not roots:
        return None
    [root] = roots
    if root.get("@type") != "Message" or root.get("@context") != "https://schema.org":
        return "Error parsing message entity from entities array."
    if not set(root.get("additionalType") or []) <= {"AIGeneratedContent"}:
        return "Error parsing message entity from entities array."
    citations = root.get("citation")
    if citations is None:
        return None
    if not isinstance(citations, list):
        return "Error parsing message entity from entities array."
    if len(citations) > MAX_CITATIONS:
        return f"Bot message with more than {MAX_CITATIONS} citations."
    for n, claim in enumerate(citations):
        if (problem := _citation_problem(claim)) is not None:
            return f"Error while parsing citation entity with ID: {n}. {problem}"
    return None


def _citation_problem(claim: Any) -> str | None:
    if not isinstance(claim, dict) or claim.get("@type") != "Claim" or not isinstance(claim.get("position"), int):
        return "A citation is a Claim with an integer position."
    appearance = claim.get("appearance")
    if not isinstance(appearance, dict) or not appearance:
        return "The appearance object is empty."
    if appearance.get("@type") != "DigitalDocument":
        return "An appearance is a DigitalDocument."
    name, abstract = appearance.get("name"), appearance.get("abstract", "")
    if not isinstance(name, str) or not name or len(name) > CITATION_NAME:
        return f"A citation's name is 1 to {CITATION_NAME} characters."
    if not isinstance(abstract, str) or len(abstract) > CITATION_ABSTRACT:
        return f"A citation's abstract is at most {CITATION_ABSTRACT} characters."
    keywords = appearance.get("keywords") or []
    if len(keywords) > 3 or any(not isinstance(k, str) or len(k) > 28 for k in keywords):
        return "At most three keywords of at most 28 characters."
    url = appearance.get("url")
    if url is not None and not (isinstance(url, str) and url.startswith(("https://", "http://"))):
        return "A citation's url is a web address."
    return None


def _attachment_problem(attachment: Any) -> str | None:
    if not isinstance(attachment, dict) or not attachment.get("contentType"):
        return "An attachment without a contentType."
    if attachment["contentType"] != CARD_TYPE:
        return None
    card = attachment.get("content")
    if not isinstance(card, dict) or card.get("type") != "AdaptiveCard" or not card.get("version"):
        return "An Adaptive Card needs content with type AdaptiveCard and a version."
    actions = card.get("actions") or []
    if not isinstance(card.get("body", []), list) or not isinstance(actions, list):
        return "An Adaptive Card's body and actions are lists."
    if any(not isinstance(a, dict) or not str(a.get("type", "")).startswith("Action.") for a in actions):
        return "An Adaptive Card action without an Action.* type."
    return None
