"""Slack's part of the composition root (`bot.compose`): the clients and what is built on them, from the settings."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial

import aiohttp
from prometheus_client import Counter
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.texts import Texts
from bot.admin.command import AdminCommands
from bot.channels.intake import Intake
from bot.channels.previews import Notice
from bot.csat import Csat
from bot.feedback import Feedback
from bot.settings import Settings
from bot.slack.agent_view import AgentView, Prompt
from bot.slack.ai_status import SlackStatus
from bot.slack.app import Authorisation, SlackDirectory, build_app, slack_client, slack_session
from bot.slack.events import Policy
from bot.slack.files import SlackFiles, file_limits
from bot.slack.home import Home
from bot.slack.messenger import SlackMessenger
from bot.slack.preflight import staff_channel_problem, staff_channel_status
from bot.slack.streaming import SlackStreams
from bot.slack.support import register as register_admin
from bot.staff import StaffGate, StaffList

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlackSide:
    settings: Settings
    client: AsyncWebClient
    """Retries what Slack asks to retry: for reads, and for Bolt's acknowledgements."""
    directory: SlackDirectory
    files: SlackFiles
    messenger: SlackMessenger
    """On a client that retries nothing: the sender decides what a failed post means (`SlackMessenger`)."""
    authorisation: Authorisation
    """Who the bot is (auth.test, asked for when the app is built): for Bolt, and for telling our echoes."""
    http: aiohttp.ClientSession
    """The connections every client here shares (`slack_session`); closed with the bot."""

    def client_without_retries(self) -> AsyncWebClient:
        settings = self.settings
        token = self.client.token or ""
        return slack_client(token=token, base_url=settings.slack_api_url, idempotent_only=True, session=self.http)

    async def close(self) -> None:
        await self.http.close()

    def ai_status(self, *, failures: Counter, title: Callable[[str], str], texts: Texts) -> SlackStatus:
        # Its own client that retries nothing: a status late is a status wrong.
        return SlackStatus(self.client_without_retries(), failures=failures, title=title, texts=texts)

    def streams(self, sessions: async_sessionmaker[AsyncSession], *, notice: Notice, texts: Texts) -> SlackStreams:
        """Answers streamed in the customer's thread, on a client that retries nothing (a start retried after a
        lost answer would show twice)."""
        return SlackStreams(self.client_without_retries(), sessions, notice=notice, texts=texts)

    async def staff_channel_check(self, listed: StaffList) -> Callable[[], Awaitable[str | None]]:
        """`/support status`'s look at the staff channel; looked at once now, and a problem said loudly."""
        channel = self.settings.staff_channel_id
        problem = await staff_channel_problem(self.client, channel, allow_list=listed.restricts)
        if problem is not None:
            log.warning("\n%s\nSTAFF CHANNEL: %s\n%s", "!" * 80, problem, "!" * 80)
        return partial(staff_channel_status, self.client, channel, allow_list=listed.restricts)

    async def app(
        self,
        *,
        intake: Intake,
        staff: StaffGate,
        feedback: Feedback,
        csat: Csat,
        admin: AdminCommands,
        prompts: Sequence[Prompt] = (),
    ) -> AsyncApp | None:
        """The Bolt app, its identity asked now (`Authorisation`); None without a signing secret (no events).
        `prompts`: the operator's suggested prompts for a customer's DM with the app."""
        settings = self.settings
        if settings.slack_signing_secret is None:
            return None
        await self.authorisation.warm()
        app = build_app(
            client=self.client,
            authorisation=self.authorisation,
            signing_secret=settings.slack_signing_secret.get_secret_value(),
            intake=intake,
            policy=Policy(None, settings.staff_channel_id, settings.served_channels, settings.slack_answer_bots),
            directory=self.directory,
            feedback=feedback,
            csat=csat,
            home=Home(client=self.client, admin=admin, staff=staff, texts=settings.texts, locale=self.directory.locale),
            # Its own client that retries nothing: a title or a prompt late is as good as none.
            view=AgentView(self.client_without_retries(), prompts=prompts),
        )
        register_admin(app, admin, name=settings.admin_command)
        return app


def slack_side(settings: Settings) -> SlackSide:
    assert settings.slack_bot_token is not None
    token, api = settings.slack_bot_token.get_secret_value(), settings.slack_api_url
    http = slack_session()
    client = slack_client(token=token, base_url=api, session=http)
    return SlackSide(
        settings=settings,
        client=client,
        directory=SlackDirectory(client),
        files=SlackFiles(token=token, limits=file_limits(settings), api_url=api),
        messenger=SlackMessenger(slack_client(token=token, base_url=api, idempotent_only=True, session=http)),
        authorisation=Authorisation(client),
        http=http,
    )
