"""`python -m bot` as a user runs it: a real subprocess, the real database, the fake LLM over HTTP."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from agents.db import models as m
from fakes.openai_server import EMBEDDING_DIM, FakeOpenAI, reply, tool_call, tools
from harness import documents
from harness.bot import clean_environ, run_bot

CLEAN = clean_environ()


async def test_chat_without_provider_answers_from_the_knowledge_base(
    database_url: str, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    stdin = "how long is the warranty on a new drone?\nthis is useless, let me talk to a real person\n"
    # The first start embeds the sample knowledge base with the local model: give it time on a busy machine.
    env = {"DATABASE_URL": database_url}
    code, out, err = await run_bot("chat", env=env, cwd=tmp_path, stdin=stdin, wait_s=300)
    assert code == 0, err
    assert "Offline mode" in err and "OPENAI_API_KEY" in err and "OPENAI_BASE_URL" in err
    assert "handoff triage -> support" in out  # routed by similarity to the agents' descriptions
    assert "calls search_knowledge" in out
    assert "Here is what I found in our help articles" in out and "_Source: Warranty and Driftwing Care" in out
    assert "escalated to a human (agent): the customer asked for a person" in out


async def test_chat_shows_agents_handoffs_and_tools(
    database_url: str, fake_llm: FakeOpenAI, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    fake_llm.script(
        tools(
            tool_call("record_customer_name", {"name": "Casey"}), tool_call("transfer_to_support", {"reason": "order"})
        ),
        tools(tool_call("lookup_order", {"order_id": "DW-1007"})),
        reply("Your Swift Racer has shipped."),
        reply("You're welcome, Casey."),
    )
    env = {
        "DATABASE_URL": database_url,
        "OPENAI_BASE_URL": fake_llm.base_url,
        "OPENAI_MODEL": "fake-model",
        "EMBEDDINGS": "openai",
    }
    code, out, err = await run_bot(
        "chat", "--conversation", "demo", env=env, cwd=tmp_path, stdin="I'm Casey, where is DW-1007?\nthanks\n"
    )
    assert code == 0, err
    # The terminal writes as the sample shop's customer, so their orders can be looked up (and refunded).
    assert "You write as Casey Customer <casey@example.com>, whose orders are DW-1006, DW-1007." in out
    assert "calls record_customer_name" in out
    assert "handoff triage -> support (order)" in out
    assert "calls lookup_order" in out and "Order DW-1007 for Casey Customer" in out and "status shipped" in out
    assert "Support> Your Swift Racer has shipped." in out
    assert "Support> You're welcome, Casey." in out

    # A second run resumes the same conversation with the agent that spoke last.
    fake_llm.script(reply("Still here."))
    code, out, _ = await run_bot("chat", "--conversation", "demo", env=env, cwd=tmp_path, stdin="hello again\n")
    assert code == 0
    assert "Resuming: support is active" in out and '"customer_name": "Casey"' in out
    assert "Support> Still here." in out


async def test_migrate_command(database_url: str, tmp_path: Path) -> None:
    code, out, err = await run_bot("migrate", env={"DATABASE_URL": database_url}, cwd=tmp_path)
    assert code == 0, err
    assert "migrated to head (DATABASE_URL)" in out


async def test_serve_without_slack_says_what_to_set(database_url: str, tmp_path: Path) -> None:
    code, out, _ = await run_bot("serve", env={"DATABASE_URL": database_url}, cwd=tmp_path)
    assert code == 2
    assert "SLACK_BOT_TOKEN" in out and "SLACK_SIGNING_SECRET" in out and "manifest.yml" in out
    assert "python -m bot playground" in out


async def test_run_with_slack_partly_configured_names_what_is_missing(database_url: str, tmp_path: Path) -> None:
    env = {"DATABASE_URL": database_url, "SLACK_BOT_TOKEN": "xoxb-1"}
    code, out, _ = await run_bot("run", env=env, cwd=tmp_path)
    assert code == 2 and "SLACK_SIGNING_SECRET" in out  # not a playground that hides the mistake


async def test_run_without_slack_starts_the_playground(fake_llm: FakeOpenAI, tmp_path: Path) -> None:
    # DATABASE_URL is set and ignored: the playground keeps to its own embedded Postgres (in DATA_DIR).
    env = {
        "DATABASE_URL": "postgresql://nobody@127.0.0.1:9/production",
        "DATA_DIR": str(tmp_path / "data"),
        "PLAYGROUND_PORT": "0",
        "OPENAI_BASE_URL": fake_llm.base_url,
        "EMBEDDINGS": "openai",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", stdout=asyncio.subprocess.PIPE, env={**CLEAN, **env}, cwd=tmp_path
    )
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=120)).decode()
        match = re.match(r"Playground: open (http://127\.0\.0\.1:\d+) in a browser", line)
        assert match, line
        assert (await proc.stdout.readline()).decode().startswith(f"LLM provider: gpt-4o-mini at {fake_llm.base_url}")
        async with aiohttp.ClientSession() as http:
            async with http.get(match[1]) as page:
                assert page.status == 200 and "<title>" in await page.text()
            async with http.get(f"{match[1]}/api/workspace") as workspace:
                assert (await workspace.json())["offline"] is False
            # Only the page itself may use the API: not another site, not another Host name, not a form post.
            say = {"user": "U_CUSTOMER", "channel": "C_SUPPORT", "text": "hi"}
            for headers, status in (
                ({"Origin": "http://evil.example"}, 403),
                ({"Host": "evil.example"}, 403),
                ({"Content-Type": "text/plain"}, 415),
            ):
                kwargs: dict[str, Any] = {"data": json.dumps(say)} if "Content-Type" in headers else {"json": say}
                async with http.post(f"{match[1]}/api/say", headers=headers, **kwargs) as refused:
                    assert refused.status == status, headers
            async with http.post(f"{match[1]}/api/say", json=say, headers={"Origin": match[1]}) as said:
                assert said.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0


async def test_socket_mode_needs_an_app_token(database_url: str, tmp_path: Path) -> None:
    env = {"DATABASE_URL": database_url, "SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s"}
    code, out, _ = await run_bot("socket", env=env, cwd=tmp_path)
    assert code == 2 and "SLACK_APP_TOKEN" in out


async def test_kb_says_what_is_wrong_in_a_line_and_fails(database_url: str, tmp_path: Path) -> None:
    """A path that does not exist, a folder with nothing to read, a file of a type not read, or a collection nobody
    made: one line saying so and a non-zero exit, never a traceback or a silent success."""
    code, _, err = await run_bot("kb", "ingest", "no-such-docs", "--collection", "acme", env={}, cwd=tmp_path)
    assert code == 2 and err.strip() == "error: no such file or folder: no-such-docs"
    (tmp_path / "odt").mkdir()
    (tmp_path / "odt" / "notes.odt").write_bytes(b"PK")
    (tmp_path / "odt" / "README.md").write_text("# What this folder is\n")
    code, out, err = await run_bot("kb", "ingest", "odt", "--collection", "acme", env={}, cwd=tmp_path)
    reads = ".docx, .htm, .html, .markdown, .md, .pdf, .txt"
    assert code == 2 and out == "" and err.strip() == f"error: no documents to read in odt (kb ingest reads {reads})"
    code, _, err = await run_bot("kb", "ingest", "odt/notes.odt", "--collection", "acme", env={}, cwd=tmp_path)
    assert code == 2 and err.strip() == f"error: odt/notes.odt: not a type of document that is read (only {reads})"
    env = {"DATABASE_URL": database_url, "EMBEDDINGS": "none"}
    code, out, err = await run_bot("kb", "search", "returns", "--collection", "acmee", env=env, cwd=tmp_path)
    assert code == 2 and out == "" and "error: no collection acmee; there are:" in err and "Traceback" not in err


def kb_env(database_url: str, fake: FakeOpenAI) -> dict[str, str]:
    return {"DATABASE_URL": database_url, "OPENAI_BASE_URL": fake.base_url, "EMBEDDINGS": "openai"}


async def test_kb_ingest_reads_pdf_and_docx_manuals_which_search_cites_by_page_and_heading(
    database_url: str, fake_llm: FakeOpenAI, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    """The company's manuals are read by the readers of customers' attachments: a PDF by page (titled by its file's
    name), a DOCX by its Title and Heading styles."""
    manuals = tmp_path / "manuals"
    manuals.mkdir()
    (manuals / "kestrel-manual.pdf").write_bytes(
        documents.pdf("Unfold the arms before the first flight.", "Tighten each propeller nut to 0.6 Nm of torque.")
    )
    (manuals / "osprey-care.docx").write_bytes(
        documents.docx(
            ("Title", "Osprey Care Guide"),
            ("Heading1", "Batteries"),
            (None, "Store Osprey batteries at half charge."),
            (None, "Never leave them in a hot car."),
        )
    )
    env = kb_env(database_url, fake_llm)
    code, out, err = await run_bot("kb", "ingest", "manuals", "--collection", "manuals", env=env, cwd=tmp_path)
    assert code == 0, err
    assert out.startswith("manuals: 2 added, 0 replaced, 0 unchanged, 0 pruned; 3 chunks embedded with openai:")
    search = ("kb", "search", "--collection", "manuals", "--k", "1")
    code, out, err = await run_bot(*search, "propeller nut torque", env=env, cwd=tmp_path)
    assert code == 0, err
    assert out.startswith("[1] Kestrel Manual › page 2 (kestrel-manual.pdf)") and "0.6 Nm" in out
    code, out, err = await run_bot(*search, "store batteries at half charge", env=env, cwd=tmp_path)
    assert out.startswith("[1] Osprey Care Guide › Batteries (osprey-care.docx)"), err
    assert "half charge.\n\n    Never leave them" not in out and "Never leave them in a hot car" in out


async def test_kb_ingest_of_an_unreadable_file_names_it_and_changes_nothing(
    database_url: str, fake_llm: FakeOpenAI, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    """A file that cannot be read fails the whole ingestion, in a line naming it: the documents read before it are
    not stored, a collection it was to make is not made, and one that existed keeps what it held."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "returns.md").write_text("# Returns\n\nReturns are accepted within 30 days.\n")
    env = kb_env(database_url, fake_llm)
    code, _, err = await run_bot("kb", "ingest", "docs", "--collection", "help", env=env, cwd=tmp_path)
    assert code == 0, err
    (docs / "returns.md").write_text("# Returns\n\nReturns are accepted within 60 days.\n")
    (docs / "scan.pdf").write_bytes(b"%PDF-1.4\nnot really a PDF\n")
    for collection in ("help", "fresh"):
        code, out, err = await run_bot("kb", "ingest", "docs", "--collection", collection, env=env, cwd=tmp_path)
        assert code == 1 and out == ""
        assert err.strip() == f"error: docs/scan.pdf: not a readable PDF; nothing was changed in {collection}"
    async with sessions() as s:
        assert list(await s.scalars(select(m.KnowledgeCollection.name))) == ["help"]
        held = (await s.execute(select(m.KnowledgeChunk.text, m.KnowledgeChunk.dim))).all()
    assert [(text, dim) for text, dim in held] == [("Returns are accepted within 30 days.", EMBEDDING_DIM)]


