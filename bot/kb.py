"""`python -m bot kb ...`: ingest, list, stats, delete and search the knowledge base."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from agents.knowledge.documents import SUFFIXES, find_documents
from agents.knowledge.store import EmbedderMismatch, IngestFailed
from agents.language import Language
from bot.runtime import startup as runtime
from bot.settings import Settings


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    kb = sub.add_parser("kb", help="the knowledge base: ingest, list, stats, delete, reembed, search").add_subparsers(
        dest="kb_command", required=True
    )
    ingest = kb.add_parser("ingest", help="read, chunk, embed and store documents (Markdown, text, HTML, PDF, DOCX)")
    ingest.add_argument("paths", nargs="+", type=Path)
    ingest.add_argument("--collection", required=True)
    ingest.add_argument("--prune", action="store_true", help="remove documents that are no longer among PATHS")
    ingest.add_argument(
        "--language",
        type=_language,
        help=f"the documents' language ({', '.join(Language)}), kept for the collection's later ingestions; "
        "unset: each document's is detected",
    )
    kb.add_parser("list", help="collections and their documents")
    kb.add_parser("stats", help="documents and chunks per collection, and the embedder of each")
    delete = kb.add_parser("delete", help="delete a collection")
    delete.add_argument("--collection", required=True)
    reembed = kb.add_parser("reembed", help="embed a collection's stored passages again with the configured embedder")
    reembed.add_argument("--collection", required=True)
    search = kb.add_parser("search", help="hybrid search, as the agents' tool does it")
    search.add_argument("query")
    search.add_argument("--collection", action="append", default=[])
    search.add_argument("--k", type=int, default=5)
    search.add_argument("--mode", choices=["hybrid", "vector", "text"], default="hybrid")
    search.add_argument("--json", action="store_true")


def _language(value: str) -> Language:
    if (language := Language.parse(value)) is None:
        raise argparse.ArgumentTypeError(f"{value!r}: one of {', '.join(Language)}")
    return language


class _Progress:
    """A bar on a terminal's stderr, redrawn in place (none in a log, where it would be noise); `interrupted()` ends
    its line when the ingestion fails part-way."""

    def __init__(self) -> None:
        self.open = False
        self.shown = sys.stderr.isatty()

    def __call__(self, done: int, total: int, source: str) -> None:
        if not self.shown:
            return
        width = 30
        filled = width * done // max(total, 1)
        self.open = done != total
        end = "" if self.open else "\n"
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {source[:50]:<50}{end}")
        sys.stderr.flush()

    def interrupted(self) -> None:
        if self.open:
            sys.stderr.write("\n")
            self.open = False


def _shown(path: Path) -> str:
    """A path as the operator would type it: relative to the working folder when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _unusable(paths: list[Path]) -> str | None:
    """What is wrong with `kb ingest`'s paths, in a line, before the database starts: a typo costs a line, not a
    traceback nor an empty collection."""
    if missing := [p for p in paths if not p.exists()]:
        return f"no such file or folder: {', '.join(str(p) for p in missing)}"
    try:
        found = find_documents(paths)
    except ValueError as exc:
        return str(exc)
    if not found:
        where = ", ".join(str(p) for p in paths)
        return f"no documents to read in {where} (kb ingest reads {', '.join(sorted(SUFFIXES))})"
    return None


def _root(paths: list[Path]) -> Path | None:
    """Sources are stored relative to the common folder, so a moved checkout re-ingests as unchanged."""
    folders = [p.resolve() if p.is_dir() else p.resolve().parent for p in paths]
    common = Path(*Path(folders[0]).parts) if len(folders) == 1 else Path(*_common_parts(folders))
    return common if common.parts else None


def _common_parts(folders: list[Path]) -> list[str]:
    parts: list[str] = []
    for group in zip(*(f.parts for f in folders), strict=False):
        if len(set(group)) != 1:
            break
        parts.append(group[0])
    return parts


async def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.kb_command == "ingest" and (problem := _unusable(args.paths)):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    async with runtime.open_database(settings) as db:
        kb = await runtime.knowledge_base(settings, db.sessions)
        if kb.unavailable is not None:
            print(f"warning: no vectors, full-text search only. {kb.unavailable}", file=sys.stderr)
        try:
            match args.kb_command:
                case "ingest":
                    paths = [p.resolve() for p in args.paths]
                    progress = _Progress()
                    try:
                        report = await kb.ingest(
                            paths,
                            collection=args.collection,
                            prune=args.prune,
                            root=_root(paths),
                            progress=progress,
                            # An embedder that worked at the start and fails now fails the run: an operator can
                            # run it again, and would not want working vectors replaced by none.
                            require_vectors=kb.unavailable is None,
                            language=args.language,
                        )
                    except IngestFailed as exc:
                        progress.interrupted()
                        where = f"{_shown(exc.path)}: " if exc.path is not None else ""
                        print(f"error: {where}{exc.why}; nothing was changed in {args.collection}", file=sys.stderr)
                        return 1
                    by = {row["collection"]: row["embedder"] for row in await kb.stats()}
                    how = f"embedded with {by[args.collection]}" if kb.unavailable is None else "stored without vectors"
                    print(
                        f"{args.collection}: {report.added} added, {report.replaced} replaced, "
                        f"{report.unchanged} unchanged, {report.pruned} pruned; {report.chunks} chunks {how}"
                    )
                case "list" | "stats":
                    for row in await kb.stats():
                        print(
                            f"{row['collection']}: {row['documents']} documents, {row['chunks']} chunks, "
                            + (
                                f"embedded with {row['embedder']} ({row['dim']} dimensions)"
                                if row["dim"]
                                else f"not embedded yet (for {row['embedder']})"
                            )
                        )
                    for problem in (await kb.status()).problems:
                        print(f"  warning: {problem}")
                    if args.kb_command == "list":
                        for source in await kb.sources():
                            print(f"  {source}")
                case "delete":
                    gone = await kb.delete_collection(args.collection)
                    print(f"deleted {args.collection}" if gone else f"no collection {args.collection}")
                    return 0 if gone else 1
                case "reembed":
                    bar = _Progress()
                    count = await kb.reembed(args.collection, progress=lambda done, total: bar(done, total, ""))
                    by = {row["collection"]: row["embedder"] for row in await kb.stats()}
                    print(f"{args.collection}: {count} chunks embedded with {by[args.collection]}")
                case "search":
                    known = {str(row["collection"]) for row in await kb.stats()}
                    if unknown := sorted(set(args.collection or ()) - known):
                        there = ", ".join(sorted(known)) or "none"
                        print(f"error: no collection {', '.join(unknown)}; there are: {there}", file=sys.stderr)
                        return 2
                    hits = await kb.search(args.query, collections=args.collection, k=args.k, mode=args.mode)
                    if args.json:
                        print(json.dumps([asdict(h) for h in hits], indent=2, ensure_ascii=False))
                    for n, hit in enumerate([] if args.json else hits, 1):
                        print(f"[{n}] {hit.citation}  (score {hit.score:.4f})\n    {hit.text[:300]}\n")
        except EmbedderMismatch as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        finally:
            await kb.close()
    return 0
