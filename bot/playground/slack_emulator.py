"""A local Slack workspace for tests, benchmarks and the playground: Web API emulator + Events API deliverer.

The bot talks to it with the real ``AsyncWebClient`` (so retries, error mapping and request encoding are the SDK's
own), and the emulator plays Slack towards the bot: signed event, slash-command and interactivity requests POSTed
to the bot's ``events_url``, and echoes of the bot's own posts, as Slack sends them.

Typical use::

    async with SlackEmulator(events_url=bot_url) as slack:
        client = AsyncWebClient(token="xoxb-test", base_url=slack.api_url)
        said = await slack.user_says("C_SUPPORT", "<@UBOT> where is my order?")
        reply = await slack.wait_for(lambda: slack.posts("C_SUPPORT", said.ts))
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import mimetypes
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlencode

import aiohttp
from aiohttp import web
from slack_sdk.signature import SignatureVerifier

from bot.playground.waiting import poll

T = TypeVar("T")

TEAM_ID = "T0001"
TEAM_DOMAIN = "driftwing"
APP_ID = "A0001"
BOT_USER_ID = "UBOT"
BOT_ID = "BBOT"
BOT_NAME = "helpdesk"
VERIFICATION_TOKEN = "verification-token"
MESSAGE_TEXT_LIMIT = 40_000
# Fields that slack_sdk sends JSON-encoded inside form bodies.
_JSON_FIELDS = ("blocks", "attachments", "metadata", "view", "chunks", "prompts")

STREAM_TEXT_LIMIT = 12_000
"""markdown_text a chat.startStream, appendStream or stopStream call carries, and each markdown_text chunk
(docs.slack.dev, chat.appendStream; over it Slack answers msg_too_long)."""
STREAM_LIFETIME_S = 300.0
"""How long a stream takes appends and its stop: Slack finalises it about 5 minutes after chat.startStream whatever
the traffic (python-slack-sdk #1859, measured at about 306 s), then answers `message_not_in_streaming_state`."""
STREAM_IDLE_S = 120.0
"""A gap between appends after which Slack ends the stream early. Unpublished ("a few minutes" in reports): two
here, so that a bot relying on a longer one fails against the emulator first."""
TASK_STATUSES = frozenset({"pending", "in_progress", "complete", "error"})
SUGGESTED_PROMPTS_MOST = 4
"""assistant.threads.setSuggestedPrompts: "up to four suggested prompts"."""


@dataclass(frozen=True)
class SlackUser:
    id: str
    name: str
    real_name: str
    image_url: str
    is_bot: bool = False
    is_admin: bool = False
    """A workspace admin (users.info's is_admin)."""
    email: str | None = None
    """profile.email, as Slack gives it to an app with users:read.email (bots have none)."""
    guest: str | None = None
    """"multi" (a multi-channel guest: users.info's is_restricted) or "single" (is_ultra_restricted), or None."""
    team_id: str = TEAM_ID
    """Another team's id: a member of another organisation in a shared channel (Slack Connect), whom users.info
    shows as is_stranger and whose messages carry their own team as user_team and source_team."""
    email_confirmed: bool = True
    """users.info's is_email_confirmed: the owner confirmed the email to their own workspace."""
    locale: str = "en-US"
    """The user's locale, which users.info gives only when asked (`include_locale`)."""

    @property
    def external(self) -> bool:
        return self.team_id != TEAM_ID

    def to_api(self, *, locale: bool = False) -> dict[str, Any]:
        profile = {"real_name": self.real_name, "display_name": self.name}
        profile |= {"image_72": self.image_url, "image_192": self.image_url}
        if self.email is not None:
            profile["email"] = self.email
        user = {"id": self.id, "team_id": self.team_id, "name": self.name, "real_name": self.real_name}
        flags = {"is_bot": self.is_bot, "is_admin": self.is_admin, "is_owner": False}
        flags |= {"is_email_confirmed": self.email_confirmed and self.email is not None}
        flags |= {"is_restricted": self.guest is not None, "is_ultra_restricted": self.guest == "single"}
        if self.external:
            flags["is_stranger"] = True
        return user | flags | {"deleted": False, "profile": profile} | ({"locale": self.locale} if locale else {})


@dataclass(frozen=True)
class Channel:
    id: str
    name: str
    is_im: bool = False
    is_member: bool = True
    """The bot is in the channel: posting elsewhere fails with `not_in_channel`, as in Slack."""
    is_private: bool = False
    is_ext_shared: bool = False
    """Shared with another organisation (Slack Connect)."""
    is_archived: bool = False

    def to_api(self) -> dict[str, Any]:
        kind = {"is_channel": not self.is_im, "is_group": self.is_private, "is_im": self.is_im}
        flags = {"is_member": self.is_member, "is_private": self.is_private or self.is_im}
        flags |= {"is_ext_shared": self.is_ext_shared}
        return {"id": self.id, "name": self.name, "is_archived": self.is_archived} | kind | flags


@dataclass(frozen=True)
class Msg:
    """A message as stored; replaced (not mutated) on edit, reaction or deletion."""

    channel: str
    ts: str
    user: str
    text: str = ""
    bot_id: str | None = None
    thread_ts: str | None = None
    blocks: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] | None = None
    username: str | None = None
    icon_url: str | None = None
    icon_emoji: str | None = None
    files: list[dict[str, Any]] | None = None
    reactions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    edited_ts: str | None = None
    deleted: bool = False
    streaming_state: str | None = None
    """The stream's state: "in_progress" from chat.startStream, "completed" after chat.stopStream (or chat.update
    on an ended stream); None for a message that never streamed. `SlackEmulator.stream_state` tells an expired one."""
    tasks: tuple[Task, ...] = ()
    """The task cards task_update chunks drew on a streamed message, in the order their ids first came."""

    @property
    def edited(self) -> bool:
        return self.edited_ts is not None

    @property
    def is_reply(self) -> bool:
        return self.thread_ts is not None and self.thread_ts != self.ts


@dataclass(frozen=True)
class Task:
    """A task card on a streamed message: a task_update chunk's id, with the title and status it last sent (they
    replace) and its details (they append)."""

    id: str
    title: str
    status: str
    details: str = ""
    output: str | None = None


@dataclass(frozen=True)
class Shown:
    """What a streamed message showed from `at` (time.monotonic()) on: its text and streaming_state."""

    at: float
    text: str
    state: str


@dataclass
class Stream:
    """One chat.startStream and what became of its message, for tests: every text it showed, in order."""

    channel: str
    ts: str
    started_at: float
    last_at: float
    """The last accepted start or append (time.monotonic()): a long gap after it ends the stream."""
    mode: str | None
    """The kind of content, "markdown_text" or "chunks": the first call with content fixes it, and Slack refuses
    the other kind for the rest of the stream (`streaming_mode_mismatch`)."""
    shown: list[Shown] = field(default_factory=list)
    ended: str | None = None
    """None while open; "stopped" (chat.stopStream), "user" (the person pressed stop), "updated" (chat.update after
    it expired)."""

    @property
    def texts(self) -> list[str]:
        return [s.text for s in self.shown]


@dataclass(frozen=True)
class SuggestedPrompts:
    """One accepted assistant.threads.setSuggestedPrompts."""

    channel: str
    thread_ts: str | None
    title: str | None
    prompts: tuple[tuple[str, str], ...]
    """(title, message) of each prompt."""
    shown: bool
    """False when Slack answered ok and showed nothing: an agent_view app that named a thread_ts ("will cause the
    call to silently fail", docs.slack.dev)."""


@dataclass(frozen=True)
class Status:
    """An AI status under a thread (assistant.threads.setStatus)."""

    status: str
    loading_messages: tuple[str, ...] = ()


@dataclass(frozen=True)
class Ephemeral:
    channel: str
    user: str
    text: str
    message_ts: str
    blocks: list[dict[str, Any]] | None = None
    thread_ts: str | None = None


@dataclass(frozen=True)
class Response:
    """A body the app POSTed to a response_url, with the request (slash command or click) that handed it out."""

    user: str
    channel: str
    source: str
    """The slash command ("/support") or action_id the response_url came with."""
    body: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class ApiCall:
    method: str
    params: dict[str, Any]
    at: float  # time.monotonic()
    error: str | None = None  # set when the answer was ok: false
    injected: bool = False  # answered by fail_next(), without performing the action
    dropped: bool = False  # performed, but the answer was lost (drop_next())

    @property
    def failed(self) -> bool:
        return self.error is not None


@dataclass(frozen=True)
class DeliveryResult:
    status: int
    body: str
    headers: Mapping[str, str]
    elapsed_s: float

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Delivery:
    """One request sent to the bot; ``result`` is None when it could not be sent (see ``error``)."""

    payload: dict[str, Any]
    result: DeliveryResult | None
    error: str | None = None
    body: bytes = b""
    """The request's body as sent (``redeliver`` sends it again)."""
    content_type: str = "application/json"


@dataclass(frozen=True)
class Said:
    ts: str
    event_id: str
    result: DeliveryResult
    mention_event_id: str | None = None
    mention_result: DeliveryResult | None = None


@dataclass(frozen=True)
class Fault:
    """How one Web API call goes wrong."""

    status: int
    retry_after: int = 1
    """Seconds, sent as Retry-After with a 429."""
    error: str = "ratelimited"
    params: dict[str, str] = field(default_factory=dict)
    """Only calls with these parameters fail (`fail_next`)."""
    performed: bool = False
    """Slack did the call and then answered with this error (a 500 after the message was posted): the caller
    cannot tell from the answer whether it was done."""
    page: bool = False
    """The answer is an HTML error page (a gateway's 502 or 504), not Slack's JSON."""
    lost: bool = False
    """Performed, and then the connection is closed unanswered (`status` is not sent)."""


