"""`python -m bot serve` (HTTP) and `python -m bot socket` (Socket Mode): the whole bot in one process.

Both modes share everything but the transport: the Bolt app with its durable-inbox middleware, the turn
workers and the outbox sender. Several processes against one database scale it out.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import hmac
import json
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

from aiohttp import web
from microsoft_agents.authentication.msal import MsalAuth
from microsoft_agents.hosting.core.authorization import AgentAuthConfiguration, AuthTypes
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.signature import SignatureVerifier
from sqlalchemy import text

from agents.address import Platform
from agents.conversations import Conversations
from agents.db.engine import make_engine, make_sessions, watch_writes
from agents.identity import Author
from agents.knowledge.store import KnowledgeBase
from agents.leases import Leases, process_owner
from agents.model import Model
from agents.offline import FallbackModel, ProviderHealth
from agents.toolsets import SourceStatus
from bot.admin.actions import AdminActions
from bot.admin.command import AdminCommands, provider_probe
from bot.admin.command import register as register_admin
from bot.admin.queries import AdminQueries
from bot.channels.intake import Inbox
from bot.csat import Csat, CsatPolicy
from bot.declaration.build import helpdesk as declared_helpdesk
from bot.delivery.outbox import OutboxSender, ReplyStyle, turn_outbox
from bot.feedback import Feedback
from bot.metrics import Metrics
from bot.runtime import startup as runtime
from bot.runtime.workers import Workers
from bot.settings import Settings
from bot.slack.ai_status import SlackStatus
from bot.slack.app import Authorisation, SlackDirectory, build_app, slack_client
from bot.slack.events import Policy
from bot.slack.files import SlackFiles, file_limits
from bot.slack.home import Home
from bot.slack.preflight import RefusedToStart, staff_channel_problem, staff_channel_status
from bot.staff import Colleagues, Member, Members, StaffGate, StaffList
from bot.teams.app import EitherDirectory, TeamsAuth, TeamsDirectory, TeamsEdge, TeamsPeople
from bot.teams.events import TeamsPolicy
from bot.teams.messenger import ServiceUrls, TeamsMessenger
from escalation.desk import CaseDesk
from escalation.machine import TAKEOVER
from escalation.policy import BusinessHours, EscalationPolicy
from escalation.render import CaseRenderer, Summarizer

log = logging.getLogger(__name__)
BOT_ACTOR = "helpdesk-bot"
"""Who the audit names when the bot itself acts on a case (hands back one that could not be posted)."""
WORKER_NICENESS = 10
"""How much lower than a web process a worker process (PROCESS_ROLE=worker) runs: a web process keeps the CPU it
needs for its acks while workers use the rest."""

NO_SLACK = """Slack is not configured, so there is no workspace to serve. Set:
  SLACK_BOT_TOKEN=xoxb-...        (OAuth & Permissions -> Bot User OAuth Token)
  SLACK_SIGNING_SECRET=...        (Basic Information -> App Credentials)
  SLACK_APP_TOKEN=xapp-...        (optional: Socket Mode instead of a public HTTP endpoint)
