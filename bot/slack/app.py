"""The Bolt app: Bolt verifies signatures (5-minute window), answers url_verification and drops the bot's
own events; one middleware then classifies each event (`bot.slack.events`), hands it to intake
(`bot.channels.intake`), which stores it, and acknowledges it."""

from __future__ import annotations

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
from slack_bolt.logger.messages import warning_client_prioritized_and_token_skipped
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

from agents.texts import Text
from bot.channels.incoming import CustomerMessage, sanitised
from bot.channels.intake import Intake, Writer
from bot.csat import ACTION_PREFIX as CSAT_PREFIX
from bot.csat import (
    COMMENT_BLOCK,
    COMMENT_CALLBACK,
    Csat,
    comment_modal,
    csat_click_of,
    csat_comment_of,
)
from bot.feedback import ACTION_FEEDBACK, Feedback, feedback_click_of
from bot.slack.agent_view import AgentView
from bot.slack.events import Policy, case_action_of, classify, delivery_of, trigger_of
from bot.slack.home import Home
from bot.staff import Member, Standing
from escalation.views import Person

log = logging.getLogger(__name__)


def slack_client(
    *,
    token: str,
    base_url: str,
    timeout_s: int = 30,
    idempotent_only: bool = False,
    session: aiohttp.ClientSession | None = None,
) -> AsyncWebClient:
    """A Web API client that waits out 429s (Retry-After) and retries connection errors and 5xx. `session`: the
    process's connections to Slack (`slack_session`); without one, slack_sdk opens a connection per call. Unless
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
        session=session,
    )


SLACK_CONNECTIONS = 64
"""Connections to Slack's Web API a process keeps at most (`slack_session`)."""


def slack_session(*, timeout_s: int = 30) -> aiohttp.ClientSession:
    """Kept-alive connections to Slack's Web API, shared by every client of the process: without it each call
    opened and closed a session and a TCP (and TLS) connection of its own. slack_sdk applies no timeout of its own
    to a session it is given, so the session carries it: on connecting and on each read, not on the whole call,
    which would count the wait for a free connection (a burst's status lines queue behind its posts). At most
    `SLACK_CONNECTIONS` at once: a burst of new customers looked each up (users.info) on a connection of its own,
    a TCP and TLS handshake apiece, where a few dozen kept-alive ones carry more calls than Slack's rate limits
    allow."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
    return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=SLACK_CONNECTIONS))


class SlackDirectory:
    """People, user groups and links as Slack has them: for what escalation renders (`escalation.render.Directory`,
    through `bot.channels.directories`), who wrote a customer's message (`bot.channels.intake.Writers`) and who
    counts as staff or admin (`bot.staff.Members`). Reads only, so the client may retry. Answers are cached briefly:
    a guest made a full member, or someone removed from the staff group, counts as such within `cache_s`."""

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
            # The locale comes with the call made anyway: a customer's first short "hi" is answered in their language.
            found: Mapping[str, Any] = (await self.client.users_info(user=user, include_locale=True))["user"]
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

    async def writer(self, message: CustomerMessage) -> Writer | None:
        """The profile's email counts only when Slack says its owner confirmed it (`is_email_confirmed`, which the
        writer's own workspace sets); it is in the profile only with the users:read.email scope, and not for every
        external user. The organisation that vouches for it is the writer's as staff detection decides it: our
        workspace unless Slack shows them as external, since a Slack Connect user's profile is their
        organisation's to write."""
        found = await self._user(message.user)
        if found is None:
            return None
        member = _member_of(message.user, found)
        email = (found.get("profile") or {}).get("email") if found.get("is_email_confirmed") else None
        locale = found.get("locale")
        author = replace(
            message.author, name=_name_of(found), email=str(email) if email else None, locale=locale and str(locale)
        )
        organisation = member.team if member.outsider(message.team) == Standing.EXTERNAL else message.team
        return Writer(author, organisation=organisation, ours=message.team, member=member)

    async def member(self, user: str) -> Member | None:
        found = await self._user(user)
        return None if found is None else _member_of(user, found)

    async def locale(self, user: str) -> str | None:
        """The person's Slack locale ("de-DE"), from the users.info answer staff detection asked for (cached)."""
        found = await self._user(user)
        return str(found["locale"]) if found is not None and found.get("locale") else None

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

    def owns(self, value: str) -> bool:
        """Slack's ids (`U…`, `C…`, `T…`) never hold a colon."""
        return ":" not in value

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


