"""`helpdesk-bot forget` and `helpdesk-bot export`: one person's data, erased or written out
(`agents.personal`), selected by platform and user id."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
from pathlib import Path
from typing import Any

from agents import personal
from agents.address import Platform
from bot.runtime import startup as runtime
from bot.settings import Settings


def add_commands(sub: Any) -> None:
    forget = sub.add_parser(
        "forget", help="erase everything held about one person (their conversations, cases, files' text, posts)"
    )
    _selector(forget)
    forget.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    export = sub.add_parser("export", help="write what is held about one person as JSON")
    _selector(export)
    export.add_argument("--out", type=Path, help="write the JSON here (default: standard output)")


def _selector(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--platform", choices=[p.value for p in Platform], required=True)
    parser.add_argument("--user", required=True, help="the platform's user id (Slack U…; Teams 29:…, not the AAD id)")


def run(settings: Settings, args: argparse.Namespace) -> int:
    person = personal.Person(args.platform, args.user)
    if args.command == "forget" and not args.yes:
        answer = input(f"Forget {person.platform} user {person.user}? This cannot be undone. Type 'forget': ")
        if answer.strip() != "forget":
            print("Nothing was changed.")
            return 1
    return asyncio.run(_run(settings, args, person))


async def _run(settings: Settings, args: argparse.Namespace, person: personal.Person) -> int:
    try:
        async with runtime.open_database(settings) as db:
            if args.command == "export":
                held = await personal.export(db.sessions, person)
            else:
                counts = await personal.forget(db.sessions, person, requested_by=f"cli:{getpass.getuser()}")
    except personal.PersonError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.command == "export":
        written = json.dumps(held, indent=2, ensure_ascii=False, default=str)
        if args.out is None:
            print(written)
        else:
            args.out.write_text(written + "\n", encoding="utf-8")
            print(f"{args.out}: {len(held['conversations'])} conversation(s)")
        return 0
    print(summary(counts))
    return 0


def summary(counts: dict[str, int]) -> str:
    """What a forget changed, one table a line (the posts themselves are taken down by the running bot's outbox)."""
    if not counts:
        return "Nothing was held about that person."
    return "\n".join(["Forgotten. Rows changed or deleted:", *(f"  {table}: {n}" for table, n in counts.items())])