in the environment or .env; README "Slack app setup" creates the app from manifest.yml.
Meanwhile `python -m bot playground` runs the whole bot against a local Slack in the browser, and
`python -m bot chat` talks to the agents in the terminal."""


@dataclass
class Bot:
    settings: Settings
    db: runtime.Database
    app: AsyncApp | None
    """The Slack app; None when only Teams is configured."""
    workers: Workers
    metrics: Metrics
    conversations: Conversations
    desk: CaseDesk
    knowledge: KnowledgeBase
    teams: TeamsEdge | None = None
    """`POST /api/messages`, when Teams is configured."""
    url: str = ""
    """Where the HTTP endpoints listen, once they do."""
    monitoring_url: str = ""
    """Where /healthz and /metrics are served: METRICS_HOST:METRICS_PORT, or `url` when METRICS_PORT is PORT."""
    provider: Callable[[], ProviderHealth] | None = None
    """How the LLM provider is doing (None offline): /healthz says degraded while it fails."""


def escalation_policy(settings: Settings) -> EscalationPolicy:
    return EscalationPolicy(
        staff_channel=settings.staff_channel,
        note_marker=settings.note_marker,
        hours=BusinessHours.parse(settings.business_hours, settings.business_timezone),
        off_hours_message=settings.off_hours_message,
        resolved_message=settings.resolved_message,
        handed_back_message=settings.handed_back_message,
        reminder_after_s=settings.case_reminder_minutes * 60,
        max_reminders=settings.case_max_reminders,
        llm_summary=settings.case_summary == "llm" and settings.llm_configured,
    )


def llm_summarizer(model: Model, model_name: str) -> Summarizer:
    async def summarize(lines: list[tuple[str, str]]) -> str:
        transcript = "\n".join(f"{who}: {text}" for who, text in lines)
        prompt = (
            "Summarise this customer-service conversation for the colleague taking it over: who the customer "
            "is, what they need, what was tried, and what is still open. At most four short bullet points."
        )
        response = await model.complete(
            model=model_name,
            messages=[{"role": "system", "content": prompt}, {"role": "user", "content": transcript}],
            tools=[],
        )
        return response.content or ""

    return summarize


@asynccontextmanager
async def running_bot(settings: Settings, *, clock: Callable[[], datetime] | None = None) -> AsyncIterator[Bot]:
    """Database migrated, workers running, the Slack app and the Teams edge ready (whichever are configured);
    everything stopped on exit."""
    assert settings.slack_configured or settings.teams_configured
    settings, helpdesk = declared_helpdesk(settings)
    if not settings.llm_configured:
        log.warning("no LLM provider configured: answering from the knowledge base (offline mode)")
    now = clock or (lambda: datetime.now(UTC))
    style = ReplyStyle(settings.handoff_notice, settings.working_reaction, settings.done_reaction)
    policy = escalation_policy(settings)
    slack = settings.slack_configured
    token = settings.slack_bot_token.get_secret_value() if settings.slack_bot_token else ""
    api = settings.slack_api_url
    client = slack_client(token=token, base_url=api) if slack else None
    files = SlackFiles(token=token, limits=file_limits(settings), api_url=api) if slack else None
    async with runtime.open_database(settings) as db, AsyncExitStack() as closing:
        brain = await runtime.brain(settings, db, helpdesk)
        roster, model = brain.roster, brain.model
        leases = Leases(db.sessions, owner=process_owner(), ttl_s=settings.lease_seconds)
        metrics = Metrics()
        conversations = Conversations(
            takeover=TAKEOVER,
            sessions=db.sessions,
            roster=roster,
            model=model,
            config=runtime.loop_config(settings, token_budget=brain.token_budget),
            after_turn=turn_outbox(roster, style, policy, clock=now),
            leases=leases,
            limits=runtime.limits(settings),
            attachments=files,
            summarising=runtime.summarising(settings, brain),
            on_summary=metrics.count_summary,
            router=brain.router,
        )
        if conversations.summaries is not None:
            closing.push_async_callback(conversations.summaries.close)
        if brain.router is not None:
            warming = asyncio.create_task(brain.router.warm())
            closing.callback(warming.cancel)
        # Reads only: the Slack client that retries is safe here.
        directory = SlackDirectory(client) if client is not None else None
        listed = StaffList(settings.staff_ids, settings.staff_usergroup_id)
        teams = teams_parts(settings, db) if settings.teams_configured else None
        if teams is not None:
            closing.push_async_callback(teams.messenger.close)
        if settings.staff_platform == Platform.TEAMS:
            assert teams is not None and settings.teams_staff_channel_id is not None
            staff = StaffGate(members=teams.people.in_conversation(settings.teams_staff_channel_id), listed=listed)
        else:
            staff = StaffGate(members=directory or NoMembers(), listed=listed)
        channel_check: Callable[[], Awaitable[str | None]] | None = None
        if client is not None and settings.staff_platform == Platform.SLACK:
            channel_check = partial(
                staff_channel_status, client, settings.staff_channel_id, allow_list=listed.restricts
            )
            problem = await staff_channel_problem(client, settings.staff_channel_id, allow_list=listed.restricts)
            if problem is not None:
                log.warning("\n%s\nSTAFF CHANNEL: %s\n%s", "!" * 80, problem, "!" * 80)
        cases = CaseRenderer(
            sessions=db.sessions,
            directory=EitherDirectory(slack=directory, teams=TeamsDirectory(db.sessions) if teams else None),
            summarize=llm_summarizer(runtime.chat_model(settings), settings.openai_model)
            if policy.llm_summary
            else None,
            name_suffix=settings.staff_name_suffix or "",
        )
        sender = OutboxSender(
            engine=db.engine,
            client=slack_client(token=token, base_url=api, idempotent_only=True) if slack else None,
            messengers=[teams.messenger] if teams is not None else [],
            staff_platform=settings.staff_platform,
            cases=cases,
            admins=settings.admin_ids,
            teams_admins=frozenset(f"8:orgid:{admin}" for admin in settings.teams_admins),
            staff_channel=settings.staff_channel,
            unreachable_notice=settings.case_unreachable_message,
            hand_back=lambda escalation_id: desk.apply(escalation_id=escalation_id, action="hand_back", user=BOT_ACTOR),
            lease_s=settings.lease_seconds,
            feedback_buttons=settings.feedback_buttons,
            files=files,
        )
        workers = Workers(
            conversations=conversations,
            sender=sender,
            metrics=metrics,
            max_turns=settings.max_concurrent_turns,
            listen_url=runtime.listen_url(settings, db.url),
            enabled=settings.process_role != "web",
            # Its own client that retries nothing: a status late is a status wrong.
            status=SlackStatus(
                slack_client(token=token, base_url=api, idempotent_only=True),
                failures=metrics.status_failures,
                title=lambda name: roster.get(name).title,
            )
            if slack
            else None,
        )
        csat = Csat(sessions=db.sessions, policy=csat_policy(settings))
        desk = CaseDesk(
            sessions=db.sessions,
            policy=policy,
            on_change=workers.wake_sender,
            leases=leases,
            after_resolve=csat.after_resolve,
        )
        # The acknowledgement path gets its own small pool, so a burst of events never queues behind the
        # workers' short transactions for Slack's 3 seconds.
        pooler = settings.database_pooler == "transaction"
        ack_engine = make_engine(db.url, pool_size=settings.ack_pool_size, transaction_pooler=pooler)
        watch_writes(ack_engine, db.writes)  # where a full disk shows first: the events Slack sends
        # And so does monitoring: a scrape never waits behind turns, nor a turn behind a scrape.
        monitoring_engine = make_engine(db.url, pool_size=1, transaction_pooler=pooler)
        metrics.watch(monitoring_engine)
        metrics.watch_sources(lambda: tool_statuses(brain))
        inbox = Inbox(
            sessions=make_sessions(ack_engine),
            conversations=conversations,
            policy=Policy(None, settings.staff_channel_id, settings.served_channels, settings.slack_answer_bots),
            style=style,
            escalation=policy,
            metrics=metrics,
            on_stored=workers.wake_all,
            people=directory or NoMembers(),
            staff=staff,
            colleagues=Colleagues(settings.staff_teams, settings.staff_domains),
            customer_organisations=settings.customer_orgs,
        )
        workers.housekeeping = [(inbox.prune, 600), (lambda: desk.remind(now=now()), 30)]
        app = None
        if client is not None and directory is not None and settings.slack_signing_secret is not None:
            secret = settings.slack_signing_secret.get_secret_value()
            admin = admin_commands(settings, db, brain, desk, directory, channel_check)
            authorisation = Authorisation(client)
            await authorisation.warm()
            feedback = Feedback(
                sessions=db.sessions,
                desk=desk,
                escalate_on_bad=settings.feedback_escalate_on_bad,
                escalated_notice=settings.escalation_message,
            )
            app = build_app(
                client=client,
                authorisation=authorisation,
                signing_secret=secret,
                inbox=inbox,
                desk=desk,
                staff=staff,
                feedback=feedback,
                csat=csat,
                home=Home(client=client, admin=admin, staff=staff),
            )
            register_admin(app, admin, name=settings.admin_command)
        edge = None
        if teams is not None:
            teams_admin = admin_commands(
                settings, db, brain, desk, NoMembers(), channel_check, admin_ids=settings.teams_admins
            )
            edge = TeamsEdge(
                policy=teams.policy,
                auth=TeamsAuth(app_id=teams.policy.app_id, tenant=teams.policy.tenant),
                inbox=inbox,
                urls=teams.urls,
                messenger=teams.messenger,
                people=teams.people,
                staff=staff,
                desk=desk,
                admin=teams_admin,
            )
        await workers.start()
        try:
            provider = brain.model.current_health if isinstance(brain.model, FallbackModel) else None
            yield Bot(
                settings, db, app, workers, metrics, conversations, desk, brain.knowledge, edge, provider=provider
            )
        finally:
            await workers.stop()
            await brain.close()
            await ack_engine.dispose()
            await monitoring_engine.dispose()


@dataclass(frozen=True)
class TeamsParts:
    policy: TeamsPolicy
    urls: ServiceUrls
    messenger: TeamsMessenger
    people: TeamsPeople


def teams_parts(settings: Settings, db: runtime.Database) -> TeamsParts:
    """Teams' side: the SDK's client credentials for outbound calls, where each conversation's service is."""
    assert settings.teams_app_id and settings.teams_tenant_id
    policy = TeamsPolicy(
        app_id=settings.teams_app_id,
        tenant=settings.teams_tenant_id,
        bot_name=settings.teams_bot_name,
        staff_channel=settings.teams_staff_channel_id,
        admins=settings.teams_admins,
    )
    credentials = MsalAuth(teams_credentials(settings))
    urls = ServiceUrls(db.engine, default=settings.teams_service_url)
    messenger = TeamsMessenger(
        credentials=credentials, urls=urls, tenant=policy.tenant, bot_id=policy.bot_id, bot_name=policy.bot_name
    )
    return TeamsParts(policy, urls, messenger, TeamsPeople(messenger))


