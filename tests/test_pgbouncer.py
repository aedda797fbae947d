"""The bot behind PgBouncer in transaction mode (Debian's pgbouncer, in front of the test Postgres): every
transaction may land on another server connection, so nothing may rely on session state (advisory locks,
prepared statements, LISTEN). Migrations, turns, the outbox and the leases all go through it; wake-ups come by
polling, or through DATABASE_LISTEN_URL when it names a direct connection. `make test` installs pgbouncer."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from fakes.openai_server import FakeOpenAI, reply
from harness.bot import bot_settings, free_port, serving

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


@pytest.fixture
def pgbouncer(database_url: str) -> Iterator[str]:
    """A PgBouncer in transaction mode in front of the test database; its URL."""
    if not Path(PGBOUNCER).exists():
        pytest.fail("pgbouncer is missing: apt-get install -y pgbouncer (`make test` does)")
    url = make_url(database_url)
    host = url.query.get("host") or url.host or "127.0.0.1"
    port = free_port()
    # Not under pytest's tmp_path: pgbouncer runs as another user, who must reach its folder.
    folder = Path(tempfile.mkdtemp(prefix="helpdesk-pgbouncer-"))
    folder.chmod(0o755)
    (folder / "userlist.txt").write_text('"postgres" ""\n')
    (folder / "pgbouncer.ini").write_text(
        f"[databases]\nhelpdesk = host={host} port={url.port or 5432} dbname={url.database} user=postgres\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder}/userlist.txt\npool_mode = transaction\n"
        "max_client_conn = 500\ndefault_pool_size = 8\n"
        # As the README advises: unique statement names would otherwise pile up on the server connections.
        "server_reset_query = DISCARD ALL\nserver_reset_query_always = 1\n"
        f"logfile = {folder}/pgbouncer.log\npidfile = {folder}/pgbouncer.pid\n"
    )
    command = [PGBOUNCER, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root: run it as the embedded server's user
        user = "pgserver" if _user_exists("pgserver") else "nobody"
        shutil.chown(folder, user)
        for child in folder.iterdir():
            shutil.chown(child, user)
        command[1:1] = ["-u", user]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, process)
        yield f"postgresql://postgres@127.0.0.1:{port}/helpdesk"
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    for _ in range(100):
        if process.poll() is not None:
            output = process.stdout.read().decode() if process.stdout else ""
            raise RuntimeError(f"pgbouncer exited: {output}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError("pgbouncer did not listen")


@pytest.fixture
async def pooled_bot(
    pgbouncer: str, database_url: str, fake_llm: FakeOpenAI, emulator: Any, request: pytest.FixtureRequest
) -> AsyncIterator[Any]:
    listen = database_url if request.param == "listen" else None
    settings = bot_settings(
        pgbouncer, fake_llm, emulator, database_pooler="transaction", database_listen_url=listen, db_pool_size=4
    )
    async with serving(settings, emulator) as bot:
        yield bot


@pytest.mark.parametrize("pooled_bot", ["poll", "listen"], indirect=True)
async def test_conversations_through_pgbouncer_in_transaction_mode(
    pooled_bot: Any, emulator: Any, fake_llm: FakeOpenAI
) -> None:
    fake_llm.rule = lambda request: reply(f"re: {request.last_user}")
    said = await asyncio.gather(*(emulator.user_says("C_SUPPORT", f"question {n}") for n in range(12)))
    for n, message in enumerate(said):
        posts = await emulator.wait_for(lambda ts=message.ts: emulator.posts("C_SUPPORT", ts), timeout=20)
        assert [p.text for p in posts] == [f"re: question {n}"]
    # A follow-up in a thread: the same conversation, run again under a new lease through the pooler.
    await emulator.user_says("C_SUPPORT", "and another", thread_ts=said[0].ts)
    await emulator.wait_for(lambda: len(emulator.posts("C_SUPPORT", said[0].ts)) == 2, timeout=20)
    assert pooled_bot.workers.wakeups.listening == (pooled_bot.settings.database_listen_url is not None)