@dataclass(frozen=True)
class RateLimit:
    """A token bucket: `burst` calls at once, then one every 1/`per_s` seconds; per channel (chat.postMessage's
    special limit) or per workspace (the tiers)."""

    per_s: float
    burst: int
    per_channel: bool = False


TIER_2, TIER_3, TIER_4 = RateLimit(20 / 60, 20), RateLimit(50 / 60, 50), RateLimit(100 / 60, 100)
SLACK_RATE_LIMITS: Mapping[str, RateLimit] = {
    # "1 message per second to a specific channel, with short bursts above this allowed"; how short is not
    # published: three here.
    "chat.postMessage": RateLimit(1.0, 3, per_channel=True),
    "chat.update": TIER_3,
    "chat.delete": TIER_3,
    "chat.getPermalink": TIER_4,
    "chat.postEphemeral": TIER_4,
    "reactions.add": TIER_3,
    "reactions.remove": TIER_2,
    "users.info": TIER_4,
    "usergroups.users.list": TIER_2,
    "conversations.info": TIER_3,
    # Tier 3 for an app its own organisation built; since 2025 a non-Marketplace app distributed to others gets 1
    # a minute.
    "conversations.replies": TIER_3,
    "conversations.history": TIER_3,
    "views.publish": TIER_4,
    "views.open": TIER_4,
    "files.getUploadURLExternal": TIER_4,
    "files.completeUploadExternal": TIER_4,
    "files.info": TIER_4,
    "files.delete": TIER_3,
    "chat.startStream": TIER_2,
    "chat.appendStream": TIER_4,
    "chat.stopStream": TIER_2,
    "assistant.threads.setSuggestedPrompts": TIER_4,
    "assistant.threads.setTitle": TIER_4,
}
"""Slack's published Web API limits (api.slack.com/apis/rate-limits and each method's page), for
`SlackEmulator(rate_limits=SLACK_RATE_LIMITS)`."""


def block_kit_problem(blocks: Any) -> str | None:
    """What Slack would refuse in a message's blocks (answering `invalid_blocks`), or None. The documented limits
    (docs.slack.dev, Block Kit reference) of the block types the bot sends: header, section, context, actions with
    buttons, divider, markdown (12,000 characters across a message's markdown blocks) and context_actions (feedback
    buttons); any other type is refused, so that a new one gets its limits here before the bot uses it.
    Written out here rather than imported from `agents.markup.limits`: the emulator plays Slack, so a wrong limit in the
    bot must fail against it, not be copied into it."""
    if blocks is None:
        return None
    if not isinstance(blocks, list) or len(blocks) > 50:
        return "more than 50 blocks"
    for block in blocks:
        if not isinstance(block, dict):
            return "a block that is not an object"
        kind = block.get("type")
        if len(str(block.get("block_id") or "")) > 255:
            return f"{kind}: block_id over 255 characters"
        if (problem := _block_problem(kind, block)) is not None:
            return f"{kind}: {problem}"
    markdown = sum(len(str(b.get("text") or "")) for b in blocks if b.get("type") == "markdown")
    return "markdown blocks over 12,000 characters together" if markdown > 12_000 else None


def _block_problem(kind: Any, block: dict[str, Any]) -> str | None:
    match kind:
        case "header":
            return _text_problem(block.get("text"), 150, plain=True)
        case "section":
            text, fields = block.get("text"), block.get("fields")
            if text is None and not fields:
                return "neither text nor fields"
            if text is not None and (problem := _text_problem(text, 3000)) is not None:
                return problem
            if fields is not None and (not isinstance(fields, list) or len(fields) > 10):
                return "more than 10 fields"
            return next((f"field {p}" for f in fields or [] if (p := _text_problem(f, 2000)) is not None), None)
        case "context":
            return _elements_problem(block.get("elements"), 10, _context_element_problem)
        case "actions":
            return _elements_problem(block.get("elements"), 25, _button_problem)
        case "divider":
            return None
        case "markdown":
            text = block.get("text")
            return None if isinstance(text, str) and text else "text that is not a non-empty string"
        case "context_actions":
            return _elements_problem(block.get("elements"), 5, _feedback_buttons_problem)
    return "a block type the emulator does not know"


def _feedback_buttons_problem(element: Any) -> str | None:
    """A feedback_buttons element (the only context_actions element the bot sends): both buttons, each a plain_text
    of at most 75 characters and a value of at most 2,000."""
    if not isinstance(element, dict) or element.get("type") != "feedback_buttons":
        return "an element that is not feedback_buttons"
    if len(str(element.get("action_id") or "")) > 255:
        return "action_id over 255 characters"
    for side in ("positive_button", "negative_button"):
        button = element.get(side)
        if not isinstance(button, dict) or not isinstance(button.get("value"), str) or len(button["value"]) > 2000:
            return f"{side} without a value of at most 2,000 characters"
        if len(str(button.get("accessibility_label") or "")) > 75:
            return f"{side} accessibility_label over 75 characters"
        if (problem := _text_problem(button.get("text"), 75, plain=True)) is not None:
            return f"{side} {problem}"
    return None


def _elements_problem(elements: Any, most: int, check: Callable[[Any], str | None]) -> str | None:
    if not isinstance(elements, list) or not 1 <= len(elements) <= most:
        return f"not 1 to {most} elements"
    return next((p for e in elements if (p := check(e)) is not None), None)


def _context_element_problem(element: Any) -> str | None:
    if isinstance(element, dict) and element.get("type") == "image":
        return None if element.get("image_url") and element.get("alt_text") else "image without image_url or alt_text"
    return _text_problem(element, 3000)


def _button_problem(element: Any) -> str | None:
    if not isinstance(element, dict) or element.get("type") != "button":
        return "an element that is not a button"
    limits = {"action_id": 255, "value": 2000, "url": 3000}
    if over := [key for key, most in limits.items() if len(str(element.get(key) or "")) > most]:
        return f"button {over[0]} over {limits[over[0]]} characters"
    problem = _text_problem(element.get("text"), 75, plain=True)
    return None if problem is None else f"button {problem}"


def _text_problem(obj: Any, most: int, *, plain: bool = False) -> str | None:
    """A text object: plain_text (or mrkdwn where allowed) of 1 to `most` characters."""
    kinds = ("plain_text",) if plain else ("plain_text", "mrkdwn")
    if not isinstance(obj, dict) or obj.get("type") not in kinds:
        return f"text that is not a {' or '.join(kinds)} object"
    text = obj.get("text")
    if not isinstance(text, str) or not 1 <= len(text) <= most:
        return f"text of {len(text) if isinstance(text, str) else 0} characters (1 to {most})"
    return None


TRIGGER_LIFETIME_S = 3.0
"""A trigger_id opens a view once, within 3 seconds of the interaction (docs.slack.dev, views.open and modals)."""


@dataclass(frozen=True)
class Modal:
    """A modal the app opened with `views.open`, for the user whose interaction's trigger_id it exchanged."""

    id: str
    user: str
    view: dict[str, Any]


def modal_problem(view: Any) -> str | None:
    """What Slack would refuse in a modal view (docs.slack.dev/reference/views/modal-views), or None: a plain_text
    title, submit and close of at most 24 characters (submit required with an input block), private_metadata of at
    most 3,000 and callback_id of at most 255 characters, 1 to 100 blocks: input blocks (a plain_text_input), or
    the message blocks `block_kit_problem` knows."""
    if not isinstance(view, dict) or view.get("type") != "modal":
        return "not a modal"
    blocks = view.get("blocks")
    if not isinstance(blocks, list) or not 1 <= len(blocks) <= 100:
        return "not 1 to 100 blocks"
    inputs = [b for b in blocks if isinstance(b, dict) and b.get("type") == "input"]
    for key, required in (("title", True), ("submit", bool(inputs)), ("close", False)):
        if (view.get(key) is not None or required) and (problem := _text_problem(view.get(key), 24, plain=True)):
            return f"{key} {problem}"
    for key, most in (("private_metadata", 3000), ("callback_id", 255), ("external_id", 255)):
        if len(str(view.get(key) or "")) > most:
            return f"{key} over {most} characters"
    others = [b for b in blocks if b not in inputs]
    problem = next((p for b in inputs if (p := _input_problem(b)) is not None), None)
    return problem or (block_kit_problem(others[:50]) if others else None)


def _input_problem(block: dict[str, Any]) -> str | None:
    """An input block with a plain_text_input (the only element the bot asks for)."""
    if len(str(block.get("block_id") or "")) > 255:
        return "input: block_id over 255 characters"
    if (problem := _text_problem(block.get("label"), 2000, plain=True)) is not None:
        return f"input: label {problem}"
    if block.get("hint") is not None and (problem := _text_problem(block.get("hint"), 2000, plain=True)):
        return f"input: hint {problem}"
    element = block.get("element")
    if not isinstance(element, dict) or element.get("type") != "plain_text_input":
        return "input: an element the emulator does not know"
    if len(str(element.get("action_id") or "")) > 255:
        return "input: action_id over 255 characters"
    placeholder = element.get("placeholder")
    if placeholder is not None and (problem := _text_problem(placeholder, 150, plain=True)):
        return f"input: placeholder {problem}"
    for key, least in (("min_length", 0), ("max_length", 1)):
        value = element.get(key)
        if value is not None and not (isinstance(value, int) and least <= value <= 3000):
            return f"input: {key} not {least} to 3000"
    return None


class SlackApiFailure(Exception):
    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


