"""The `/support` commands, whichever channel brings them: check the caller is an admin, run the subcommand, and
record the attempt, refused ones included. Each channel delivers and answers them its own way (`bot.slack.support`,
`bot.teams.app`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import openai

from agents.agent import Roster
from agents.knowledge.store import KnowledgeBase, KnowledgeStatus
from agents.toolsets import SourceStatus
from bot.admin import parse as p
from bot.admin import views
from bot.admin.actions import AdminActions
from bot.admin.queries import AdminQueries, Health
from bot.admin.views import Reply
from bot.retention import KindStatus, Retention
from bot.staff import Members

log = logging.getLogger(__name__)

ProviderProbe = Callable[[], Awaitable[str]]


@dataclass(frozen=True)
class Invocation:
    user: str
    channel: str | None
    team: str | None
    team_domain: str | None
    """The workspace's subdomain, for links to messages."""
    text: str


def provider_probe(
    client: openai.AsyncOpenAI | None, *, model: str, timeout_s: float = 5.0, offline_in_outage: bool = False
) -> ProviderProbe:
    """How `status` describes the LLM provider: offline, or whether its model list answers, and how fast.
    It reuses the agents' client (its connections), without retries: a status must not take a minute."""

    async def probe() -> str:
        if client is None:
            return "offline mode (no provider configured): answers come from the knowledge base"
        started = time.perf_counter()
        try:
            await client.with_options(timeout=timeout_s, max_retries=0).models.list()
        except openai.OpenAIError as exc:
            meanwhile = (
                "answers fall back to offline mode" if offline_in_outage else "customers get an apology and a colleague"
            )
            return f"⚠️ unreachable ({type(exc).__name__}); {meanwhile}"
        return f"reachable, {(time.perf_counter() - started) * 1000:.0f} ms · model `{model}`"

    return probe


