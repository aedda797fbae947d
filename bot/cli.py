"""`python -m bot <command>`: the single entry point (also installed as `helpdesk-bot`)."""

from __future__ import annotations

import argparse
import asyncio
import logging

from bot.settings import get_settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bot", description="Customer-service bot for Slack.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="apply the database migrations (Alembic upgrade to head)")
    chat = sub.add_parser("chat", help="talk to the agents in the terminal")
    chat.add_argument("--conversation", help="name of a conversation to start or resume")
    sub.add_parser("run", help="run the bot with what is configured (what `make run` calls)")
    return parser


async def _migrate() -> int:
    from bot import runtime

    settings = get_settings()
    async with runtime.open_database(settings) as db:
        print(f"database migrated to head ({'embedded' if db.embedded else 'DATABASE_URL'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    settings = get_settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for noisy in ("pgserver", "alembic", "httpx", "openai"):
        # Their INFO lines narrate every start-up step; ours say what matters.
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    from bot.chat import chat

    match args.command:
        case "migrate":
            return asyncio.run(_migrate())
        case "chat":
            return asyncio.run(chat(settings, conversation=args.conversation))
        case "run":
            # Until the Slack app lands, running the bot means talking to it in the terminal.
            return asyncio.run(chat(settings, conversation=None))
    return 2
