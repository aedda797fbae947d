"""`POST /api/messages`: Teams' activities, authenticated as the Microsoft 365 Agents SDK does it, stored (or
recognised as a redelivery) before Teams gets its answer, and acted on afterwards by the same workers, desk and
admin commands as Slack's events.

Authentication: the SDK's `JwtTokenValidator` checks the token's signature against the issuer's published keys,
its expiry and its audience (our app id). On top of it, as the Bot Framework's rules require and the SDK does not:
the issuer must be the Bot Framework's (Teams' channel tokens are; an Entra token of our own tenant, which any app
registered there can get for our app id, is not a channel's word about who wrote), its `serviceurl` claim must be
the activity's `serviceUrl` (where the bot will send its own credentials when it answers), and the activity must
come from the Teams channel (`channelId` "msteams", not Web Chat or Direct Line, whose users write what they like
in `from` and `channelData`). The token is checked before the body is read: a stranger's body is never parsed.

Identity: the Bot Connector's conversation member says who wrote (`TeamsMembers.writer`); intake
(`bot.channels.intake`) keeps their email (or UPN) only when our tenant or a listed customer organisation
(CUSTOMER_ORGANISATIONS) holds the account, since another tenant's admins write their members' emails as they like.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web
from microsoft_agents.activity import Activity
from microsoft_agents.hosting.core.authorization import AgentAuthConfiguration, JwtTokenValidator
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.address import is_teams_id
from bot.admin.command import AdminCommands, Invocation
from bot.channels.incoming import ACK_WITHIN_S, CaseAction, CustomerMessage, sanitised
from bot.channels.intake import Intake, Writer
from bot.channels.messenger import Where
from bot.feedback import Feedback, FeedbackClick
from bot.staff import Member
from bot.teams.events import AdminMessage, Parsed, TeamsPolicy, parse
from bot.teams.messenger import BOT_FRAMEWORK, ServiceUrls, TeamsMessenger
from escalation.views import Message, Person

log = logging.getLogger(__name__)
TEAMS_CHANNEL = "msteams"
MAX_CACHED = 10_000
MAX_BODY = 256 * 1024
"""Teams' activities are far smaller (a message is at most about 28 KB); anything bigger is refused unread."""


class Unauthorized(Exception):
    pass


class TeamsAuth:
    def __init__(self, *, app_id: str, tenant: str) -> None:
        self.config = AgentAuthConfiguration(client_id=app_id, tenant_id=tenant)
        self.validator = JwtTokenValidator(self.config)

    async def check(self, header: str | None) -> Mapping[str, Any]:
        """The token's claims; Unauthorized (with why) for a missing, forged, expired or misaddressed token, or
        one that is not the Bot Framework's."""
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("no bearer token")
        try:
            identity = await self.validator.validate_token(token.strip())
        except Exception as exc:  # PyJWT's errors, the SDK's ValueError, a key set that cannot be read
            raise Unauthorized(f"{type(exc).__name__}: {exc}") from None
        claims: Mapping[str, Any] = identity.claims
        if claims.get("iss") != BOT_FRAMEWORK:
            raise Unauthorized(f"issuer {claims.get('iss')!r} is not the Bot Framework")
        return claims

    @staticmethod
    def check_activity(claims: Mapping[str, Any], activity: Mapping[str, Any]) -> None:
        """Unauthorized unless the token was issued for this activity's service and it comes from Teams."""
        service_url = activity.get("serviceUrl")
        if not service_url or claims.get("serviceurl") != service_url:
            raise Unauthorized("the activity's serviceUrl is not the token's")
        if activity.get("channelId") != TEAMS_CHANNEL:
            raise Unauthorized(f"channel {activity.get('channelId')!r} is not Teams")