def _member_of(user: str, found: Mapping[str, Any]) -> Member:
    flag = {key: bool(found.get(key)) for key in _MEMBER_FLAGS}
    return Member(
        user,
        found.get("team_id"),
        guest=flag["is_restricted"] or flag["is_ultra_restricted"],
        stranger=flag["is_stranger"],
        admin=flag["is_admin"] or flag["is_owner"] or flag["is_primary_owner"],
    )


_MEMBER_FLAGS = ("is_restricted", "is_ultra_restricted", "is_stranger", "is_admin", "is_owner", "is_primary_owner")
USERGROUP_CACHE_S = 60.0
DIRECT_EVENTS = frozenset({"app_home_opened", "assistant_thread_started"})
"""Events answered by a listener at once, not stored in the durable inbox: a view to refresh or prompts to offer,
nothing to lose."""


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

    @property
    def known(self) -> AuthorizeResult | None:
        """The identity once Slack has said it, without asking."""
        return self._result

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


class SlackPresser:
    """The colleague who pressed a case button, as Slack answers them: the ack, then words for them alone
    (ephemeral, through the response_url)."""

    HELD = "The bot is finishing a reply in that conversation; your action follows as soon as it is done."

    def __init__(self, ack: AsyncAck, respond: AsyncRespond) -> None:
        self.ack, self.respond = ack, respond

    async def answer(self, *, held: bool) -> None:
        await self.ack()
        if held:
            await self.tell(self.HELD)

    async def tell(self, words: str) -> None:
        await self.respond(text=words, response_type="ephemeral", replace_original=False)


