"""The embedded Postgres (with pgvector) used when DATABASE_URL is unset.

pgserver ships PostgreSQL 16 with pgvector inside its wheel and starts in about a second, so a fresh
machine needs nothing installed. Several processes pointed at one data folder share one server.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def start_embedded(data_dir: Path, *, cleanup: str | None = "stop") -> tuple[str, Any]:
    """Start (or attach to) the embedded server in `data_dir/postgres` and return (url, handle).

    Keep the handle alive for as long as the server is needed: pgserver stops the server when the last
    process holding it lets go.
    """
    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset (normal on servers and in CI); nothing to act on.
        warnings.simplefilter("ignore")
        import pgserver  # imported late: it is only needed when no DATABASE_URL is configured

    pgdata = data_dir / "postgres"
    pgdata.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(pgdata, cleanup_mode=cleanup)  # type: ignore[attr-defined]
    server.psql("SET client_min_messages = warning; CREATE EXTENSION IF NOT EXISTS vector;")
    uri: str = server.get_uri()
    log.info("embedded postgres ready in %s", pgdata)
    return uri, server