def teams_credentials(settings: Settings) -> AgentAuthConfiguration:
    """The SDK's connection for the bot's own tokens: the app registration's client secret, or its certificate
    (a .pfx file, checked at start-up by the settings)."""
    if settings.teams_cert_pfx_file is not None:
        return AgentAuthConfiguration(
            auth_type=AuthTypes.certificate,
            client_id=settings.teams_app_id,
            tenant_id=settings.teams_tenant_id,
            cert_pfx_file=str(settings.teams_cert_pfx_file),
        )
    assert settings.teams_app_password is not None
    return AgentAuthConfiguration(
        auth_type=AuthTypes.client_secret,
        client_id=settings.teams_app_id,
        tenant_id=settings.teams_tenant_id,
        client_secret=settings.teams_app_password.get_secret_value(),
    )


class NoMembers:
    """Where a platform's directory is not there (no Slack): nobody is found, nobody is a workspace admin."""

    async def member(self, user: str) -> Member | None:
        return None

    async def usergroup(self, group: str) -> frozenset[str]:
        return frozenset()

    async def identify(self, author: Author) -> Author:
        return author


def csat_policy(settings: Settings) -> CsatPolicy:
    return CsatPolicy(
        enabled=settings.csat,
        sample_rate=settings.csat_sample_rate,
        cooldown=timedelta(days=settings.csat_cooldown_days),
        question=settings.csat_question,
        thanks=settings.csat_thanks,
    )