def _mimetype(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def _flag(value: Any) -> bool:
    # Booleans arrive as JSON true, or as "1"/"true" in query strings and forms.
    return value is True or str(value).lower() in ("1", "true")


def _str(params: Mapping[str, Any], key: str) -> str | None:
    value = params.get(key)
    return None if value is None or value == "" else str(value)


def _require(params: Mapping[str, Any], key: str, error: str) -> str:
    value = _str(params, key)
    if value is None:
        raise SlackApiFailure(error)
    return value


def _metadata(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """A message's metadata as Slack takes it: an object with a string event_type and an object event_payload."""
    metadata = params.get("metadata")
    if metadata is None:
        return None
    if (
        not isinstance(metadata, dict)
        or not isinstance(metadata.get("event_type"), str)
        or not isinstance(metadata.get("event_payload"), dict)
    ):
        raise SlackApiFailure("invalid_metadata_format")
    return metadata


@dataclass(frozen=True)
class _Piece:
    """What one streaming call adds: text, task updates and blocks chunks, and which kind of call it was."""

    mode: str | None
    text: str = ""
    tasks: tuple[dict[str, Any], ...] = ()
    blocks: tuple[dict[str, Any], ...] = ()


def _task_problem(chunk: Mapping[str, Any]) -> str | None:
    """A task_update chunk Slack takes: an id, a title of 1 to 256 characters and a known status."""
    if not isinstance(chunk.get("id"), str) or not chunk["id"]:
        return "no id"
    title = chunk.get("title")
    if not isinstance(title, str) or not 1 <= len(title) <= 256:
        return "title not 1 to 256 characters"
    if chunk.get("status") not in TASK_STATUSES:
        return f"status {chunk.get('status')!r}"
    return None


def _merge_tasks(tasks: tuple[Task, ...], updates: tuple[dict[str, Any], ...]) -> tuple[Task, ...]:
    cards = {task.id: task for task in tasks}
    for update in updates:
        old = cards.get(update["id"])
        details = (old.details if old else "") + str(update.get("details") or "")
        output = update.get("output") if update.get("output") is not None else (old.output if old else None)
        cards[update["id"]] = Task(update["id"], update["title"], update["status"], details, output)
    return tuple(cards.values())


async def _read_params(request: web.Request) -> dict[str, Any]:
    params: dict[str, Any] = dict(request.query)
    if request.can_read_body:
        if request.content_type == "application/json":
            try:
                body = await request.json()
            except ValueError:
                body = None
            if isinstance(body, dict):
                params.update(body)
        else:
            form = await request.post()
            params.update({k: v for k, v in form.items() if isinstance(v, str)})
    for key in _JSON_FIELDS:
        if isinstance(params.get(key), str):
            with contextlib.suppress(ValueError):  # malformed JSON is kept as sent
                params[key] = json.loads(params[key])
    return params


class SlackEmulator:
    def __init__(
        self,
        *,
        signing_secret: str = "test-signing-secret",
        events_url: str | None = None,
        echo_bot_posts: bool = True,
        bot_token: str | None = None,
        port: int = 0,
        connection_limit: int = 100,
        rate_limits: Mapping[str, RateLimit] | None = None,
    ) -> None:
        self.signing_secret = signing_secret
        self.events_url = events_url
        self.echo_bot_posts = echo_bot_posts
        self.expected_token = bot_token  # None: any bearer token is accepted
        self.calls: list[ApiCall] = []
        self.ephemerals: list[Ephemeral] = []
        self.homes: dict[str, dict[str, Any]] = {}  # user -> the App Home view last published for them
        self.responses: list[dict[str, Any]] = []  # bodies POSTed to response_url endpoints
        self.response_log: list[Response] = []  # the same, with who and what they answer
        self.rejected: list[tuple[dict[str, Any], str]] = []  # messages and response_url bodies refused, and why
        self._response_urls: dict[str, tuple[str, str, str]] = {}  # id -> (user, channel, source)
        self.deliveries: list[Delivery] = []
        self.users: dict[str, SlackUser] = {}
        self.usergroups: dict[str, tuple[str, ...]] = {}  # id -> its members' ids
        self.channels: dict[str, Channel] = {}
        self._messages: dict[str, dict[str, Msg]] = {}  # channel -> ts -> message, in ts order
        self._reply_index: dict[tuple[str, str], list[str]] = {}  # (channel, root ts) -> reply ts, in order
        self.statuses: dict[tuple[str, str], Status] = {}
        """The AI status shown under each thread (channel, root ts), while one is; a bot post in it clears it."""
        self._streams: dict[tuple[str, str], Stream] = {}  # (channel, ts) -> the stream that made the message
        self.stream_lifetime_s = STREAM_LIFETIME_S
        self.stream_idle_s = STREAM_IDLE_S
        """How long a stream lives, and the gap that ends it early (a test shortens them to play an expiry)."""
        self.agent_view = True
        """The app uses the agent messaging experience (manifest.yml's features.agent_view), not assistant_view."""
        self.suggested_prompts: list[SuggestedPrompts] = []
        self.titles: dict[tuple[str, str], str] = {}  # (channel, thread ts) -> assistant.threads.setTitle's title
        self._faults: dict[str, deque[Fault]] = {}
        self.weather: Callable[[str, Mapping[str, Any]], Fault | None] | None = None
        """A storm: (method, params) -> how this call fails, or None; asked for every call no `fail_next` fault
        answers (a benchmark sets a rule that depends on the time)."""
        self.rate_limits: Mapping[str, RateLimit] = rate_limits or {}
        """Enforced with 429s and Retry-After when set (`SLACK_RATE_LIMITS`); none by default, so that a test's
        burst of posts is not slowed by them."""
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}  # (method, channel or "") -> (tokens, at)
        self._holds: dict[str, asyncio.Event] = {}
        self._drops: list[tuple[str, dict[str, str]]] = []  # (method, params it must have), one per lost answer
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_ts_us = 0
        self.files: dict[str, tuple[dict[str, Any], bytes]] = {}  # id -> (Slack's file object, its bytes)
        self.downloads: list[tuple[str, int]] = []  # (file id, HTTP status) of every url_private request
        self.uploads: dict[str, tuple[str, int, bytes | None]] = {}  # id -> (filename, declared length, bytes sent)
        self._response_ids = itertools.count(1)
        self._triggers: dict[str, tuple[float, str]] = {}  # trigger_id -> (issued, monotonic; the user's id)
        self._exchanged: set[str] = set()  # trigger_ids a view was opened with
        self.trigger_lifetime_s = TRIGGER_LIFETIME_S
        """How long a trigger_id can open a view (a test sets 0 to play an app that answered too late)."""
        self.modals: dict[str, Modal] = {}  # view id -> the modal opened
        self._verifier = SignatureVerifier(signing_secret)
        self._requested_port = port
        self._connection_limit = connection_limit
        """Requests to the bot at once (aiohttp's default); a benchmark's burst needs more."""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._port: int | None = None
        self._methods: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "chat.delete": self._delete,
            "chat.getPermalink": self._permalink,
            "chat.postEphemeral": self._post_ephemeral,
            "reactions.add": self._reactions_add,
            "reactions.remove": self._reactions_remove,
            "users.info": self._users_info,
            "usergroups.users.list": self._usergroup_users,
            "conversations.info": self._conversations_info,
            "conversations.replies": self._replies,
            "conversations.history": self._history,
            "assistant.threads.setStatus": self._set_status,
            "assistant.threads.setSuggestedPrompts": self._set_suggested_prompts,
            "assistant.threads.setTitle": self._set_title,
            "chat.startStream": self._start_stream,
            "chat.appendStream": self._append_stream,
            "chat.stopStream": self._stop_stream,
            "views.publish": self._views_publish,
            "views.open": self._views_open,
            "files.getUploadURLExternal": self._upload_url,
            "files.completeUploadExternal": self._complete_upload,
            "files.info": self._files_info,
            "files.delete": self._files_delete,
        }
        self.add_user(BOT_USER_ID, BOT_NAME, "Helpdesk", is_bot=True)
        self.add_user("U_CUSTOMER", "casey", "Casey Customer")
        self.add_user("U_STAFF", "sam", "Sam Staff")
        self.add_channel("C_SUPPORT", "#support")
        self.add_channel("C_STAFF", "#staff", is_private=True)

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_post("/response_url/{id}", self._response_url)
        app.router.add_get("/files-pri/{key}/{name}", self._download)
        app.router.add_post("/upload/{file_id}", self._receive_upload)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self._requested_port).start()
        self._port = int(self._runner.addresses[0][1])
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._connection_limit), timeout=aiohttp.ClientTimeout(total=30)
        )

    async def stop(self) -> None:
        for event in self._holds.values():
            event.set()
        self._holds.clear()
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=5.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()
        self._session = self._runner = self._port = None

    async def __aenter__(self) -> SlackEmulator:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        if self._port is None:
            raise RuntimeError("SlackEmulator is not started")
        return f"http://127.0.0.1:{self._port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/"

    def reset(self) -> None:
        """Forget messages, recordings, faults and holds; users and channels stay."""
        for event in self._holds.values():
            event.set()
        for store in (self.calls, self.ephemerals, self.responses, self.response_log, self.deliveries, self.homes):
            store.clear()
        self.modals.clear()
        self._streams.clear()
        self.suggested_prompts.clear()
        self.titles.clear()
        self._messages.clear()
        self._reply_index.clear()
        self.files.clear()
        self.downloads.clear()
        self.uploads.clear()
        self._faults.clear()
        self._holds.clear()
        self._drops.clear()

    # -- workspace state -------------------------------------------------------------------------------------

    def add_user(
        self,
        id: str,
        name: str,
        real_name: str,
        image_url: str | None = None,
        *,
        is_bot: bool = False,
        is_admin: bool = False,
        email: str | None = None,
        guest: str | None = None,
        team_id: str = TEAM_ID,
        email_confirmed: bool = True,
    ) -> SlackUser:
        """A member of the workspace; a person (not a bot) gets an email at the workspace's domain unless given."""
        image = image_url or f"https://avatars.{TEAM_DOMAIN}.test/{id}.png"
        if email is None and not is_bot:
            email = f"{name}@{TEAM_DOMAIN}.test"
        user = self.users[id] = SlackUser(
            id, name, real_name, image, is_bot, is_admin, email, guest, team_id, email_confirmed
        )
        return user

    def add_channel(self, id: str, name: str, is_im: bool = False, **flags: bool) -> Channel:
        """A channel (again, replacing it: `add_channel("C_STAFF", "#staff", is_member=False)`)."""
        channel = self.channels[id] = Channel(id, name.lstrip("#"), is_im, **flags)
        return channel

    def add_file(
        self, name: str, mimetype: str, content: bytes, *, user: str = "U_CUSTOMER", file_id: str | None = None
    ) -> dict[str, Any]:
        """A file someone uploaded: its file object as message events carry it (pass it to ``user_says(files=...)``),
        downloadable from ``url_private`` with the bot token, as Slack serves it."""
        file_id = file_id or self._new_file_id()
        url = f"{self.url}/files-pri/{TEAM_ID}-{file_id}/{name}"
        obj = {
            "id": file_id,
            "name": name,
            "title": name,
            "mimetype": mimetype,
            "filetype": name.rsplit(".", 1)[-1] if "." in name else "binary",
            "size": len(content),
            "user": user,
            "url_private": url,
            "url_private_download": f"{url}?download=1",
        }
        self.files[file_id] = (obj, content)
        return obj

    async def _download(self, request: web.Request) -> web.Response:
        """``url_private``: the bytes for the bot's token (``Authorization: Bearer``); anything else gets Slack's
        sign-in page, an HTML 200 rather than an error status, as Slack answers it."""
        file_id = request.match_info["key"].rsplit("-", 1)[-1]
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        allowed = token.startswith("xoxb-") and (self.expected_token is None or token == self.expected_token)
        stored = self.files.get(file_id)
        if stored is None:
            self.downloads.append((file_id, 404))
            return web.Response(status=404, text="Not found")
        if not allowed:
            self.downloads.append((file_id, 200))
            return web.Response(text="<html><body>Sign in to Slack</body></html>", content_type="text/html")
        self.downloads.append((file_id, 200))
        obj, content = stored
        return web.Response(body=content, content_type=str(obj["mimetype"]))

    def shared_files(self, channel: str, thread_ts: str | None = None) -> list[tuple[Msg, bytes]]:
        """Every file shared by the bot in a channel (or one thread), with its message, in order."""
        return [
            (msg, self.files[f["id"]][1])
            for msg in self.posts(channel, thread_ts)
            for f in msg.files or ()
            if f["id"] in self.files
        ]

    def _upload_url(self, params: dict[str, Any]) -> dict[str, Any]:
        """files.getUploadURLExternal: a file id and where to POST its bytes (served here, as Slack's is)."""
        filename = _require(params, "filename", "invalid_arguments")
        length = int(params.get("length") or 0)
        if length <= 0:
            raise SlackApiFailure("missing_argument")  # Slack's answer to a length of 0
        file_id = self._new_file_id()
        self.uploads[file_id] = (filename, length, None)
        return {"upload_url": f"{self.url}/upload/{file_id}", "file_id": file_id}

    async def _receive_upload(self, request: web.Request) -> web.Response:
        """The upload URL: the bytes as a multipart form's file or raw; Slack answers 200 when it has them."""
        file_id = request.match_info["file_id"]
        if file_id not in self.uploads:
            return web.Response(status=404, text="Not found")
        if request.content_type.startswith("multipart/"):
            form = await request.post()
            part = next((v for v in form.values() if isinstance(v, web.FileField)), None)
            data = part.file.read() if part is not None else b""
        else:
            data = await request.read()
        name, length, _ = self.uploads[file_id]
        self.uploads[file_id] = (name, length, data)
        return web.Response(text=f"OK - {len(data)}")

    def _complete_upload(self, params: dict[str, Any]) -> dict[str, Any]:
        """files.completeUploadExternal: uploaded files shared in one message (with ``initial_comment``) in a
        channel or thread. Completing files again shares them again, so a sender that repeats itself shows."""
        raw = params.get("files")
        listed = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(listed, list) or not listed:
            raise SlackApiFailure("invalid_arguments")
        ids = [str(f.get("id")) for f in listed if isinstance(f, dict)]
        if any(self.uploads.get(i, ("", 0, None))[2] is None and i not in self.files for i in ids):
            raise SlackApiFailure("file_not_found")  # never uploaded (or its bytes never sent)
        channel_id = _str(params, "channel_id")
        if channel_id is None:  # shared nowhere: private to the uploader
            return {"files": [{"id": i, "title": self._uploaded(i)["title"]} for i in ids]}
        channel = self._channel(channel_id)
        if channel.is_archived:
            raise SlackApiFailure("is_archived")
        if not channel.is_member:
            raise SlackApiFailure("not_in_channel")
        thread_ts = _str(params, "thread_ts")
        if thread_ts is not None:
            self._find(channel.id, thread_ts, error="thread_not_found")
        if len(_str(params, "initial_comment") or "") > MESSAGE_TEXT_LIMIT:
            raise SlackApiFailure("msg_too_long")
        objs = [self._uploaded(i) for i in ids]
        msg = self._store(
            Msg(
                channel.id,
                self._next_ts(),
                BOT_USER_ID,
                _str(params, "initial_comment") or "",
                bot_id=BOT_ID,
                thread_ts=thread_ts,
                files=objs,
            )
        )
        share = {"ts": msg.ts, "channel_name": channel.name, "team_id": TEAM_ID} | (
            {"thread_ts": thread_ts} if thread_ts else {}
        )
        for obj in objs:
            where = obj["shares"].setdefault("private" if channel.is_private or channel.is_im else "public", {})
            where.setdefault(channel.id, []).append(share)
        event = self._render(msg, metadata=False) | {"subtype": "file_share", "bot_profile": {"id": BOT_ID}}
        self._echo(event | self._event_fields(channel, msg.ts))
        # As Slack: the ids and titles only (the share is processed asynchronously; files.info shows it).
        return {"files": [{"id": obj["id"], "title": obj["title"]} for obj in objs]}

    def _uploaded(self, file_id: str) -> dict[str, Any]:
        """The file object of an upload, made (and downloadable) once it is completed."""
        if file_id not in self.files:
            name, _, data = self.uploads.pop(file_id)
            obj = self.add_file(name, _mimetype(name), data or b"", user=BOT_USER_ID, file_id=file_id)
            obj["shares"] = {}
        return self.files[file_id][0]

    def _new_file_id(self) -> str:
        number = len(self.files) + len(self.uploads) + 1
        while f"F{number:06d}" in self.files or f"F{number:06d}" in self.uploads:  # uploads and files share them
            number += 1
        return f"F{number:06d}"

    def _files_info(self, params: dict[str, Any]) -> dict[str, Any]:
        file_id = _require(params, "file", "file_not_found")
        if file_id not in self.files:
            raise SlackApiFailure("file_not_found")
        return {"file": self.files[file_id][0]}

    def _files_delete(self, params: dict[str, Any]) -> dict[str, Any]:
        """files.delete: a bot deletes only what it uploaded (completed or not); Slack answers `cant_delete_file`
        for anyone else's."""
        file_id = _require(params, "file", "file_not_found")
        if file_id in self.uploads:
            del self.uploads[file_id]
            return {}
        if file_id not in self.files:
            raise SlackApiFailure("file_not_found")
        if self.files[file_id][0]["user"] != BOT_USER_ID:
            raise SlackApiFailure("cant_delete_file")
        del self.files[file_id]
        return {}

    def add_usergroup(self, id: str, members: list[str]) -> None:
        self.usergroups[id] = tuple(members)

    def add_message(self, channel: str, text: str, *, user: str = "U_CUSTOMER", thread_ts: str | None = None) -> Msg:
        """Store a human message without delivering any event (to seed history)."""
        return self._store(Msg(self._channel(channel).id, self._next_ts(), user, text, thread_ts=thread_ts))

    def message(self, channel: str, ts: str) -> Msg | None:
        """The stored message, deleted ones included."""
        return self._messages.get(channel, {}).get(ts)

    def messages(self, channel: str) -> list[Msg]:
        return [m for m in self._messages.get(channel, {}).values() if not m.deleted]

    def posts(self, channel: str, thread_ts: str | None = None) -> list[Msg]:
        """The bot's live posts in a channel (any thread), or only those in thread ``thread_ts``."""
        mine = [m for m in self.messages(channel) if m.bot_id == BOT_ID]
        if thread_ts is None:
            return mine
        return [m for m in mine if thread_ts in (m.thread_ts, m.ts)]

    def thread(self, channel: str, thread_ts: str) -> list[Msg]:
        """The live root and replies of a thread, in ts order."""
        root = self.message(channel, thread_ts)
        return ([root] if root is not None and not root.deleted else []) + self._live_replies(channel, thread_ts)

    def _live_replies(self, channel: str, root_ts: str) -> list[Msg]:
        stored = self._messages.get(channel, {})
        replies = (stored[ts] for ts in self._reply_index.get((channel, root_ts), ()))
        return [m for m in replies if not m.deleted]

    def calls_to(self, method: str) -> list[ApiCall]:
        return [c for c in self.calls if c.method == method]

    def streams(self, channel: str | None = None) -> list[Stream]:
        """Every stream started (in one channel), in order."""
        return [s for (c, _), s in self._streams.items() if channel in (None, c)]

    def stream(self, channel: str, ts: str) -> Stream | None:
        return self._streams.get((channel, ts))

    def stream_state(self, channel: str, ts: str) -> str | None:
        """The message's streaming state: "in_progress", "completed", or "expired": a stream Slack ended on its own
        and nobody finished with chat.update, which the customer sees as a stuck message holding whatever had
        streamed; None for a message that never streamed."""
        msg, stream = self.message(channel, ts), self._streams.get((channel, ts))
        if msg is None or stream is None:
            return None
        if msg.streaming_state == "in_progress" and not self._stream_open(stream):
            return "expired"
        return msg.streaming_state

    def user_stops_stream(self, channel: str, ts: str) -> None:
        """The person presses stop on a streaming message: Slack finalises it as it stands, and answers
        `stopped_by_user` to the app's further appends and its stop."""
        stream = self._streams[(channel, ts)]
        msg = self._store(replace(self._find(channel, ts), streaming_state="completed"))
        stream.ended = "user"
        stream.shown.append(Shown(time.monotonic(), msg.text, "completed"))

    def _stream_open(self, stream: Stream) -> bool:
        now = time.monotonic()
        return (
            stream.ended is None
            and now - stream.started_at < self.stream_lifetime_s
            and now - stream.last_at < self.stream_idle_s
        )

    # -- fault injection -------------------------------------------------------------------------------------

    def fail_next(
        self,
        method: str,
        *,
        status: int = 429,
        retry_after: int = 1,
        error: str = "ratelimited",
        times: int = 1,
        performed: bool = False,
        page: bool = False,
        **params: str,
    ) -> None:
        """The next ``times`` calls of ``method`` with these parameters (all calls without any) fail so (see
        `Fault`)."""
        fault = Fault(status, retry_after, error, params, performed=performed, page=page)
        self._faults.setdefault(method, deque()).extend([fault] * times)

    def drop_next(self, method: str, *, times: int = 1, **params: str) -> None:
        """The next ``times`` calls of ``method`` with these parameters (``channel="C_STAFF"``) are performed, and
        then the connection is closed unanswered: the caller cannot tell whether Slack has the call."""
        self._drops += [(method, params)] * times

    def hold(self, method: str) -> None:
        """Calls of ``method`` are performed and recorded, but not answered until ``release(method)``."""
        self._holds.setdefault(method, asyncio.Event())

    def release(self, method: str) -> None:
        event = self._holds.pop(method, None)
        if event is not None:
            event.set()

    # A polling deadline, not a cancellation scope, hence a plain ``timeout`` parameter.
    async def wait_for(self, predicate: Callable[[], T | bool | None], timeout: float = 30.0) -> T:  # noqa: ASYNC109
        def story() -> str:
            recent = [f"{c.method}({c.error or 'ok'})" for c in self.calls[-8:]]
            return f"slack emulator: {len(self.calls)} API calls, recent: {recent}; {len(self.deliveries)} deliveries"

        return await poll(predicate, timeout, story)

    # -- Web API ---------------------------------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        params = await _read_params(request)
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else params.pop("token", None)
        status, injected, headers = 200, False, dict[str, str]()
        body: dict[str, Any]
        if not token:
            body = {"ok": False, "error": "not_authed"}
        elif self.expected_token is not None and token != self.expected_token:
            body = {"ok": False, "error": "invalid_auth"}
        elif (fault := self._fault_for(method, params)) is not None:
            performed = (fault.performed or fault.lost) and method in self._methods
            if performed:
                with contextlib.suppress(SlackApiFailure):
                    self._methods[method](params)
            status, injected = fault.status, not performed
            headers = {"Retry-After": str(fault.retry_after)} if fault.status == 429 else {}
            body = {"ok": False, "error": fault.error}
            if fault.lost or fault.page:
                what = "connection closed" if fault.lost else f"HTTP {status} page"
                self.calls.append(ApiCall(method, params, time.monotonic(), what, injected, fault.lost))
                if fault.lost and request.transport is not None:
                    request.transport.close()
                    return web.Response()
                page = f"<html><body><h1>{status}</h1></body></html>"
                return web.Response(status=status, text=page, content_type="text/html")
        elif method not in self._methods:
            body = {"ok": False, "error": "unknown_method"}
        elif (wait := self._rate_limited(method, params)) is not None:
            status, injected = 429, True
            headers, body = {"Retry-After": str(wait)}, {"ok": False, "error": "ratelimited"}
        else:
            try:
                body = {"ok": True, **self._methods[method](params)}
            except SlackApiFailure as exc:
                body = {"ok": False, "error": exc.error}
        error = None if body["ok"] else str(body["error"])
        drop = None if injected else self._drop_for(method, params)
        self.calls.append(ApiCall(method, params, time.monotonic(), error, injected, dropped=drop is not None))
        if drop is not None and request.transport is not None:
            self._drops.remove(drop)
            request.transport.close()  # the answer is lost on the way back
            return web.Response()
        hold = self._holds.get(method)
        if hold is not None and not injected:
            await hold.wait()
        return web.json_response(body, status=status, headers=headers)

    def _rate_limited(self, method: str, params: Mapping[str, Any]) -> int | None:
        """Take a token from the method's bucket; the whole seconds to wait (Retry-After) when there is none."""
        limit = self.rate_limits.get(method)
        if limit is None:
            return None
        key = (method, str(params.get("channel") or "") if limit.per_channel else "")
        now = time.monotonic()
        tokens, at = self._buckets.get(key, (float(limit.burst), now))
        tokens = min(float(limit.burst), tokens + (now - at) * limit.per_s)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return max(1, math.ceil((1.0 - tokens) / limit.per_s))
        self._buckets[key] = (tokens - 1.0, now)
        return None

    def _fault_for(self, method: str, params: Mapping[str, Any]) -> Fault | None:
        queued = next(
            (f for f in self._faults.get(method, ()) if all(str(params.get(k)) == v for k, v in f.params.items())),
            None,
        )
        if queued is not None:
            self._faults[method].remove(queued)
            return queued
        return self.weather(method, params) if self.weather is not None else None

    def _drop_for(self, method: str, params: Mapping[str, Any]) -> tuple[str, dict[str, str]] | None:
        return next(
            (
                drop
                for drop in self._drops
                if drop[0] == method and all(str(params.get(k)) == v for k, v in drop[1].items())
            ),
            None,
        )

    def _auth_test(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": f"https://{TEAM_DOMAIN}.slack.com/",
            "team": TEAM_DOMAIN.title(),
            "user": BOT_NAME,
            "team_id": TEAM_ID,
            "user_id": BOT_USER_ID,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }

    def _set_status(self, params: dict[str, Any]) -> dict[str, Any]:
        """assistant.threads.setStatus: an empty status clears; more than 10 loading messages are refused."""
        channel = self._channel_param(params, key="channel_id")
        thread = _require(params, "thread_ts", "invalid_thread_ts")
        if self.message(channel.id, thread) is None:
            raise SlackApiFailure("invalid_thread_ts")
        status, loading = params.get("status"), params.get("loading_messages") or []
        if isinstance(loading, str):
            loading = json.loads(loading)
        if not isinstance(status, str) or not isinstance(loading, list) or len(loading) > 10:
            raise SlackApiFailure("invalid_arguments")
        if status:
            self.statuses[(channel.id, thread)] = Status(status, tuple(str(m) for m in loading))
        else:
            self.statuses.pop((channel.id, thread), None)
        return {}

    def _post_message(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel_param(params)
        if channel.is_archived:
            raise SlackApiFailure("is_archived")
        if not channel.is_member:
            raise SlackApiFailure("not_in_channel")
        text = _str(params, "text") or _str(params, "markdown_text")
        if text is None and not params.get("blocks") and not params.get("attachments"):
            raise SlackApiFailure("no_text")
        self._check_content(params)
        msg = Msg(
            channel=channel.id,
            ts=self._next_ts(),
            user=BOT_USER_ID,
            text=text or "",
            bot_id=BOT_ID,
            thread_ts=_str(params, "thread_ts"),
            blocks=params.get("blocks"),
            metadata=_metadata(params),
            username=_str(params, "username"),
            icon_url=_str(params, "icon_url"),
            icon_emoji=_str(params, "icon_emoji"),
        )
        self._store(msg)
        if msg.thread_ts is not None:  # Slack clears the AI status when the app posts in the thread
            self.statuses.pop((channel.id, msg.thread_ts), None)
        event = self._render(msg, metadata=False) | {"bot_profile": {"id": BOT_ID, "name": BOT_NAME}}
        self._echo(event | self._event_fields(channel, msg.ts))
        return {"channel": channel.id, "ts": msg.ts, "message": self._render(msg)}

    def _update(self, params: dict[str, Any]) -> dict[str, Any]:
        old = self._own_message(params, "ts", "cant_update_message")
        stream = self._streams.get((old.channel, old.ts))
        if stream is not None and self._stream_open(stream):
            # Measured (not documented): a message still streaming is the stream's; an edit is refused cleanly.
            raise SlackApiFailure("streaming_state_conflict")
        self._check_content(params)
        changes: dict[str, Any] = {"edited_ts": self._next_ts()}
        for key in ("text", "blocks"):
            if key in params:
                changes[key] = params[key]
        if "metadata" in params:
            changes["metadata"] = _metadata(params)
        if old.streaming_state == "in_progress":  # an expired stream: chat.update is how it is finished
            changes["streaming_state"] = "completed"
        new = self._store(replace(old, **changes))
        if stream is not None:
            stream.ended = stream.ended or "updated"
            stream.shown.append(Shown(time.monotonic(), new.text, str(new.streaming_state)))
        channel = self.channels[new.channel]
        self._echo(
            {"subtype": "message_changed", "hidden": True, "message": self._render(new, metadata=False)}
            | {"previous_message": self._render(old, metadata=False)}
            | self._event_fields(channel, self._next_ts())
        )
        return {"channel": new.channel, "ts": new.ts, "text": new.text, "message": self._render(new)}

    def _delete(self, params: dict[str, Any]) -> dict[str, Any]:
        old = self._own_message(params, "ts", "cant_delete_message")
        self._store(replace(old, deleted=True))
        self._echo(
            {"subtype": "message_deleted", "hidden": True, "deleted_ts": old.ts}
            | {"previous_message": self._render(old, metadata=False)}
            | self._event_fields(self.channels[old.channel], self._next_ts())
        )
        return {"channel": old.channel, "ts": old.ts}

    # -- streaming (docs.slack.dev, chat.startStream / chat.appendStream / chat.stopStream) -------------------

    def _start_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        """A bot message that grows: a reply in thread_ts's thread, or a top-level message in a channel. Outside a
        DM Slack must know whom the stream is for (recipient_user_id and recipient_team_id)."""
        channel = self._channel_param(params)
        if channel.is_archived:
            raise SlackApiFailure("is_archived")
        if not channel.is_member:
            raise SlackApiFailure("not_in_channel")
        if not channel.is_im:
            for key in ("recipient_user_id", "recipient_team_id"):
                if _str(params, key) is None:
                    raise SlackApiFailure(f"missing_{key}")
        if params.get("task_display_mode") not in (None, "timeline", "plan"):
            raise SlackApiFailure("invalid_arguments")
        piece = self._stream_piece(params)
        msg = Msg(
            channel=channel.id,
            ts=self._next_ts(),
            user=BOT_USER_ID,
            text=piece.text,
            bot_id=BOT_ID,
            thread_ts=_str(params, "thread_ts"),
            blocks=list(piece.blocks) or None,
            username=_str(params, "username"),
            icon_url=_str(params, "icon_url"),
            icon_emoji=_str(params, "icon_emoji"),
            streaming_state="in_progress",
            tasks=_merge_tasks((), piece.tasks),
        )
        self._store(msg)
        if msg.thread_ts is not None:  # a reply in the thread, as a post: Slack clears the AI status
            self.statuses.pop((channel.id, msg.thread_ts), None)
        now = time.monotonic()
        shown = [Shown(now, msg.text, "in_progress")]
        self._streams[(channel.id, msg.ts)] = Stream(channel.id, msg.ts, now, now, piece.mode, shown)
        event = self._render(msg, metadata=False) | {"bot_profile": {"id": BOT_ID, "name": BOT_NAME}}
        self._echo(event | self._event_fields(channel, msg.ts))
        return {"channel": channel.id, "ts": msg.ts}

    def _append_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        msg, stream = self._stream_target(params)
        piece = self._stream_piece(params)
        if piece.mode is None:
            raise SlackApiFailure("no_text")
        new = self._grow(msg, stream, piece)
        return {"channel": new.channel, "ts": new.ts}

    def _stop_stream(self, params: dict[str, Any]) -> dict[str, Any]:
        """The last text, blocks rendered after everything streamed (50 of them, apart from blocks chunks'), and
        the message's metadata; the message is final from here on."""
        msg, stream = self._stream_target(params)
        piece = self._stream_piece(params)
        blocks = params.get("blocks")
        if (problem := block_kit_problem(blocks)) is not None:
            self.rejected.append((params, problem))
            raise SlackApiFailure("invalid_blocks")
        metadata = _metadata(params)
        closing = replace(piece, blocks=piece.blocks + tuple(blocks or ()))
        new = self._grow(msg, stream, closing, metadata=metadata, state="completed")
        stream.ended = "stopped"
        self._echo(
            {"subtype": "message_changed", "hidden": True, "message": self._render(new, metadata=False)}
            | {"previous_message": self._render(msg, metadata=False)}
            | self._event_fields(self.channels[new.channel], self._next_ts())
        )
        return {"channel": new.channel, "ts": new.ts, "message": self._render(new)}

    def _stream_target(self, params: Mapping[str, Any]) -> tuple[Msg, Stream]:
        channel = self._channel_param(params)
        msg = self._find(channel.id, _require(params, "ts", "message_not_found"))
        if msg.bot_id != BOT_ID:
            raise SlackApiFailure("message_not_owned_by_app")
        stream = self._streams.get((channel.id, msg.ts))
        if stream is not None and stream.ended == "user":
            raise SlackApiFailure("stopped_by_user")
        if stream is None or not self._stream_open(stream):
            raise SlackApiFailure("message_not_in_streaming_state")
        return msg, stream

    def _stream_piece(self, params: Mapping[str, Any]) -> _Piece:
        """markdown_text or chunks (not both), each within Slack's limits."""
        text, chunks = params.get("markdown_text"), params.get("chunks")
        if text is not None and not isinstance(text, str):
            raise SlackApiFailure("invalid_arguments")
        if text and chunks:
            raise SlackApiFailure("invalid_arguments")
        if len(text or "") > STREAM_TEXT_LIMIT:
            self.rejected.append((dict(params), f"markdown_text of {len(text or '')} characters"))
            raise SlackApiFailure("msg_too_long")
        if chunks is None or chunks == []:
            return _Piece("markdown_text" if text else None, text or "")
        if not isinstance(chunks, list):
            raise SlackApiFailure("invalid_chunks")
        texts: list[str] = []
        tasks: list[dict[str, Any]] = []
        blocks: list[dict[str, Any]] = []
        for chunk in chunks:
            kind = chunk.get("type") if isinstance(chunk, dict) else None
            if kind == "markdown_text" and isinstance(chunk.get("text"), str):
                if len(chunk["text"]) > STREAM_TEXT_LIMIT:
                    self.rejected.append((dict(params), f"markdown_text chunk of {len(chunk['text'])} characters"))
                    raise SlackApiFailure("msg_too_long")
                texts.append(chunk["text"])
            elif kind == "task_update" and _task_problem(chunk) is None:
                tasks.append(chunk)
            elif kind == "plan_update" and isinstance(chunk.get("title"), str) and 1 <= len(chunk["title"]) <= 256:
                pass  # the plan's title: nothing the emulator shows
            elif kind == "blocks" and isinstance(chunk.get("blocks"), list):
                if (problem := block_kit_problem(chunk["blocks"])) is not None:
                    self.rejected.append((dict(params), problem))
                    raise SlackApiFailure("invalid_blocks")
                blocks += chunk["blocks"]
            else:
                self.rejected.append((dict(params), f"chunk {chunk!r:.80}"))
                raise SlackApiFailure("invalid_chunks")
        return _Piece("chunks", "".join(texts), tuple(tasks), tuple(blocks))

    def _grow(
        self,
        msg: Msg,
        stream: Stream,
        piece: _Piece,
        *,
        metadata: dict[str, Any] | None = None,
        state: str = "in_progress",
    ) -> Msg:
        if piece.mode is not None:
            if stream.mode not in (None, piece.mode):
                raise SlackApiFailure("streaming_mode_mismatch")
            stream.mode = piece.mode
        blocks = (msg.blocks or []) + list(piece.blocks)
        new = replace(
            msg,
            text=msg.text + piece.text,
            tasks=_merge_tasks(msg.tasks, piece.tasks),
            blocks=blocks or None,
            metadata=metadata if metadata is not None else msg.metadata,
            streaming_state=state,
        )
        self._store(new)
        now = time.monotonic()
        stream.last_at = now
        stream.shown.append(Shown(now, new.text, state))
        return new

    # -- the agent messaging experience ---------------------------------------------------------------------

    def _set_suggested_prompts(self, params: dict[str, Any]) -> dict[str, Any]:
        """Up to four prompts, each a title and a message, for a DM; with thread_ts an agent_view app's call is
        answered ok and shows nothing, as Slack documents."""
        channel = self._channel_param(params, key="channel_id")
        prompts, title = params.get("prompts"), params.get("title")
        if (
            not isinstance(prompts, list)
            or not 1 <= len(prompts) <= SUGGESTED_PROMPTS_MOST
            or not all(
                isinstance(p, dict) and all(isinstance(p.get(k), str) and p[k] for k in ("title", "message"))
                for p in prompts
            )
            or not (title is None or isinstance(title, str))
        ):
            raise SlackApiFailure("invalid_arguments")
        thread = _str(params, "thread_ts")
        if thread is not None and not self.agent_view and self.message(channel.id, thread) is None:
            raise SlackApiFailure("invalid_thread_ts")
        listed = tuple((str(p["title"]), str(p["message"])) for p in prompts)
        shown = thread is None or not self.agent_view
        self.suggested_prompts.append(SuggestedPrompts(channel.id, thread, title or None, listed, shown))
        return {}

    def _set_title(self, params: dict[str, Any]) -> dict[str, Any]:
        """The title a thread shows in the app's DM history."""
        channel = self._channel_param(params, key="channel_id")
        thread = _require(params, "thread_ts", "invalid_thread_ts")
        if self.message(channel.id, thread) is None:
            raise SlackApiFailure("invalid_thread_ts")
        self.titles[(channel.id, thread)] = _require(params, "title", "invalid_arguments")
        return {}

    def _permalink(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel_param(params)
        msg = self._find(channel.id, _require(params, "message_ts", "message_not_found"))
        link = f"https://{TEAM_DOMAIN}.slack.com/archives/{channel.id}/p{msg.ts.replace('.', '')}"
        if msg.is_reply:
            link += f"?thread_ts={msg.thread_ts}&cid={channel.id}"
        return {"channel": channel.id, "permalink": link}

    def _post_ephemeral(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel_param(params)
        user = _require(params, "user", "user_not_found")
        if user not in self.users:
            raise SlackApiFailure("user_not_in_channel")
        self._check_content(params)
        ts = self._next_ts()
        blocks = params.get("blocks")
        self.ephemerals.append(
            Ephemeral(channel.id, user, _str(params, "text") or "", ts, blocks, _str(params, "thread_ts"))
        )
        return {"message_ts": ts}

    def _reactions_add(self, params: dict[str, Any]) -> dict[str, Any]:
        msg, name = self._reaction_target(params)
        users = msg.reactions.get(name, ())
        if BOT_USER_ID in users:
            raise SlackApiFailure("already_reacted")
        self._store(replace(msg, reactions={**msg.reactions, name: (*users, BOT_USER_ID)}))
        return {}

    def _reactions_remove(self, params: dict[str, Any]) -> dict[str, Any]:
        msg, name = self._reaction_target(params)
        users = msg.reactions.get(name, ())
        if BOT_USER_ID not in users:
            raise SlackApiFailure("no_reaction")
        reactions = {**msg.reactions, name: tuple(u for u in users if u != BOT_USER_ID)}
        self._store(replace(msg, reactions={k: v for k, v in reactions.items() if v}))
        return {}

    def _users_info(self, params: dict[str, Any]) -> dict[str, Any]:
        user = self.users.get(_require(params, "user", "user_not_found"))
        if user is None:
            raise SlackApiFailure("user_not_found")
        asked = str(params.get("include_locale", "")).lower() in ("true", "1")
        return {"user": user.to_api(locale=asked)}

    def _usergroup_users(self, params: dict[str, Any]) -> dict[str, Any]:
        group = self.usergroups.get(_require(params, "usergroup", "no_such_subteam"))
        if group is None:
            raise SlackApiFailure("no_such_subteam")
        return {"users": list(group)}

    def _views_publish(self, params: dict[str, Any]) -> dict[str, Any]:
        """A Home tab view for one user (docs.slack.dev/reference/methods/views.publish): `home` views only, with
        at most 100 blocks, each within Block Kit's limits."""
        user = _require(params, "user_id", "invalid_arguments")
        if user not in self.users:
            raise SlackApiFailure("user_not_found")
        view = params.get("view")
        if not isinstance(view, dict) or view.get("type") != "home":
            raise SlackApiFailure("invalid_arguments")
        blocks = view.get("blocks")
        if (
            not isinstance(blocks, list)
            or len(blocks) > 100
            or block_kit_problem(blocks[:50])
            or (block_kit_problem(blocks[50:]))
        ):
            raise SlackApiFailure("invalid_arguments")
        self.homes[user] = view
        return {"view": {"id": f"V{len(self.homes):08d}", "type": "home", "blocks": blocks}}

    async def app_home_opened(self, user: str) -> DeliveryResult:
        """The `app_home_opened` event of `user` opening the app's Home tab."""
        return await self.deliver_event(
            {
                "type": "app_home_opened",
                "user": user,
                "channel": f"D_{user}",
                "tab": "home",
                "event_ts": self._next_ts(),
            }
        )

    def _views_open(self, params: dict[str, Any]) -> dict[str, Any]:
        """A modal for the user whose interaction handed out `trigger_id` (docs.slack.dev/reference/methods/
        views.open): a trigger opens one view, within 3 seconds; a malformed view is `invalid_arguments`."""
        trigger = _require(params, "trigger_id", "invalid_arguments")
        issued = self._triggers.get(trigger)
        if issued is None:
            raise SlackApiFailure("invalid_trigger_id")
        if trigger in self._exchanged:
            raise SlackApiFailure("exchanged_trigger_id")
        if time.monotonic() - issued[0] > self.trigger_lifetime_s:
            raise SlackApiFailure("expired_trigger_id")
        view = params.get("view")
        if not isinstance(view, dict) or modal_problem(view) is not None:
            raise SlackApiFailure("invalid_arguments")
        self._exchanged.add(trigger)
        modal = Modal(f"V{len(self.modals) + 1:08d}M", issued[1], dict(view))
        self.modals[modal.id] = modal
        return {"view": modal.view | {"id": modal.id, "team_id": TEAM_ID, "app_id": APP_ID, "bot_id": BOT_ID}}

    async def submit_view(
        self, view_id: str, values: Mapping[str, Mapping[str, str | None]] | None = None, *, user: str | None = None
    ) -> DeliveryResult:
        """The ``view_submission`` of modal ``view_id``: ``values`` by block_id and action_id (an input not given
        is left empty, which Slack sends as null). ``user`` other than the modal's plays a forged payload."""
        modal = self.modals[view_id]
        who = modal.user if user is None else user
        given = values or {}
        state = {
            block["block_id"]: {
                block["element"]["action_id"]: {
                    "type": block["element"]["type"],
                    "value": given.get(block["block_id"], {}).get(block["element"]["action_id"]) or None,
                }
            }
            for block in modal.view["blocks"]
            if block.get("type") == "input"
        }
        name = self.users[who].name if who in self.users else who
        payload: dict[str, Any] = {
            "type": "view_submission",
            "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
            "user": {"id": who, "username": name, "name": name, "team_id": self._team_of(who)},
            "api_app_id": APP_ID,
            "token": VERIFICATION_TOKEN,
            "trigger_id": self._new_trigger(who),
            "view": modal.view
            | {"id": modal.id, "team_id": TEAM_ID, "app_id": APP_ID, "bot_id": BOT_ID, "state": {"values": state}},
            "response_urls": [],
            "is_enterprise_install": False,
        }
        return await self._deliver_form(payload, {"payload": json.dumps(payload)})

    def _conversations_info(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"channel": self._channel_param(params).to_api()}

    def _replies(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel_param(params)
        msg = self._find(channel.id, _require(params, "ts", "thread_not_found"), error="thread_not_found")
        with_metadata = _flag(params.get("include_all_metadata"))
        thread = self.thread(channel.id, msg.thread_ts or msg.ts)
        return {"messages": [self._render(m, metadata=with_metadata) for m in thread], "has_more": False}

    def _history(self, params: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel_param(params)
        limit = int(params.get("limit") or 100)
        with_metadata = _flag(params.get("include_all_metadata"))
        top = [m for m in reversed(self.messages(channel.id)) if not m.is_reply]  # newest first, as Slack
        messages = [self._render(m, metadata=with_metadata) for m in top[:limit]]
        return {"messages": messages, "has_more": len(top) > limit}

    # -- Web API helpers -------------------------------------------------------------------------------------

    def _next_ts(self) -> str:
        # Slack timestamps are unique per channel; ours are strictly increasing across the whole emulator.
        self._last_ts_us = max(int(time.time() * 1_000_000), self._last_ts_us + 1)
        return f"{self._last_ts_us // 1_000_000}.{self._last_ts_us % 1_000_000:06d}"

    def _channel(self, key: str) -> Channel:
        channel = self.channels.get(key) or next((c for c in self.channels.values() if c.name == key.lstrip("#")), None)
        if channel is None and key in self.users:  # a user id: the bot's direct message with them, as in Slack
            channel = self.channels.setdefault(f"D{key}", Channel(f"D{key}", key, is_im=True))
        if channel is None:
            raise SlackApiFailure("channel_not_found")
        return channel

    def _channel_param(self, params: Mapping[str, Any], *, key: str = "channel") -> Channel:
        return self._channel(_require(params, key, "channel_not_found"))

    def _store(self, msg: Msg) -> Msg:
        stored = self._messages.setdefault(msg.channel, {})
        if msg.thread_ts is not None and msg.is_reply and msg.ts not in stored:
            self._reply_index.setdefault((msg.channel, msg.thread_ts), []).append(msg.ts)
        stored[msg.ts] = msg
        return msg

    def _find(self, channel: str, ts: str, *, error: str = "message_not_found") -> Msg:
        msg = self.message(channel, ts)
        if msg is None or msg.deleted:
            raise SlackApiFailure(error)
        return msg

    def _own_message(self, params: Mapping[str, Any], key: str, not_mine: str) -> Msg:
        channel = self._channel_param(params)
        msg = self._find(channel.id, _require(params, key, "message_not_found"))
        if msg.bot_id != BOT_ID:
            raise SlackApiFailure(not_mine)
        return msg

    def _check_content(self, params: dict[str, Any]) -> None:
        """Refuse a message Slack would refuse: blocks over Block Kit's limits, text over 40,000 characters."""
        if (problem := block_kit_problem(params.get("blocks"))) is not None:
            self.rejected.append((params, problem))
            raise SlackApiFailure("invalid_blocks")
        if len(_str(params, "text") or "") > MESSAGE_TEXT_LIMIT:
            self.rejected.append((params, "text over 40000 characters"))
            raise SlackApiFailure("msg_too_long")

    def _reaction_target(self, params: Mapping[str, Any]) -> tuple[Msg, str]:
        channel = self._channel_param(params)
        msg = self._find(channel.id, _require(params, "timestamp", "message_not_found"))
        return msg, _require(params, "name", "invalid_name").strip(":")

    def _render(self, msg: Msg, *, metadata: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "message", "ts": msg.ts, "user": msg.user, "text": msg.text, "team": TEAM_ID}
        author = self.users.get(msg.user)
        if author is not None and author.external:  # Slack Connect: the author's own organisation
            out |= {"team": author.team_id, "user_team": author.team_id, "source_team": author.team_id}
        if msg.bot_id is not None:
            out |= {"bot_id": msg.bot_id, "app_id": APP_ID}
        replies = [] if msg.is_reply else self._live_replies(msg.channel, msg.ts)
        if msg.is_reply:
            root = self.message(msg.channel, msg.thread_ts or "")
            out |= {"thread_ts": msg.thread_ts, "parent_user_id": root.user if root else None}
        elif replies:
            out |= {"thread_ts": msg.ts, "reply_count": len(replies), "reply_users": sorted({m.user for m in replies})}
        optional = {"blocks": msg.blocks, "username": msg.username, "files": msg.files}
        out |= {k: v for k, v in optional.items() if v is not None}
        if metadata and msg.metadata is not None:
            out["metadata"] = msg.metadata
        if msg.icon_url or msg.icon_emoji:
            out["icons"] = {"image_48": msg.icon_url} if msg.icon_url else {"emoji": msg.icon_emoji}
        if msg.reactions:
            out["reactions"] = [{"name": n, "users": list(u), "count": len(u)} for n, u in msg.reactions.items()]
        if msg.edited_ts is not None:
            out["edited"] = {"user": msg.user, "ts": msg.edited_ts}
        if msg.streaming_state is not None:
            out["streaming_state"] = msg.streaming_state
        return out

    async def _response_url(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = dict(await request.post())
        body = body if isinstance(body, dict) else {"body": body}
        if (problem := block_kit_problem(body.get("blocks"))) is not None:
            self.rejected.append((body, problem))
            return web.Response(status=400, text="invalid_blocks")
        self.responses.append(body)
        user, channel, source = self._response_urls.get(request.match_info["id"], ("", "", ""))
        self.response_log.append(Response(user, channel, source, body))
        return web.json_response({"ok": True})

    # -- Events API ------------------------------------------------------------------------------------------

    def _event_fields(self, channel: Channel, event_ts: str) -> dict[str, Any]:
        channel_type = "im" if channel.is_im else "channel"
        return {"type": "message", "channel": channel.id, "event_ts": event_ts, "channel_type": channel_type}

    def _echo(self, event: dict[str, Any]) -> None:
        if not self.echo_bot_posts or self.events_url is None:
            return
        task = asyncio.get_running_loop().create_task(self._deliver_quietly(self.event_envelope(event)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver_quietly(self, payload: dict[str, Any]) -> None:
        try:
            await self.deliver(payload)
        except (aiohttp.ClientError, TimeoutError) as exc:  # the bot is down: record it, as Slack would retry
            self.deliveries.append(Delivery(payload, None, repr(exc)))

    def event_envelope(self, event: dict[str, Any], *, event_id: str | None = None) -> dict[str, Any]:
        channel = self.channels.get(str(event.get("channel")))
        return {
            "token": VERIFICATION_TOKEN,
            "team_id": TEAM_ID,
            "api_app_id": APP_ID,
            "event": event,
            "type": "event_callback",
            "event_id": event_id or f"Ev{secrets.token_hex(6).upper()}",
            "event_time": int(time.time()),
            "authorizations": [{"team_id": TEAM_ID, "user_id": BOT_USER_ID, "is_bot": True}],
            # Slack says on every event whether its channel is shared with another organisation (Slack Connect).
            "is_ext_shared_channel": channel is not None and channel.is_ext_shared,
        }

    async def deliver(
        self,
        payload: dict[str, Any],
        *,
        retry_num: int | None = None,
        retry_reason: str | None = None,
        signature: str | None = None,
        timestamp: int | None = None,
        raw_body: bytes | None = None,
        content_type: str = "application/json",
    ) -> DeliveryResult:
        """POST ``payload`` (or ``raw_body``) to ``events_url``, signed unless ``signature`` is given."""
        if self.events_url is None:
            raise RuntimeError("SlackEmulator.events_url is not set")
        if self._session is None:
            raise RuntimeError("SlackEmulator is not started")
        body = raw_body if raw_body is not None else json.dumps(payload).encode()
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        if signature is None:
            signature = self._verifier.generate_signature(timestamp=stamp, body=body) or ""
        headers = {"Content-Type": content_type, "X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": signature}
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
        if retry_reason is not None:
            headers["X-Slack-Retry-Reason"] = retry_reason
        started = time.monotonic()
        async with self._session.post(self.events_url, data=body, headers=headers) as response:
            text = await response.text()
            result = DeliveryResult(response.status, text, dict(response.headers), time.monotonic() - started)
        self.deliveries.append(Delivery(payload, result, body=body, content_type=content_type))
        return result

    async def redeliver(self, delivery: Delivery) -> DeliveryResult:
        """The same request body again, freshly signed: a replay, as anyone who saw the request could send it
        within the signature's 5 minutes."""
        return await self.deliver(delivery.payload, raw_body=delivery.body, content_type=delivery.content_type)

    async def deliver_event(self, event: dict[str, Any], **kw: Any) -> DeliveryResult:
        return await self.deliver(self.event_envelope(event), **kw)

    def message_event(self, msg: Msg) -> dict[str, Any]:
        """The envelope of the ``message`` event Slack sends for a stored human message (``add_message``)."""
        event = self._render(msg) | self._event_fields(self.channels[msg.channel], msg.ts)
        if msg.files:
            event["subtype"] = "file_share"
        return self.event_envelope(event)

    async def user_says(
        self,
        channel: str,
        text: str,
        *,
        user: str = "U_CUSTOMER",
        thread_ts: str | None = None,
        files: list[dict[str, Any]] | None = None,
        mention: bool = False,
    ) -> Said:
        """A human posts: store the message, deliver ``message`` (and ``app_mention`` when the bot is mentioned)."""
        msg = self._store(Msg(self._channel(channel).id, self._next_ts(), user, text, thread_ts=thread_ts, files=files))
        envelope = self.message_event(msg)
        event = envelope["event"]
        said = Said(msg.ts, envelope["event_id"], await self.deliver(envelope))
        if mention or f"<@{BOT_USER_ID}>" in text:
            keep = ("user", "text", "ts", "channel", "event_ts", "team", "thread_ts", "files", "blocks")
            mention_envelope = self.event_envelope({"type": "app_mention"} | {k: event[k] for k in keep if k in event})
            mention_result = await self.deliver(mention_envelope)
            said = replace(said, mention_event_id=mention_envelope["event_id"], mention_result=mention_result)
        return said

    def _team_of(self, user: str) -> str:
        known = self.users.get(user)
        return TEAM_ID if known is None else known.team_id

    def _new_trigger(self, user: str) -> str:
        trigger = f"{secrets.randbelow(10**10)}.{secrets.token_hex(8)}"
        self._triggers[trigger] = (time.monotonic(), user)
        return trigger

    def _new_response_url(self, user: str, channel: str, source: str) -> str:
        url_id = str(next(self._response_ids))
        self._response_urls[url_id] = (user, channel, source)
        return f"{self.url}/response_url/{url_id}"

    async def _deliver_form(self, payload: dict[str, Any], form: dict[str, str]) -> DeliveryResult:
        content_type = "application/x-www-form-urlencoded"
        return await self.deliver(payload, raw_body=urlencode(form).encode(), content_type=content_type)

    async def slash_command(
        self, command: str, text: str, *, user: str = "U_STAFF", channel: str = "C_STAFF"
    ) -> DeliveryResult:
        chan = self._channel(channel)
        form = {
            "token": VERIFICATION_TOKEN,
            "team_id": TEAM_ID,
            "team_domain": TEAM_DOMAIN,
            "channel_id": chan.id,
            "channel_name": chan.name,
            "user_id": user,
            "user_name": self.users[user].name if user in self.users else user,
            "command": command,
            "text": text,
            "api_app_id": APP_ID,
            "response_url": self._new_response_url(user, chan.id, command),
            "trigger_id": self._new_trigger(user),
        }
        return await self._deliver_form(dict(form), form)

    async def click(
        self,
        action_id: str,
        value: str,
        *,
        message_ts: str,
        channel: str = "C_STAFF",
        user: str = "U_STAFF",
        block_id: str = "b",
        element: str = "button",
    ) -> DeliveryResult:
        """A ``block_actions`` interactivity payload for a click on message ``message_ts``: a button, or with
        `element="feedback_buttons"` one of a feedback pair (its value is the pressed button's)."""
        chan = self._channel(channel)
        name = self.users[user].name if user in self.users else user
        msg = self.message(chan.id, message_ts)
        action = {"type": element, "action_id": action_id, "block_id": block_id, "value": value}
        payload: dict[str, Any] = {
            "type": "block_actions",
            "user": {"id": user, "username": name, "name": name, "team_id": self._team_of(user)},
            "api_app_id": APP_ID,
            "token": VERIFICATION_TOKEN,
            "container": {"type": "message", "message_ts": message_ts, "channel_id": chan.id, "is_ephemeral": False},
            "trigger_id": self._new_trigger(user),
            "team": {"id": TEAM_ID, "domain": TEAM_DOMAIN},
            "channel": {"id": chan.id, "name": chan.name},
            "message": self._render(msg) if msg is not None else {"type": "message", "ts": message_ts},
            "response_url": self._new_response_url(user, chan.id, action_id),
            "actions": [action | {"action_ts": self._next_ts()}],
        }
        return await self._deliver_form(payload, {"payload": json.dumps(payload)})

    async def url_verification(self, challenge: str) -> DeliveryResult:
        return await self.deliver({"token": VERIFICATION_TOKEN, "challenge": challenge, "type": "url_verification"})