class TeamsPeople:
    """Teams' directory for intake and the staff gate: a conversation's member (name, email, tenant, whether a
    guest), briefly cached. Reads only. `tenant`: ours."""

    def __init__(self, messenger: TeamsMessenger, *, tenant: str, cache_s: float = 300.0) -> None:
        self.messenger = messenger
        self.tenant = tenant
        self.cache_s = cache_s
        self._members: dict[tuple[str, str], tuple[float, Mapping[str, Any] | None]] = {}

    async def lookup(self, conversation: str, user: str) -> Mapping[str, Any] | None:
        cached = self._members.get((conversation, user))
        if cached is not None and time.monotonic() - cached[0] < self.cache_s:
            return cached[1]
        client = await self.messenger.client(conversation)
        try:
            found = await client.conversations.get_conversation_member(conversation, user)
            member: Mapping[str, Any] | None = found.model_dump(by_alias=True, exclude_none=True)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise
            member = None
        if len(self._members) >= MAX_CACHED:  # one entry per customer and chat: never a growing heap
            self._members.clear()
        self._members[(conversation, user)] = (time.monotonic(), member)
        return member

    def in_conversation(self, conversation: str) -> TeamsMembers:
        return TeamsMembers(self, conversation)


@dataclass
class TeamsMembers:
    """One conversation's members: `bot.staff.Members` for the staff channel, where colleagues write, and
    `bot.channels.intake.Writers` for the conversation an activity came from."""

    people: TeamsPeople
    conversation: str

    async def writer(self, message: CustomerMessage) -> Writer | None:
        found = await self.people.lookup(self.conversation, message.user)
        if found is None:
            return None
        # The Bot Connector says which tenant holds the account (the activity may name only the conversation's).
        tenant = found.get("tenantId")
        email = found.get("email") or found.get("userPrincipalName")
        author = message.author
        named = replace(
            author, workspace=tenant or author.workspace, name=found.get("name") or author.name, email=email or None
        )
        return Writer(named, organisation=tenant, ours=self.people.tenant)

    async def member(self, user: str) -> Member | None:
        found = await self.people.lookup(self.conversation, user)
        if found is None or not found.get("tenantId"):  # who cannot say where they are from is nobody's staff
            return None
        guest = str(found.get("userRole") or "").lower() in ("guest", "anonymous")
        return Member(user, found.get("tenantId"), guest=guest, stranger=False, admin=False)

    async def usergroup(self, group: str) -> frozenset[str]:
        return frozenset()  # Teams has no Slack user groups: STAFF_USER_IDS lists Teams colleagues