def admin_commands(
    settings: Settings,
    db: runtime.Database,
    brain: runtime.Brain,
    desk: CaseDesk,
    directory: Members,
    staff_channel: Callable[[], Awaitable[str | None]] | None,
    *,
    admin_ids: frozenset[str] | None = None,
) -> AdminCommands:
    """The /support commands: Slack's (ADMIN_USER_IDS, workspace admins when allowed) or, with `admin_ids`,
    Teams' (TEAMS_ADMIN_IDS: Entra object ids, nobody else)."""
    queries = AdminQueries(sessions=db.sessions)
    return AdminCommands(
        members=directory,
        admin_ids=settings.admin_ids if admin_ids is None else admin_ids,
        workspace_admins=settings.admin_workspace_admins and admin_ids is None,
        queries=queries,
        actions=AdminActions(sessions=db.sessions, queries=queries, desk=desk, entry_agent=brain.roster.entry),
        roster=brain.roster,
        knowledge=brain.knowledge,
        probe=provider_probe(
            brain.provider, model=settings.openai_model, offline_in_outage=settings.llm_outage == "offline"
        ),
        version=_version(),
        staff_channel=staff_channel,
        tool_sources=lambda: tool_statuses(brain),
    )


def tool_statuses(brain: runtime.Brain) -> list[SourceStatus]:
    """How the operator's MCP servers and HTTP tools are doing, for /support status and /metrics."""
    return [source.status() for source in (brain.helpdesk.sources if brain.helpdesk else ())]