class AdminCommands:
    def __init__(
        self,
        *,
        members: Members,
        admin_ids: frozenset[str],
        workspace_admins: bool,
        queries: AdminQueries,
        actions: AdminActions,
        roster: Roster,
        knowledge: KnowledgeBase,
        probe: ProviderProbe,
        version: str,
        staff_channel: Callable[[], Awaitable[str | None]] | None = None,
        tool_sources: Callable[[], Sequence[SourceStatus]] = lambda: (),
        retention: Retention | None = None,
    ) -> None:
        self.members = members
        """Slack's directory, briefly cached: who is a workspace admin, and of which workspace."""
        self.staff_channel = staff_channel
        """What is wrong with the staff channel (`bot.slack.preflight`), checked again on each status, so that inviting
        the bot shows as fixed at once."""
        self.tool_sources = tool_sources
        """How the operator's tool sources (MCP servers, HTTP endpoints) are doing now, asked on each status: a
        source reconnects by itself, and status must show it as soon as it has."""
        self.retention = retention
        """The retention periods and what is held of each kind, for status; None: not shown."""
        self.admin_ids = admin_ids
        self.workspace_admins = workspace_admins
        self.queries = queries
        self.actions = actions
        self.roster = roster
        self.knowledge = knowledge
        self.probe = probe
        self.version = version
        self.started = datetime.now(UTC)
        self._started_monotonic = time.monotonic()

    async def is_admin(self, user: str, *, team: str | None) -> bool:
        """Listed in ADMIN_USER_IDS (the operator's word), or, when allowed, an admin of this workspace (`team`):
        not an admin of another organisation seen through a shared channel, nor a guest."""
        if user in self.admin_ids:
            return True
        if not self.workspace_admins:
            return False
        try:
            member = await self.members.member(user)
        except Exception:
            log.warning("could not check whether %s is a workspace admin (users.info failed)", user, exc_info=True)
            return False
        return member is not None and member.admin and member.outsider(team) is None

    async def run(self, call: Invocation) -> Reply:
        words = call.text.split(maxsplit=1)
        name, arguments = (words[0].lower() if words else "help"), (words[1] if len(words) > 1 else "")
        allowed = await self.is_admin(call.user, team=call.team)
        record = await self.actions.record(
            user=call.user, channel=call.channel, command=name, arguments=arguments, allowed=allowed
        )
        if not allowed:
            log.warning("/support %r refused for %s in %s: not an admin", call.text, call.user, call.channel)
            reply = views.refusal_reply(call.user)
            await self.actions.finish(record, ok=False, result=reply.text)
            return reply
        try:
            ok, reply = await self._dispatch(p.parse(call.text), call)
        except Exception:
            log.exception("/support %r failed", call.text)
            ok, reply = False, views.usage_reply(p.UsageError("Something went wrong; it is in the bot's log.", ""))
        try:
            await self.actions.finish(record, ok=ok, result=reply.text)
        except Exception:  # the answer matters more than the outcome's note (the attempt is recorded already)
            log.exception("could not record the outcome of /support %r by %s", call.text, call.user)
        return reply

    async def _dispatch(self, command: p.Command | p.UsageError, call: Invocation) -> tuple[bool, Reply]:
        domain = call.team_domain
        match command:
            case p.UsageError():
                return False, views.usage_reply(command)
            case p.Help(topic):
                return True, views.help_reply(topic)
            case p.Status():
                health, llm, knowledge, staff, kept = await asyncio.gather(
                    self.database_health(),
                    self.probe(),
                    self.knowledge_status(),
                    self._staff_channel(),
                    self.retention_status(),
                )
                uptime = time.monotonic() - self._started_monotonic
                reply = views.status_reply(
                    health,
                    llm=llm,
                    knowledge=knowledge,
                    staff_channel=staff,
                    version=self.version,
                    uptime_s=uptime,
                    started=self.started,
                    sources=self.source_statuses(),
                    retention=kept,
                )
                return isinstance(health, Health), reply
            case p.Agents():
                return True, views.agents_reply(self.roster)
            case p.Conversations(listing):
                total, rows = await self.queries.conversations(listing)
                return True, views.conversations_reply(listing, total, rows, domain)
            case p.Show(ref):
                detail = await self.queries.detail(ref, team=call.team)
                if detail is None:
                    return False, views.usage_reply(p.UsageError("I found no conversation for that link.", ""))
                return True, views.detail_reply(detail, domain)
            case p.Escalations():
                total, cases = await self.queries.open_cases()
                return True, views.cases_reply(total, cases, domain)
            case p.ChangeConversation(change, ref):
                result = await self.actions.change(change, ref, user=call.user, team=call.team)
                return result.ok, views.result_reply(change.capitalize(), result)
            case p.Pause(channel):
                result = await self.actions.pause(channel, user=call.user)
                return result.ok, views.result_reply("Pause", result)
            case p.Resume(channel):
                result = await self.actions.resume(channel, user=call.user)
                return result.ok, views.result_reply("Resume", result)
            case p.KbSearch(query):
                return True, views.kb_hits_reply(query, await self.knowledge.search(query, k=5))
            case p.KbStats():
                return True, views.kb_stats_reply(await self.knowledge.stats())
            case p.Stats(days):
                return True, views.usage_stats_reply(await self.queries.usage(days))
            case p.Tools(days):
                return True, views.tools_reply(await self.queries.tool_calls(days))
            case p.Forget(user):
                return True, views.forget_reply(await self.actions.forget(user, by=call.user))

    async def knowledge_status(self) -> KnowledgeStatus | str:
        try:
            return await self.knowledge.status()
        except Exception as exc:  # the database is down: status still answers, saying so
            return f"unknown ({type(exc).__name__})"

    def source_statuses(self) -> Sequence[SourceStatus] | str:
        """The tool sources' statuses, or why there are none: a source that cannot say must not cost the whole
        status answer."""
        try:
            return tuple(self.tool_sources())
        except Exception as exc:
            log.warning("status: the tool sources could not say how they are", exc_info=True)
            return f"unknown ({type(exc).__name__})"

    async def retention_status(self) -> Sequence[KindStatus] | str:
        if self.retention is None:
            return ()
        try:
            return await self.retention.status()
        except Exception as exc:  # the database is down: status says so in its own field
            return f"unknown ({type(exc).__name__})"

    async def _staff_channel(self) -> str | None:
        return None if self.staff_channel is None else await self.staff_channel()

    async def database_health(self) -> Health | str:
        """The database's view, or why there is none: when the database is down, status must still answer."""
        try:
            return await self.queries.health()
        except Exception as exc:
            log.warning("status: the database check failed", exc_info=True)
            return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