@pytest.mark.services
async def test_version(tmp_path: Path) -> None:
    code, out, _ = await run_bot("--version", env={}, cwd=tmp_path)
    assert code == 0 and re.fullmatch(r"helpdesk-bot \S+\n", out)


async def test_a_first_start_with_an_unreadable_knowledge_file_refuses_in_a_line_and_stores_nothing(
    database_url: str, fake_llm: FakeOpenAI, sessions: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    code, _, err = await run_bot("init", "desk", env={}, cwd=tmp_path)
    assert code == 0, err
    (tmp_path / "desk" / "knowledge" / "help" / "scan.pdf").write_bytes(b"%PDF-1.4\nnot really a PDF\n")
    env = kb_env(database_url, fake_llm) | {"HELPDESK_FILE": str(tmp_path / "desk" / "helpdesk.yaml")}
    code, _, err = await run_bot("eval", "desk/cases.yaml", env=env, cwd=tmp_path, wait_s=120)
    assert code == 2, err
    [line] = [line for line in err.splitlines() if line.startswith("Not started:")] or [err]
    assert "knowledge collection help could not be added" in line and "scan.pdf: not a readable PDF" in line
    assert "Traceback" not in err
    async with sessions() as s:
        assert list(await s.scalars(select(m.KnowledgeCollection.name))) == []