def _version() -> str:
    try:
        return package_version("helpdesk-bot")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def web_app(bot: Bot) -> web.Application:
    """The public listener: Slack's requests, Teams' activities and `/livez`; `/healthz` and `/metrics` only when
    METRICS_PORT is PORT (behind METRICS_TOKEN, which the settings then require)."""
    secret = bot.settings.slack_signing_secret
    verifier = SignatureVerifier(secret.get_secret_value()) if secret is not None else None

    async def events(request: web.Request) -> web.Response:
        assert bot.app is not None and verifier is not None  # routed only when Slack is configured
        try:
            body = (await request.read()).decode()
        except UnicodeDecodeError:  # Slack sends UTF-8; the signature cannot even be checked on anything else
            return web.json_response({"error": "malformed body"}, status=400)
        # The signature next (an HMAC over the bytes): nothing unsigned gets parsed, however it is built. Bolt
        # checks it again, as it does for Socket Mode.
        if not verifier.is_valid_request(body, dict(request.headers)):
            return web.json_response({"error": "invalid signature"}, status=401)
        try:
            bolt_request = AsyncBoltRequest(body=body, query=request.query_string, headers=dict(request.headers))
        except (ValueError, RecursionError):  # not UTF-8, not JSON or form, or nested past the parser's depth
            return web.json_response({"error": "malformed body"}, status=400)
        return await to_aiohttp_response(await bot.app.async_dispatch(bolt_request))

    async def livez(_: web.Request) -> web.Response:
        # For a load balancer that can reach only this port: the process is up and its workers started. Nothing
        # else (no database round trip, no details), since anyone can ask.
        return web.json_response({"ready": bot.workers.ready}, status=200 if bot.workers.ready else 503)

    application = web.Application(client_max_size=1024**2)
    if bot.settings.process_role != "worker":
        if bot.app is not None:
            application.router.add_post("/slack/events", events)
        if bot.teams is not None:
            application.router.add_post("/api/messages", bot.teams.handle)
    application.router.add_get("/livez", livez)
    if bot.settings.metrics_on_public_port:
        _add_monitoring(application, bot)
    return application


def monitoring_app(bot: Bot) -> web.Application:
    """The listener on METRICS_HOST:METRICS_PORT (loopback unless told otherwise): `/healthz` and `/metrics` only."""
    application = web.Application()
    _add_monitoring(application, bot)
    return application


Handler = Callable[[web.Request], Awaitable[web.Response]]


def _add_monitoring(application: web.Application, bot: Bot) -> None:
    token = bot.settings.metrics_token

    def guarded(handler: Handler) -> Handler:
        if token is None:
            return handler
        # Digests compared in constant time: neither the token's bytes nor its length can be timed out of us.
        expected = hashlib.sha256(f"Bearer {token.get_secret_value()}".encode()).digest()

        async def checked(request: web.Request) -> web.Response:
            given = hashlib.sha256(request.headers.get("Authorization", "").encode()).digest()
            if not hmac.compare_digest(given, expected):
                return web.json_response({"error": "unauthorized"}, status=401, headers={"WWW-Authenticate": "Bearer"})
            return await handler(request)

        return checked

    async def healthz(_: web.Request) -> web.Response:
        try:
            async with bot.db.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            database = "ok"
        except Exception as exc:
            database = f"error: {type(exc).__name__}"
        # A full disk leaves SELECT 1 working while no message can be stored (Slack's events are refused): not
        # ready either, until no write has been refused for a few seconds (`agents.db.engine.WriteHealth`).
        writes = bot.db.writes.status()
        if database == "ok" and writes["status"] != "ok":
            database = f"refusing writes: {writes['last_error']}"
        ready = database == "ok" and bot.workers.ready
        body: dict[str, object] = {"database": database, "ready": ready}
        if writes["status"] != "ok":
            body["database_writes"] = writes
        if bot.provider is not None:
            # Degraded, not down: customers still get an apology and a colleague (or offline answers) while it fails.
            health = bot.provider()
            body["llm"] = {
                "status": health.status,
                "failing_since": health.failing_since.isoformat() if health.failing_since else None,
                "failures": health.failures,
                "last_error": health.last_error,
            }
        if database == "ok":
            # Degraded knowledge search is reported, not fatal: the bot answers, by full text.
            knowledge = await bot.knowledge.status()
            body["knowledge"] = {
                "search": knowledge.search,
                "embedder": knowledge.embedder,
                "dim": knowledge.dim,
                "problems": knowledge.problems,
            }
        return web.json_response(body, status=200 if ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=await bot.metrics.render(), content_type="text/plain")

    application.router.add_get("/healthz", guarded(healthz))
    application.router.add_get("/metrics", guarded(metrics))


