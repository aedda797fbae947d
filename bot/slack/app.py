"""The Bolt app: Bolt verifies signatures (5-minute window), answers url_verification and drops the bot's
own events; one middleware then stores each event in the durable inbox and acknowledges it."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

import aiohttp
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from agents.identity import Author
from bot.channels.incoming import ACK_WITHIN_S, CASE_ACTIONS, CaseAction
from bot.channels.intake import Inbox
from bot.csat import ACTION_PREFIX as CSAT_PREFIX
from bot.csat import (
    COMMENT_BLOCK,
    COMMENT_CALLBACK,
    COMMENT_NOT_YOURS,
    NOT_YOURS,
    Csat,
    comment_modal,
    csat_click_of,
    csat_comment_of,
)
from bot.feedback import ACTION_FEEDBACK, Feedback, feedback_click_of
from bot.slack.events import case_action_of, trigger_of
from bot.slack.home import Home
from bot.staff import ACTION_REFUSED, Member, StaffGate, Standing, refusal
from escalation.desk import ActionResult, CaseDesk
from escalation.views import Person

log = logging.getLogger(__name__)


def slack_client(*, token: str, base_url: str, timeout_s: int = 30, idempotent_only: bool = False) -> AsyncWebClient:
    """A Web API client that waits out 429s (Retry-After) and retries connection errors and 5xx. Unless
    `idempotent_only`: the outbox sender's client retries nothing, since a post retried blindly can land twice,
    and a call waiting out a 429 inside the client could outlive the sender's lease (the sender retries, after
    looking for the post where it would be, and waits out 429s itself)."""
    handlers: list[AsyncRetryHandler] = []
    if not idempotent_only:
        handlers += [
            AsyncRateLimitErrorRetryHandler(max_retry_count=3),
            AsyncConnectionErrorRetryHandler(max_retry_count=3),
            AsyncServerErrorRetryHandler(max_retry_count=2),
        ]
    return AsyncWebClient(
        token=token,
        base_url=base_url if base_url.endswith("/") else base_url + "/",
        timeout=timeout_s,
        retry_handlers=handlers,
    )


class SlackDirectory:
    """People, user groups and links as Slack has them: for what escalation renders (`escalation.render.Directory`),
    the authors the inbox stores (`bot.channels.intake.People`) and who counts as staff or admin
    (`bot.staff.Members`). Reads
    only, so the client may retry. Answers are
    cached briefly: a guest made a full member, or someone removed from the staff group, counts as such within
    `cache_s`."""

    def __init__(self, client: AsyncWebClient, *, cache_s: float = 300.0) -> None:
        self.client = client
        self.cache_s = cache_s
        self._users: dict[str, tuple[float, Mapping[str, Any]]] = {}
        self._groups: dict[str, tuple[float, frozenset[str]]] = {}

    async def _user(self, user: str) -> Mapping[str, Any] | None:
        """users.info's user, or None when Slack refuses (user_not_found); a failure to reach Slack raises."""
        cached = self._users.get(user)
        if cached is not None and time.monotonic() - cached[0] < self.cache_s:
            return cached[1]
        try:
            found: Mapping[str, Any] = (await self.client.users_info(user=user))["user"]
        except SlackApiError as exc:
            log.warning("users.info %s: %s", user, exc.response.get("error"))
            return None
        self._users[user] = (time.monotonic(), found)
        return found

    async def person(self, user: str) -> Person:
        profile = await self._user(user)
        if profile is None:
            return Person(user)
        details = profile.get("profile") or {}
        return Person(_name_of(profile) or user, details.get("image_192") or details.get("image_72"))

    async def identify(self, author: Author) -> Author:
        try:
            profile = await self._user(author.user)
        except Exception:  # Slack unreachable: stored with the signed ids alone
            return author
        if profile is None:
            return author
        # The email is in the profile only with the users:read.email scope, and not for every external user; it
        # counts once Slack says its owner confirmed it (whose organisation vouches for it is the inbox's call).
        email = (profile.get("profile") or {}).get("email") if profile.get("is_email_confirmed") else None
        return replace(author, name=_name_of(profile), email=str(email) if email else None)

    async def member(self, user: str) -> Member | None:
        found = await self._user(user)
        if found is None:
            return None
        flag = {key: bool(found.get(key)) for key in _MEMBER_FLAGS}
        return Member(
            user,
            found.get("team_id"),
            guest=flag["is_restricted"] or flag["is_ultra_restricted"],
            stranger=flag["is_stranger"],
            admin=flag["is_admin"] or flag["is_owner"] or flag["is_primary_owner"],
        )

    async def usergroup(self, group: str) -> frozenset[str]:
        """The group's members; empty when Slack refuses (a wrong id, a missing scope), so nobody passes."""
        cached = self._groups.get(group)
        if cached is not None and time.monotonic() - cached[0] < USERGROUP_CACHE_S:
            return cached[1]
        try:
            members = frozenset((await self.client.usergroups_users_list(usergroup=group))["users"] or ())
        except SlackApiError as exc:
            log.error("usergroups.users.list %s failed (%s): nobody counts as staff", group, exc.response.get("error"))
            return frozenset()
        self._groups[group] = (time.monotonic(), members)
        return members

    async def permalink(self, channel: str, message: str) -> str | None:
        try:
            found = await self.client.chat_getPermalink(channel=channel, message_ts=message)
        except SlackApiError:
            return None
        return str(found["permalink"])


