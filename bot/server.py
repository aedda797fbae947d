"""`python -m bot serve` (HTTP) and `python -m bot socket` (Socket Mode): the whole bot in one process.

Both serve the bot `bot.compose.running_bot` builds and differ only in how Slack reaches it; Teams' activities
and the monitoring endpoints are HTTP either way. Several processes against one database scale it out.
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
from contextlib import asynccontextmanager

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.signature import SignatureVerifier
from sqlalchemy import text

from bot.compose import Bot, running_bot
from bot.runtime import event_loop
from bot.settings import Settings
from bot.slack.preflight import RefusedToStart

log = logging.getLogger(__name__)
WORKER_NICENESS = 10
"""How much lower than a web process a worker process (PROCESS_ROLE=worker) runs: a web process keeps the CPU it
needs for its acks while workers use the rest."""
GC_THRESHOLDS = (50_000, 20, 100)
"""The cyclic garbage collector's, once warm (Python's are 700, 10, 10). A message allocates thousands of objects that
reference counting frees; at 700 the collector ran every few of them and traversed the survivors of each turn in
flight: 4% of the CPU under a burst (`python -m bench cpu`, 315 young and 30 older collections for 600 messages,
0.24 s), against 2 collections and 0.02 s at 50,000, with the same peak memory."""

NO_SLACK = """Slack is not configured, so there is no workspace to serve. Set:
  SLACK_BOT_TOKEN=xoxb-...        (OAuth & Permissions -> Bot User OAuth Token)
  SLACK_SIGNING_SECRET=...        (Basic Information -> App Credentials)
  SLACK_APP_TOKEN=xapp-...        (optional: Socket Mode instead of a public HTTP endpoint)
in the environment or .env; README "Slack app setup" creates the app from manifest.yml.
Meanwhile `python -m bot playground` runs the whole bot against a local Slack in the browser, and
`python -m bot chat` talks to the agents in the terminal."""


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
        if bot.echoes is not None and bot.echoes.dismissed(body):
            return web.Response(status=200)  # as Bolt acknowledges a self event: nothing to do, nothing to retry
        try:
            bolt_request = AsyncBoltRequest(body=body, query=request.query_string, headers=dict(request.headers))
        except (ValueError, RecursionError):  # not UTF-8, not JSON or form, or nested past the parser's depth
            return web.json_response({"error": "malformed body"}, status=400)
        return await to_aiohttp_response(await bot.app.async_dispatch(bolt_request))

    async def livez(_: web.Request) -> web.Response:
        # For a load balancer that can reach only this port: the process is up, its workers started and it is warm.
        # Nothing else (no database round trip, no details), since anyone can ask.
        ready = bot.workers.ready and bot.warm_up.warm
        return web.json_response({"ready": ready}, status=200 if ready else 503)

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
        ready = database == "ok" and bot.workers.ready and bot.warm_up.warm
        body: dict[str, object] = {"database": database, "ready": ready}
        if bot.warm_up.pending:
            body["warming"] = sorted(bot.warm_up.pending)
        if bot.warm_up.failed:
            # Ready all the same: each of these has a degraded way to answer (the model routes, full-text search).
            body["warm_up_failed"] = dict(bot.warm_up.failed)
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
        log.info(
            "listening on %s (%s, %s event loop)", bot.url, "socket mode" if socket_mode else "http", event_loop.name()
        )
        if bot.monitoring_url != bot.url:
            log.info("/healthz and /metrics on %s", bot.monitoring_url)
        # Ready means warm: a deployment that waits for this line (or /healthz) sends no customer to a cold process.
        await bot.warm_up.wait()
        gc.freeze()  # start-up objects live forever: keep them out of full collections, which stall every ack
        gc.set_threshold(*GC_THRESHOLDS)
        print(
            json.dumps(
                {
                    "event": "ready",
                    "port": settings.port,
                    "mode": "socket" if socket_mode else "http",
                    "loop": event_loop.name(),
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