@asynccontextmanager
async def listening(bot: Bot, *, host: str, port: int) -> AsyncIterator[Bot]:
    """The public listener on host:port (0: any free port), and the monitoring one on METRICS_HOST:METRICS_PORT
    unless METRICS_PORT is PORT; `bot.url` and `bot.monitoring_url` say where they are. A port that is taken
    refuses the start, naming the variable to change."""
    settings = bot.settings
    listeners = [(web_app(bot), host, port, "PORT")]
    if not settings.metrics_on_public_port:
        listeners.append((monitoring_app(bot), settings.metrics_host, settings.metrics_port, "METRICS_PORT"))
    runners: list[web.AppRunner] = []
    try:
        urls = []
        for application, where, number, variable in listeners:
            runner = web.AppRunner(application, access_log=None)
            await runner.setup()
            runners.append(runner)
            try:
                await web.TCPSite(runner, where, number).start()
            except OSError as exc:
                # Most often a second bot process on this host (web and worker, or two workers) with the same
                # default METRICS_PORT: each needs its own.
                anywhere = ", or METRICS_PORT=0 for any free port" if variable == "METRICS_PORT" else ""
                raise RefusedToStart(
                    f"cannot listen on {where}:{number} ({exc.strerror or exc}): is another bot process on this "
                    f"host using it? Give each process its own {variable}{anywhere}"
                ) from exc
            urls.append(f"http://{where}:{runner.addresses[0][1]}")
        bot.url, bot.monitoring_url = urls[0], urls[-1]
        yield bot
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


async def until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve(settings: Settings, *, socket_mode: bool = False) -> int:
    nothing = not settings.slack_configured and not settings.teams_configured
    if nothing or (socket_mode and settings.slack_app_token is None):
        print(NO_SLACK)
        return 2
    if settings.process_role == "worker":
        # A worker's turns and sends can wait (their rows are stored); a web process's acks cannot. On a shared
        # host the kernel then gives acks the CPU first.
        os.nice(WORKER_NICENESS)
    async with running_bot(settings) as bot, listening(bot, host=settings.host, port=settings.port):
        log.info("listening on %s (%s)", bot.url, "socket mode" if socket_mode else "http")
        if bot.monitoring_url != bot.url:
            log.info("/healthz and /metrics on %s", bot.monitoring_url)
        gc.freeze()  # start-up objects live forever: keep them out of full collections, which stall every ack
        print(
            json.dumps(
                {
                    "event": "ready",
                    "port": settings.port,
                    "mode": "socket" if socket_mode else "http",
                    "monitoring": bot.monitoring_url,  # METRICS_PORT=0 picks a port: this says which
                }
            ),
            flush=True,
        )
        handler = None
        if socket_mode and settings.process_role != "worker" and bot.app is not None:
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

            assert settings.slack_app_token is not None
            handler = AsyncSocketModeHandler(bot.app, settings.slack_app_token.get_secret_value())
            await handler.connect_async()  # type: ignore[no-untyped-call]
        try:
            await until_signalled()
        finally:
            if handler is not None:
                await handler.close_async()  # type: ignore[no-untyped-call]
    return 0