class TeamsDirectory:
    """Names and links for what escalation renders about Teams people: the name their last message carried
    (Teams sends it with each activity, and intake stores it), and Teams' deep link to a channel message."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def person(self, user: str) -> Person:
        async with self.sessions() as s:
            name = await s.scalar(
                text(
                    "SELECT identity->>'name' FROM inbound WHERE author = :u AND identity->>'name' IS NOT NULL "
                    "ORDER BY id DESC LIMIT 1"
                ),
                {"u": user},
            )
        return Person(str(name) if name else user)

    def owns(self, value: str) -> bool:
        return is_teams_id(value)

    async def permalink(self, channel: str, message: str) -> str | None:
        if not channel.startswith("19:") or not message:
            return None
        return f"https://teams.microsoft.com/l/message/{channel}/{message}"


class TeamsPresser:
    """The colleague who pressed a case card's button, as Teams answers them: the activity's answer is Teams' own,
    and words for them alone come as a direct message."""

    def __init__(self, messenger: TeamsMessenger, user: str) -> None:
        self.messenger, self.user = messenger, user

    async def answer(self, *, held: bool) -> None:
        pass  # the edge's HTTP answer is the acknowledgement

    async def tell(self, words: str) -> None:
        try:
            await self.messenger.direct(self.user, words)
        except Exception:
            log.warning("could not tell %s: %s", self.user, words, exc_info=True)


class TeamsEdge:
    def __init__(
        self,
        *,
        policy: TeamsPolicy,
        auth: TeamsAuth,
        intake: Intake,
        urls: ServiceUrls,
        messenger: TeamsMessenger,
        people: TeamsPeople,
        admin: AdminCommands | None,
        feedback: Feedback | None = None,
    ) -> None:
        self.policy = policy
        self.auth = auth
        self.intake = intake
        self.urls = urls
        self.messenger = messenger
        self.people = people
        self.admin = admin
        self.feedback = feedback
        """Records Teams' 👍/👎 on answers (None: not recorded)."""
        self._tasks: set[asyncio.Task[None]] = set()

    async def handle(self, request: web.Request) -> web.Response:
        header = request.headers.get("Authorization")
        if not header:
            return web.json_response({"error": "Authorization header not found"}, status=401)
        if (request.content_length or 0) > MAX_BODY:
            return web.json_response({"error": "too large"}, status=413)
        try:
            # The token alone first: a stranger's body is neither read nor parsed.
            claims = await self.auth.check(header)
        except Unauthorized as exc:
            return _refused(exc)
        try:
            body = sanitised(json.loads(await request.read()))
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: JSON nested too deep
            body = None
        if not isinstance(body, dict):
            return web.json_response({"error": "malformed body"}, status=400)
        try:
            self.auth.check_activity(claims, body)  # the token's serviceurl is compared with the body's
        except Unauthorized as exc:
            return _refused(exc)
        try:
            Activity.model_validate(body)
        except ValidationError as exc:
            return web.json_response({"error": f"not an activity: {exc.error_count()} problems"}, status=400)
        parsed = parse(body, self.policy)
        try:
            disposition = await self._store(parsed)
        except Exception:
            log.exception("could not store Teams activity %s; answering 503", parsed.delivery.event_id)
            return web.json_response({"error": "unavailable"}, status=503)
        log.debug("Teams activity %s: %s", parsed.delivery.event_id, disposition)
        return web.json_response({}, status=200)

    async def _store(self, parsed: Parsed) -> str:
        if parsed.service_url:
            await self.urls.remember(parsed.conversation, parsed.tenant, parsed.service_url)
        incoming, delivery = parsed.incoming, parsed.delivery
        match incoming:
            case CaseAction():
                if await self.intake.first_request(delivery):
                    # Usually done before Teams gets its answer, as Slack's buttons are; a running turn of the
                    # conversation can hold it longer, and then it finishes afterwards.
                    presser = TeamsPresser(self.messenger, incoming.user)
                    acting = self.intake.act(incoming, ours=self.policy.tenant, presser=presser)
                    await asyncio.wait({self._later(acting)}, timeout=ACK_WITHIN_S)
                return "case action"
            case FeedbackClick():
                if self.feedback is not None and await self.intake.first_request(delivery):
                    self._later(self._rated(self.feedback, incoming))
                return "feedback"
            case AdminMessage():
                if await self.intake.first_request(delivery):
                    self._later(self._admin(incoming, parsed))
                return "admin command"
            case _:
                writers = self.people.in_conversation(parsed.conversation)
                return await self.intake.accept(
                    delivery, incoming, writers=writers, ours=self.policy.tenant, continues_only=parsed.continues_only
                )

    def _later(self, work: Awaitable[None]) -> asyncio.Task[None]:
        """Acted on after Teams' answer, as Slack's buttons and commands are; kept referenced until done."""

        async def run() -> None:
            try:
                await work
            except Exception:
                log.exception("a Teams action failed")

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @staticmethod
    async def _rated(feedback: Feedback, click: FeedbackClick) -> None:
        await feedback.record(click)

    async def _admin(self, message: AdminMessage, parsed: Parsed) -> None:
        if self.admin is None:
            return
        # An Entra object id names an admin only in our own tenant; anyone else is named by their Teams id.
        ours = parsed.tenant == self.policy.tenant
        who = message.aad_object_id if ours and message.aad_object_id else message.user
        call = Invocation(who, message.conversation, self.policy.tenant, None, message.text)
        reply = await self.admin.run(call)
        answer = Message(reply.text, blocks=reply.blocks)
        await self.messenger.post(Where(message.conversation, None), answer, outbox_id=0)


def _refused(exc: Unauthorized) -> web.Response:
    log.warning("Teams activity refused: %s", exc)
    return web.json_response({"error": "unauthorized"}, status=401)
