"""`python -m bot <command>`: the single entry point (also installed as `helpdesk-bot`).

`--help` and `--version` import the standard library only: a command's module (and with it the SDKs, SQLAlchemy,
NumPy) is imported once that command is chosen, so that they answer in a fraction of a second, not several."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bot.settings import Settings

COMMANDS: dict[str, tuple[str, str, str]] = {
    "kb": ("bot.kb", "add_commands", "the knowledge base: ingest, list, stats, delete, reembed, search"),
    "init": (
        "bot.declaration.scaffold",
        "add_command",
        "write a commented starter helpdesk.yaml (and tools, documents, eval cases)",
    ),
    "check": (
        "bot.declaration.scaffold",
        "add_command",
        "check the declaration (HELPDESK_FILE or ./helpdesk.yaml) and say what it runs",
    ),
    "eval": ("bot.eval", "add_command", "run YAML conversations through the agents and report how they did"),
    "forget": (
        "bot.personal",
        "add_commands",
        "erase everything held about one person (their conversations, cases, files' text, posts)",
    ),
    "export": ("bot.personal", "add_commands", "write what is held about one person as JSON"),
    "teams-package": (
        "bot.teams.package",
        "add_command",
        "write the Teams app package (manifest.json and icons, zipped)",
    ),
}
"""Commands whose options their own module declares: name -> (module, the function that adds the command's parser
to a subparsers action, the line `--help` lists). `tests/test_install.py` checks that the line is the module's."""


def _version() -> str:
    try:
        return importlib.metadata.version("helpdesk-bot")
    except importlib.metadata.PackageNotFoundError:  # a checkout that was never installed
        return "unknown (not installed)"


class _Commands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """The subcommands, where a command in COMMANDS is listed by name and help line, and its module builds its
    parser only when it is the one chosen."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if values and values[0] in COMMANDS:
            self.choices[values[0]] = command_parser(values[0], prog_prefix=self._prog_prefix)
        super().__call__(parser, namespace, values, option_string)


def command_parser(name: str, prog_prefix: str = "python -m bot") -> argparse.ArgumentParser:
    """The parser that the module of COMMANDS[name] declares for it (importing that module)."""
    module, function, _ = COMMANDS[name]
    scratch = argparse.ArgumentParser(prog=prog_prefix).add_subparsers()
    getattr(importlib.import_module(module), function)(scratch)
    parser: argparse.ArgumentParser = scratch.choices[name]
    return parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bot", description="Customer-service bot for Slack and Teams.")
    parser.add_argument("--version", action="version", version=f"helpdesk-bot {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, action=_Commands)
    sub.add_parser("migrate", help="apply the database migrations (Alembic upgrade to head)")
    chat = sub.add_parser("chat", help="talk to the agents in the terminal")
    chat.add_argument("--conversation", help="name of a conversation to start or resume")
    sub.add_parser("serve", help="serve Slack over HTTP on PORT (/slack/events, /healthz, /metrics)")
    sub.add_parser("socket", help="serve Slack over Socket Mode (SLACK_APP_TOKEN)")
    sub.add_parser("run", help="run the bot with what is configured (what `make run` calls)")
    sub.add_parser("playground", help="the whole bot with a Slack-like workspace in the browser, no Slack needed")
    for name, (_, _, line) in COMMANDS.items():
        sub.add_parser(name, help=line, add_help=False)  # a placeholder until the command is chosen
    return parser


async def _migrate() -> int:
    from bot.runtime import startup as runtime
    from bot.settings import get_settings

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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from bot.declaration.parse import DeclarationError

    try:
        return _main(args)
    except DeclarationError as exc:  # the operator's file: every problem with its line, nothing started
        print(exc, file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    if args.command == "teams-package":  # writes a file: no settings, database or logging needed
        from bot.teams import package as teams_package

        return teams_package.run(args)
    if args.command == "init":
        from bot.declaration import scaffold

        return scaffold.run(args)
    from pydantic import ValidationError

    from bot.settings import get_settings
    from bot.slack.preflight import RefusedToStart

    try:
        settings = get_settings()
    except ValidationError as exc:
        print("The configuration has errors; nothing was started:", file=sys.stderr)
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]).upper()
            print(f"  {where}: {error['msg']}", file=sys.stderr)
        return 2
    from bot import logs, tracing

    logs.configure(settings.log_level, settings.log_format)
    tracing.start()
    try:
        return _run(args, settings)
    except RefusedToStart as exc:
        print(f"Not started: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C during start-up, before the signal handlers are in place
        return 130


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from bot import eval as evaluation
    from bot import kb, personal
    from bot.chat import chat
    from bot.playground.app import playground
    from bot.runtime import event_loop
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
            return event_loop.run(serve(settings), settings.event_loop)
        case "socket":
            return event_loop.run(serve(settings, socket_mode=True), settings.event_loop)
        case "kb":
            return asyncio.run(kb.run(settings, args))
        case "eval":
            return asyncio.run(evaluation.run(settings, args))
        case "forget" | "export":
            return personal.run(settings, args)
        case "run" if nothing:
            # Neither Slack nor Teams is configured: the whole bot in the browser. Partly configured is a mistake that
            # `serve` names, rather than a silent playground.
            return event_loop.run(playground(settings), settings.event_loop)
        case "run":
            socket_mode = not no_slack and settings.slack_app_token is not None
            return event_loop.run(serve(settings, socket_mode=socket_mode), settings.event_loop)
        case "playground":
            return event_loop.run(playground(settings), settings.event_loop)
    return 2