class _TokenFromAuthorize(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != warning_client_prioritized_and_token_skipped()


_TOKEN_FROM_AUTHORIZE = _TokenFromAuthorize()


def build_app(
    *,
    client: AsyncWebClient,
    authorisation: Authorisation,
    signing_secret: str,
    intake: Intake,
    policy: Policy,
    directory: SlackDirectory,
    feedback: Feedback | None = None,
    csat: Csat | None = None,
    home: Home | None = None,
    view: AgentView | None = None,
) -> AsyncApp:
    """The Bolt app: intake's two middlewares, then a listener per feature the bot was given."""

    async def authorize() -> AuthorizeResult:  # bolt passes the arguments a function names: none here
        return await authorisation.result()

    # Bolt's own client carries no token: each request's comes from `authorize` (given both, bolt warns).
    bolt_client = AsyncWebClient(
        base_url=client.base_url,
        timeout=client.timeout,
        retry_handlers=list(client.retry_handlers),
        session=client.session,
    )
    # Bolt reads SLACK_BOT_TOKEN from the environment itself, then warns on its logger (this one) at every start
    # that the client's (tokenless, as meant) wins over it.
    bolt_logger = logging.getLogger("slack_bolt.AsyncApp")
    if _TOKEN_FROM_AUTHORIZE not in bolt_logger.filters:
        bolt_logger.addFilter(_TOKEN_FROM_AUTHORIZE)
    app = AsyncApp(client=bolt_client, signing_secret=signing_secret, authorize=authorize)
    # Every listener is there even for a feature not given: its clicks and events are acknowledged, never left to
    # Bolt's "unhandled request" (an error icon on an old button).
    listen_for_cases(app, intake)
    listen_for_feedback(app, feedback)
    listen_for_csat(app, csat)
    listen_for_home(app, home, view)
    listen_for_threads(app, view)
    store_first(app, intake, policy, directory, view)
    return app


def listen_for_cases(app: AsyncApp, intake: Intake) -> None:
    @app.action(re.compile("^case_"))
    async def case_button(ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
        action = case_action_of(body)
        if action is None:
            await ack()
            return
        await intake.act(action, ours=action.team, presser=SlackPresser(ack, respond))


def listen_for_feedback(app: AsyncApp, feedback: Feedback | None) -> None:
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


def listen_for_csat(app: AsyncApp, csat: Csat | None) -> None:
    @app.action(re.compile(f"^{CSAT_PREFIX}"))
    async def csat_rating(ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond, client: AsyncWebClient) -> None:
        await ack()
        click = csat_click_of(body)
        if click is None or csat is None:
            return
        texts = csat.policy.texts
        try:
            rated = await csat.rate(click)
        except Exception:
            log.exception("could not record the rating of case %s", click.escalation_id)
            answer = texts.get(Text.CSAT_RATING_NOT_SAVED, await csat.language(click.escalation_id))
            await respond(text=answer, response_type="ephemeral", replace_original=False)
            return
        if rated is None:
            # Said in the conversation's language, though not to its customer: the clicker is in that conversation.
            answer = texts.get(Text.CSAT_NOT_YOURS, await csat.language(click.escalation_id))
            await respond(text=answer, response_type="ephemeral", replace_original=False)
            return
        # The rating is stored before the modal is asked for: a modal Slack will not open (the trigger_id used or
        # past its 3 seconds) costs only the comment, and the customer is thanked in the thread instead.
        try:
            modal = comment_modal(click.escalation_id, texts, rated.language)
            await client.views_open(trigger_id=click.trigger, view=modal)
        except Exception:
            log.warning("could not open the CSAT comment modal of case %s", click.escalation_id, exc_info=True)
            thanks = texts.get(Text.CSAT_THANKS, rated.language)
            await respond(text=thanks, response_type="ephemeral", replace_original=False)

    @app.view(COMMENT_CALLBACK)
    async def csat_comment(ack: AsyncAck, body: dict[str, Any]) -> None:
        """Stored before the ack (Slack waits 3 seconds for it), so that a refusal shows in the modal."""
        comment = csat_comment_of(body)
        if comment is None or csat is None:
            await ack()  # left empty: nothing to store, the modal closes
            return
        try:
            problem = None if await csat.comment(comment) else Text.CSAT_COMMENT_NOT_YOURS
        except Exception:
            log.exception("could not store the comment on case %s", comment.escalation_id)
            problem = Text.CSAT_COMMENT_NOT_SAVED
        if problem is None:
            await ack()
        else:
            log.warning("CSAT comment on case %s by %s not stored: %s", comment.escalation_id, comment.user, problem)
            said = csat.policy.texts.get(problem, await csat.language(comment.escalation_id))
            await ack(response_action="errors", errors={COMMENT_BLOCK: said})


def listen_for_home(app: AsyncApp, home: Home | None, view: AgentView | None) -> None:
    @app.event("app_home_opened")
    async def home_opened(event: dict[str, Any], body: dict[str, Any]) -> None:
        user, tab = event.get("user"), event.get("tab", "home")
        if tab == "messages" and view is not None and isinstance(event.get("channel"), str):
            view.opened(event["channel"])  # the agent messaging experience's "a DM was opened"
            return
        if home is None or tab != "home" or not user:
            return
        try:
            await home.publish(str(user), team=body.get("team_id"))
        except Exception:
            log.exception("could not publish the App Home of %s", user)


def listen_for_threads(app: AsyncApp, view: AgentView | None) -> None:
    @app.event("assistant_thread_started")
    async def thread_started(event: dict[str, Any]) -> None:
        """The assistant messaging experience's "a DM was opened", which names the thread it started."""
        thread = event.get("assistant_thread") or {}
        channel, ts = thread.get("channel_id"), thread.get("thread_ts")
        if view is not None and isinstance(channel, str) and isinstance(ts, str):
            view.opened(channel, thread=ts)


def store_first(
    app: AsyncApp, intake: Intake, policy: Policy, directory: SlackDirectory, view: AgentView | None = None
) -> None:
    """Slash commands and clicks acted on once; events stored (or known as duplicates) before Slack's ack."""

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
            first = await intake.first_request(trigger)
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
        bot_user = req.context.bot_user_id
        try:
            envelope = sanitised(req.body)
            delivery = delivery_of(envelope)
            message = classify(envelope, policy if bot_user is None else replace(policy, bot_user_id=bot_user))
            disposition = await intake.accept(delivery, message, writers=directory, ours=delivery.team_id)
        except Exception:
            log.exception("could not store event %s; answering 503 so Slack retries", req.body.get("event_id"))
            return BoltResponse(status=503, body="inbox unavailable")
        if view is not None and isinstance(message, CustomerMessage) and disposition == "stored":
            view.stored(message)  # once: a redelivery or the same message's app_mention is no longer "stored"
        return BoltResponse(status=200, body="")