def _name_of(profile: Mapping[str, Any]) -> str | None:
    details = profile.get("profile") or {}
    name = details.get("real_name") or profile.get("real_name") or details.get("display_name")
    return str(name) if name else None


_MEMBER_FLAGS = ("is_restricted", "is_ultra_restricted", "is_stranger", "is_admin", "is_owner", "is_primary_owner")
USERGROUP_CACHE_S = 60.0
DIRECT_EVENTS = frozenset({"app_home_opened"})
"""Events answered by a listener at once, not stored in the durable inbox: a view to refresh, nothing to lose."""


class SlackUnavailable(Exception):
    """Slack did not say who the bot is (auth.test failed)."""


class Authorisation:
    """The bot's identity (auth.test), asked for once and kept, for bolt's `authorize`. Bolt's own single-workspace
    authorisation asks on requests until Slack answers, and when Slack fails it acknowledges the request with a 200
    and an error text: Slack never sends that event again, and the customer's message is lost. Raised from here
    (not as a SlackApiError, which bolt would catch) the failure makes bolt answer 500, and Slack retries."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self._result: AuthorizeResult | None = None

    async def warm(self) -> None:
        """Ask now, at start-up, so that a Slack outage later does not hold requests up; a failure is only
        logged (the first request asks again)."""
        try:
            await self.result()
        except SlackUnavailable as exc:
            log.warning("%s; asked again on the first request", exc)

    async def result(self) -> AuthorizeResult:
        if self._result is None:
            try:
                response = await self.client.auth_test()
            except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
                raise SlackUnavailable(f"Slack's auth.test failed ({type(exc).__name__}: {exc})") from exc
            self._result = AuthorizeResult.from_auth_test_response(
                bot_token=self.client.token, auth_test_response=response
            )
        return self._result


def build_app(
    *,
    client: AsyncWebClient,
    authorisation: Authorisation,
    signing_secret: str,
    inbox: Inbox,
    desk: CaseDesk,
    staff: StaffGate,
    feedback: Feedback | None = None,
    csat: Csat | None = None,
    home: Home | None = None,
) -> AsyncApp:

    async def authorize() -> AuthorizeResult:  # bolt passes the arguments a function names: none here
        return await authorisation.result()

    # Bolt's own client carries no token: each request's comes from `authorize` (given both, bolt warns).
    bolt_client = AsyncWebClient(
        base_url=client.base_url, timeout=client.timeout, retry_handlers=list(client.retry_handlers)
    )
    app = AsyncApp(client=bolt_client, signing_secret=signing_secret, authorize=authorize)

    async def act(action: CaseAction) -> ActionResult:
        try:
            standing = await staff.standing(action.user, team=action.team, user_team=action.user_team)
        except Exception:
            log.warning("could not check whether %s is staff", action.user, exc_info=True)
            return ActionResult(False, "Slack did not say whether you are on the support team; please try again.")
        if standing != Standing.STAFF:
            log.warning("case action %s by %s refused: %s", action.action_id, action.user, standing)
            return ActionResult(False, refusal(standing, doing=ACTION_REFUSED))
        return await desk.act(
            escalation_id=action.escalation_id,
            action=CASE_ACTIONS[action.action_id],
            user=action.user,
            channel=action.channel,
        )

    @app.action(re.compile("^case_"))
    async def case_button(ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
        action = case_action_of(body)
        if action is None or action.action_id not in CASE_ACTIONS:
            await ack()
            return
        # Usually the change is made before the ack, and Slack shows the button as handled. It waits for a running
        # turn of the conversation (its lease), which may take longer than Slack's 3 s: then the ack goes first
        # and the case message is updated through the outbox once the change is made.
        change = asyncio.create_task(act(action))
        done, _ = await asyncio.wait({change}, timeout=ACK_WITHIN_S)
        await ack()
        if not done:
            await respond(
                text="The bot is finishing a reply in that conversation; your action follows as soon as it is done.",
                response_type="ephemeral",
                replace_original=False,
            )
        try:
            result = await change
        except Exception:
            log.exception("case action failed")
            result = ActionResult(False, "That did not work (the conversation stayed busy); please try again.")
        if not result.ok:
            await respond(text=result.message, response_type="ephemeral", replace_original=False)

    @app.action(ACTION_FEEDBACK)
    async def answer_feedback(ack: AsyncAck, body: dict[str, Any]) -> None:
        await ack()  # Slack marks the button pressed itself: nothing to answer
        click = feedback_click_of(body)
        if click is None or feedback is None:
            return
        try:
            await feedback.record(click)
        except Exception:
            log.exception("could not record feedback on %s %s", click.channel, click.message_ts)

    @app.action(re.compile(f"^{CSAT_PREFIX}"))
    async def csat_rating(ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond, client: AsyncWebClient) -> None:
        await ack()
        click = csat_click_of(body)
        if click is None or csat is None:
            return
        try:
            rated = await csat.rate(click)
        except Exception:
            log.exception("could not record the rating of case %s", click.escalation_id)
            rated = None
        if not rated:
            answer = NOT_YOURS if rated is False else "Your rating could not be saved just now; please try again."
            await respond(text=answer, response_type="ephemeral", replace_original=False)
            return
        # The rating is stored before the modal is asked for: a modal Slack will not open (the trigger_id used or
        # past its 3 seconds) costs only the comment, and the customer is thanked in the thread instead.
        try:
            await client.views_open(trigger_id=click.trigger, view=comment_modal(click.escalation_id))
        except Exception:
            log.warning("could not open the CSAT comment modal of case %s", click.escalation_id, exc_info=True)
            await respond(text=csat.policy.thanks, response_type="ephemeral", replace_original=False)

    @app.view(COMMENT_CALLBACK)
    async def csat_comment(ack: AsyncAck, body: dict[str, Any]) -> None:
        """Stored before the ack (Slack waits 3 seconds for it), so that a refusal shows in the modal."""
        comment = csat_comment_of(body)
        if comment is None or csat is None:
            await ack()  # left empty: nothing to store, the modal closes
            return
        try:
            problem = None if await csat.comment(comment) else COMMENT_NOT_YOURS
        except Exception:
            log.exception("could not store the comment on case %s", comment.escalation_id)
            problem = "Your comment could not be saved just now; please try again."
        if problem is None:
            await ack()
        else:
            log.warning("CSAT comment on case %s by %s not stored: %s", comment.escalation_id, comment.user, problem)
            await ack(response_action="errors", errors={COMMENT_BLOCK: problem})

    @app.event("app_home_opened")
    async def home_opened(event: dict[str, Any], body: dict[str, Any]) -> None:
        user = event.get("user")
        if home is None or event.get("tab", "home") != "home" or not user:
            return
        try:
            await home.publish(str(user), team=body.get("team_id"))
        except Exception:
            log.exception("could not publish the App Home of %s", user)

    @app.middleware
    async def once_per_trigger(
        req: AsyncBoltRequest, resp: BoltResponse, next: Callable[[], Awaitable[BoltResponse]]
    ) -> BoltResponse:
        """A slash command or click is acted on once: the same request again (a replay within the signature's
        5 minutes, or a retry) is acknowledged and dropped."""
        trigger = trigger_of(req.body)
        if trigger is None:
            return await next()
        try:
            first = await inbox.first_request(trigger)
        except Exception:
            log.exception("could not record %s; answering 503", trigger.event_id)
            return BoltResponse(status=503, body="unavailable")
        if not first:
            log.warning("%s %s seen before: acknowledged, not acted on", trigger.event_type, trigger.event_id)
            return BoltResponse(status=200, body="")
        return await next()

    @app.middleware
    async def durable_inbox(
        req: AsyncBoltRequest, resp: BoltResponse, next: Callable[[], Awaitable[BoltResponse]]
    ) -> BoltResponse:
        if req.body.get("type") != "event_callback" or (req.body.get("event") or {}).get("type") in DIRECT_EVENTS:
            return await next()
        try:
            await inbox.accept(req.body, bot_user_id=req.context.bot_user_id)
        except Exception:
            log.exception("could not store event %s; answering 503 so Slack retries", req.body.get("event_id"))
            return BoltResponse(status=503, body="inbox unavailable")
        return BoltResponse(status=200, body="")

    return app
